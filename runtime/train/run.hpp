// One training run of zero-train: everything that lives from start-up to the end of the run
// (the watchdog, the data, the metrics file, the device and its communicators, the model, its
// pipeline stage and the engine), built in that order by set_up_run, which also prints the
// start-up report.
//
// Ownership and lifetime: a Run owns all of it. The members are declared in the order they are
// built, so they are destroyed in the reverse order: the engine before the model it drives, the
// allocation-stream guard before the stream, the communicators before the device. The world,
// flags and config must outlive the Run. A Run is not moved (the Data's held-out set and the
// Engine hold addresses of members). One thread.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <tbb/global_control.h>

#include "collectives/communicator.hpp"
#include "collectives/counting.hpp"
#include "collectives/grid.hpp"
#include "core/device.hpp"
#include "core/stream.hpp"
#include "core/unit.hpp"
#include "core/watchdog.hpp"
#include "core/world.hpp"
#include "models/gpt.hpp"
#include "models/ops.hpp"
#include "runtime/config/config.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/train/flags.hpp"
#include "runtime/train/metrics_file.hpp"
#include "runtime/train/grid_run.hpp"
#include "runtime/train/training_data.hpp"

namespace zero::train {

struct Run {
  Run(World& world, const Flags& flags, const config::Config& c)
      : world(world), flags(flags), c(c), shape(c.ours.model) {}
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  World& world;
  const Flags& flags;
  const config::Config& c;
  const models::GptShape shape;  // the config's model (with --model applied)

  // From set_up_run on, a rank that stops answering (stopped, hung, its host lost) ends the job
  // with a report within the timeout instead of leaving the others waiting forever.
  std::optional<Watchdog> watchdog;
  Data data;
  std::optional<MetricsFile> metrics;  // rank 0's; empty on the other ranks
  // oneTBB's threads in this process (the cpu kernels' parallel loops and host AdamW together)
  // held to the host thread budget (offload/thread_budget.hpp: the node's cores shared among
  // its ranks), so ranks on one node do not oversubscribe its cores. Outlives everything below.
  std::optional<tbb::global_control> tbb_threads;
  std::unique_ptr<Device> device;
  // The engine's collectives on the device's buffers (NCCL on cuda); checkpoints and the like
  // on host buffers (MPI): on cpu one communicator is both and mpi_comm is empty.
  std::unique_ptr<coll::Communicator> comm, mpi_comm;
  std::unique_ptr<Stream> stream;  // "compute": the model's kernels and the batches' copies
  // Device memory is ordered on the compute stream while the run lives; undone before the stream
  // goes (destroyed after everything declared below it).
  struct AllocationStreamGuard {
    Device* device = nullptr;
    ~AllocationStreamGuard() {
      if (device) device->set_allocation_stream(nullptr);
    }
  } allocation_stream_guard;
  std::unique_ptr<models::Ops> ops;
  EngineOptions options;
  // With pipeline stages or tensor slices (zero_train.parallel.pipeline or .tensor > 1): the
  // process grid, split from `comm`; null otherwise. Before the model: a tensor-parallel model's
  // Units hold its tensor communicator.
  std::unique_ptr<coll::ProcessGrid> grid;
  // With tensor slices: the grid's tensor communicator, counted (the per-step traffic report);
  // the model and the engine use this one.
  std::unique_ptr<coll::CountingCommunicator> tensor_counter;
  std::optional<Model> model;
  // With a grid: this rank's coordinate, its stage and its schedule (grid_run.hpp); null
  // otherwise. Between the model (its stage view borrows the model's Units) and the engine
  // (which borrows the view, the place and the grid's communicators).
  std::unique_ptr<GridRun> pipe;
  std::unique_ptr<Engine> engine;

  // The run's sizes: W ranks, of which D data-parallel (W without pipeline stages; the batch
  // rule's size), B sequences per micro-batch, GA micro-batches per step, T tokens per sequence;
  // the step the run trains up to.
  int W = 0, D = 0, B = 0, GA = 0, T = 0;
  long long steps = 0;

  coll::Communicator& host_comm() { return mpi_comm ? *mpi_comm : *comm; }
  // Appends a line to the metrics file on rank 0; collective: a failed write stops the run on
  // every rank (false; the error printed).
  bool write_metrics(const std::string& text);
};

// Builds the run in the order above, on every rank (collective): the watchdog; the data,
// checked; the metrics file, opened (so that an unwritable path is a usage error before anything
// is built or trained); the device ("auto": cuda when every rank has a GPU of its own), the
// communicators, the model and the engine; and prints the start-up report on rank 0 (the run,
// the host thread budget, the memory budget, the model state per rank and the ledger).
// With pipeline stages, the grid, the stage cut and the schedule are built before the engine,
// which is then this rank's stage's (grid_run.hpp), and the report shows them.
// Returns 0, or the exit code with the reason printed: kExitUsage for bad input, kExitFailure
// when the device cannot be opened, the pipeline cannot be set up or the model does not fit.
int set_up_run(Run& run);

}  // namespace zero::train
