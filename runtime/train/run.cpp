#include "runtime/train/run.hpp"

#include <mpi.h>

#include <cstdio>
#include <filesystem>
#include <system_error>
#include <vector>

#include "core/error.hpp"
#include "core/ledger.hpp"
#include "core/log.hpp"
#include "core/mpi_check.hpp"
#include "models/gpt_tensor_parallel.hpp"
#include "offload/memory_budget.hpp"
#include "offload/thread_budget.hpp"
#include "runtime/engine/from_config.hpp"
#include "runtime/train/exit_codes.hpp"
#include "runtime/train/rank_errors.hpp"

namespace zero::train {
namespace {

// The data, checked on every rank before anything is allocated, then the metrics file (rank 0
// writes it; every rank learns the outcome). 0 or kExitUsage.
int open_data_and_metrics(Run& run) {
  World& world = run.world;
  const Flags& flags = run.flags;
  if (!on_all_ranks(world, data_source(flags), [&] { open_data(run.data, flags, run.c); }))
    return kExitUsage;
  if ((flags.eval_interval > 0 || flags.eval_only) && !run.data.has_eval()) {
    if (world.is_root())
      std::fprintf(stderr, "zero-train: error: %s with --data needs --eval-data PATTERN (held-out "
                           "token shards)\n", flags.eval_only ? "--eval-only" : "--eval-interval");
    return kExitUsage;
  }

  std::string metrics_path = flags.metrics;
  if (metrics_path.empty())
    metrics_path = flags.checkpoint_dir.empty() ? "zero-train-metrics.jsonl" : flags.checkpoint_dir + "/metrics.jsonl";
  if (!on_all_ranks(world, "--metrics", [&] {
        if (!world.is_root()) return;
        if (!flags.checkpoint_dir.empty()) {
          std::error_code ec;
          std::filesystem::create_directories(flags.checkpoint_dir, ec);
        }
        run.metrics = MetricsFile::open(metrics_path);
      }))
    return kExitUsage;
  return 0;
}

// The first lines of the start-up report: the run, and what decides its speed and its bits.
void report_run(const Run& run, DeviceKind kind, const offload::ThreadBudget& budget) {
  const config::Config& c = run.c;
  const EngineOptions& o = run.options;
  const models::GptShape& shape = run.shape;
  char line[1024];
  std::snprintf(line, sizeof line,
                "zero-train: %s, GPT%s (%d layers, hidden %d, %d heads, vocabulary %d), %lld "
                "parameters\nzero-train: %d rank(s) on %s, ZeRO stage %d%s%s, %s, batch %lld = "
                "%d per rank x %d accumulation x %d %s, %lld steps, seed %lld\ndata: %s, %d "
                "tokens per sequence",
                run.flags.config.c_str(), c.ours.model_preset.empty() ? "" : (" " + c.ours.model_preset).c_str(),
                shape.n_layer, shape.n_embd, shape.n_head, shape.vocab_size,
                static_cast<long long>(models::gpt_parameter_count(shape)), run.W, run.device->name().c_str(), o.stage,
                !o.offload_optimizer ? "" : o.nvme.enabled() ? ", optimizer state on NVMe" : ", optimizer offloaded to host memory",
                !o.offload_param ? "" : o.param_nvme_path.empty() ? ", parameters offloaded" : ", parameters offloaded to NVMe",
                std::string(to_string(o.param_type)).c_str(), c.batch.train_batch_size, run.B, run.GA, run.D,
                run.D == run.W ? "ranks" : "data-parallel rank(s)", run.steps, c.seed, run.data.describe().c_str(), run.T);
  log::info(line);
  log::info(budget.explanation);
  if (!budget.advice.empty()) log::warn(budget.advice);
  // What decides whether another machine reproduces this run's losses bit for bit.
  if (kind == DeviceKind::cpu)
    log::info("cpu kernels: " + models::cpu_blas_description() +
              " (runs match bit for bit only on the same kernels; OPENBLAS_CORETYPE and, for "
              "bf16, ONEDNN_MAX_CPU_ISA pick them: docs/training.md)");
}

// Every rank's model state and memory in use (shards differ by rank when the model does not
// divide evenly, and stage 0 saves from rank 0 alone): one row per rank (collective).
void report_memory_per_rank(Run& run) {
  World& world = run.world;
  const int W = run.W;
  const LedgerSnapshot snap = run.device->ledger().snapshot();
  const double mine[6] = {static_cast<double>(snap.total[0].current), static_cast<double>(snap.total[0].peak),
                          static_cast<double>(snap.total[1].current), static_cast<double>(snap.total[1].peak),
                          static_cast<double>(snap.total[2].current), static_cast<double>(snap.total[2].peak)};
  std::vector<double> all(static_cast<size_t>(6 * W));
  ZERO_CHECK_MPI(MPI_Gather(mine, 6, MPI_DOUBLE, all.data(), 6, MPI_DOUBLE, 0, world.comm()));
  if (world.is_root() && W > 1) {
    // The nvme column only when some rank keeps state on a drive.
    bool nvme = false;
    for (int r = 0; r < W; ++r) nvme = nvme || all[6 * r + 5] > 0;
    const auto b = [&](int r, int k) { return format_bytes(static_cast<size_t>(all[6 * r + k])); };
    char line[1024];
    std::string t = std::string("memory per rank (ledger totals)\n  rank   device now  device peak     host now    host peak") +
                    (nvme ? "     nvme now\n" : "\n");
    for (int r = 0; r < W; ++r) {
      std::snprintf(line, sizeof line, "  %4d %12s %12s %12s %12s", r, b(r, 0).c_str(), b(r, 1).c_str(),
                    b(r, 2).c_str(), b(r, 3).c_str());
      t += line;
      if (nvme) {
        std::snprintf(line, sizeof line, " %12s", b(r, 4).c_str());
        t += line;
      }
      t += "\n";
    }
    t.pop_back();
    log::info(t);
  }
}

// Sequence parallelism splits each sequence's tokens over the tensor group: the data's sequence
// length must divide.
void check_sequence_run(const Run& run) {
  const int T = run.c.ours.parallel.tensor, S = run.data.seq_len;
  if (S % T != 0)
    ZERO_FAIL("the data's sequences have " + std::to_string(S) +
              " tokens, which the tensor degree " + std::to_string(T) + " (zero_train.parallel.tensor) does not "
              "divide: each rank takes an equal share of every sequence\nHINT: turn sequence_parallel off, or "
              "use data whose sequence length is a multiple of " + std::to_string(T));
}

}  // namespace

bool Run::write_metrics(const std::string& text) {
  return on_all_ranks(world, "--metrics", [&] {
    if (metrics) metrics->append(text);
  });
}

int set_up_run(Run& run) {
  World& world = run.world;
  const config::Config& c = run.c;
  run.watchdog.emplace(world, WatchdogOptions{.timeout_s = c.ours.watchdog_timeout, .exit_code = kExitLost});
  if (const int rc = open_data_and_metrics(run); rc != 0) return rc;

  // This rank's share of the memory it really has (physical RAM, the container's or the batch
  // job's cgroup limit): the default limits, so that a model too large for it is the ledger's
  // clear error at start-up, not the kernel's OOM killer in the middle of a run (collective).
  const offload::MemoryBudget memory = offload::memory_budget(world.comm());
  // One GPU per rank: a rank takes the GPU of its index among its host's ranks (NCCL refuses two
  // ranks on one GPU). "auto": cuda when every rank has a GPU of its own, else cpu (agreed by
  // all ranks: the backends' collectives do not mix).
  const int gpus = cuda_device_count();
  const bool gpu_each = gpus > 0 && world.local_size() <= gpus;
  const bool all_gpu = !world.any(!gpu_each);
  const DeviceKind kind = c.ours.device.value_or(all_gpu ? DeviceKind::cuda : DeviceKind::cpu);
  if (!c.ours.device && !all_gpu && gpus > 0 && world.is_root())
    log::info("zero-train: zero_train.device \"auto\": " + std::to_string(world.local_size()) +
              " ranks on this host and " + std::to_string(gpus) + " GPU(s), so the run is on the cpu "
              "backend (one GPU per rank is needed for cuda)");
  // The config's limits win; the budget fills in the rest (on cpu device and host memory are the
  // same RAM and share it: offload/memory_budget.hpp).
  std::vector<std::string> memory_warnings;
  const DeviceOptions dopt = offload::device_options(kind, static_cast<size_t>(c.ours.device_memory_limit),
                                                     static_cast<size_t>(c.ours.host_memory_limit), memory,
                                                     &memory_warnings);
  if (!on_all_ranks(world, std::string("zero_train.device \"") + std::string(to_string(kind)) + "\"", [&] {
        int index = 0;
        if (kind == DeviceKind::cuda) {
          if (gpus == 0)
            ZERO_FAIL("no GPU is visible on this host (or the cuda backend is not built)\nHINT: check "
                      "nvidia-smi and CUDA_VISIBLE_DEVICES, or set zero_train.device (--device) to \"cpu\"");
          if (world.local_size() > gpus)
            ZERO_FAIL(std::to_string(world.local_size()) + " ranks on this host but " + std::to_string(gpus) +
                      " GPU(s): one GPU per rank\nHINT: launch at most " + std::to_string(gpus) +
                      " ranks per host (mpirun --map-by ppr:" + std::to_string(gpus) + ":node)");
          index = world.local_rank();
        }
        run.device = make_device(kind, index, dopt);
        run.comm = coll::make_communicator(world.comm(), *run.device);
        if (kind != DeviceKind::cpu) run.mpi_comm = coll::make_mpi_communicator(world.comm(), *run.device);
      }))
    return kExitFailure;
  Device& device = *run.device;
  run.stream = device.create_stream("compute");
  // Device memory from here on is ordered on the compute stream (cuda: cudaMallocAsync): freeing
  // an activation neither waits nor synchronises the GPU.
  device.set_allocation_stream(run.stream.get());
  run.allocation_stream_guard.device = &device;
  run.ops = models::make_ops(device, *run.stream);
  EngineOptions& o = run.options;
  o = engine_options(c, kind);
  // The host AdamW's threads: the node's cores shared among its ranks (collective).
  const offload::ThreadBudget budget = offload::host_thread_budget(world.comm());
  o.host_threads = budget.threads;
  // The cpu kernels' oneTBB loops too: without this each rank's loops used every core of the
  // node, and 2 ranks on 2 cores ran 4 busy threads. Results do not depend on it (the kernels'
  // blocks depend only on shapes: models/cpu/kernels.hpp).
  run.tbb_threads.emplace(tbb::global_control::max_allowed_parallelism, static_cast<size_t>(budget.threads));
  // Activations in the parameters' type on both backends: 16-bit storage, fp32 math in every
  // element-wise kernel, and 16-bit matrix products with fp32 accumulation (cpu: oneDNN,
  // models/cpu/kernels16.hpp; cuda: cuBLAS). docs/cpu-kernels.md, "16-bit activations".
  const ScalarType act = o.param_type;
  const config::Parallel& par = c.ours.parallel;
  // The grid first when there is more than one axis: a tensor slice of the model is built over
  // the grid's tensor communicator.
  if ((par.pipeline > 1 || par.tensor > 1) &&
      !on_all_ranks(world, "splitting the world into the process grid", [&] { build_grid(run); }))
    return kExitFailure;
  if (par.tensor > 1) {
    run.tensor_counter = std::make_unique<coll::CountingCommunicator>(run.grid->tensor());
    models::GptOptions go{run.shape, o.param_type, act};
    go.sequence_parallel = par.sequence_parallel;
    if (go.sequence_parallel && !on_all_ranks(world, "zero_train.parallel.sequence_parallel", [&] {
          check_sequence_run(run);
        }))
      return kExitFailure;
    // Sequence parallelism keeps every checkpointed input as this rank's token shard already:
    // partition_activations would split a tensor that differs per rank.
    if (go.sequence_parallel && o.partition_activations) {
      o.partition_activations = false;
      if (world.is_root())
        log::info("zero-train: activation_checkpointing.partition_activations has nothing to add with "
                  "zero_train.parallel.sequence_parallel: the checkpointed inputs are token shards already");
    }
    run.model.emplace(models::make_gpt_tensor_parallel(go, *run.ops, *run.tensor_counter));
  }
  else
    run.model.emplace(models::make_gpt({run.shape, o.param_type, act}, *run.ops));
  run.W = world.size();
  // The batch rule's data-parallel size: world / (pipeline x tensor), resolved by the config.
  run.D = c.ours.parallel.data;
  run.B = static_cast<int>(c.batch.train_micro_batch_size_per_gpu);
  run.GA = o.gradient_accumulation_steps;
  run.T = run.data.seq_len;
  run.steps = c.ours.steps;

  report_run(run, kind, budget);
  // The budget before the engine allocates the model state, so that a model that does not fit
  // is reported after it.
  log::info(memory.explanation + (kind == DeviceKind::cpu && dopt.shared_memory_limit > 0
                                      ? " (device and host memory share it on the cpu backend)"
                                      : ""));
  for (const std::string& w : memory_warnings) log::warn(w);
  // Pipeline stages: the grid, the cut and the schedule first; the engine is then the stage's.
  if (run.grid && !on_all_ranks(world, par.pipeline > 1 ? "setting up " + std::to_string(par.pipeline) + " pipeline stages"
                                                        : std::string("setting up the grid"),
                                 [&] { build_grid_run(run); }))
    return kExitFailure;
  // With NVMe offload the engine also opens the swap files, whose errors (a missing, read-only or
  // full nvme_path) are not a model that does not fit.
  const std::string engine_what = o.nvme.enabled() || !o.param_nvme_path.empty()
                                      ? "setting up the engine and its NVMe swap files"
                                      : "the model does not fit";
  if (!on_all_ranks(world, engine_what, [&] {
        const TensorPlace tensor{run.tensor_counter.get()};
        if (run.pipe && run.pipe->stage)
          run.engine = std::make_unique<Engine>(run.pipe->stage->view.model, device, *run.stream,
                                                run.grid->data(), o, run.pipe->stage->place, tensor);
        else if (run.grid)
          run.engine = std::make_unique<Engine>(*run.model, device, *run.stream, run.grid->data(), o,
                                                PipelinePlace{}, tensor);
        else
          run.engine = std::make_unique<Engine>(*run.model, device, *run.stream, *run.comm, o);
      }))
    return kExitFailure;

  if (run.pipe)
    report_grid(run);  // the grid, each stage's Units, each rank's parameters, the memory reports
  else
    log::info(run.engine->memory_report());
  report_memory_per_rank(run);
  return 0;
}

}  // namespace zero::train
