// Engine::State: the engine's pieces, side by side, and the few things that need all of them
// (set-up, the memory plan, checkpoints). Internal to runtime/engine; the public contract is
// engine.hpp. Which file holds what:
//   engine.cpp           construction and Engine::step, the data flow of one training step
//   setup.cpp            option checks, allocation, initial values
//   schedule.cpp         the passes of a step and the runner (ScheduleRunner)
//   param_residency.cpp  working parameters: whole / sharded, gathers, prefetch, release
//   grad_reduction.cpp   gradients: accumulation, all-reduce / reduce-scatter, landing shards
//   host_offload.cpp     offload_optimizer's host buffers and threads
//   optimizer_step.cpp   norm, overflow, clipping, AdamW, the speculative host step
//   memory_plan.cpp      what the model state takes (the ZeRO formula), check_fits, reports
//   engine_checkpoint.cpp  save/load, set_parameters, parameter(): state in and out
//   evaluate.cpp         forward-only evaluation
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "offload/aio_engine.hpp"
#include "offload/swap_store.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/context.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/grad_reduction.hpp"
#include "runtime/engine/host_offload.hpp"
#include "runtime/engine/optimizer_step.hpp"
#include "runtime/engine/param_residency.hpp"
#include "runtime/engine/schedule.hpp"

namespace zero {

// This rank's pieces in the checkpoint's terms, with where each lives: group g, offset within
// the group's owned range. Stage 0 saves from rank 0 only (every rank holds everything); every
// rank loads everything. In a pipeline the pieces' param is the whole model's index
// (place.to_original; `where` keeps the view's), and a tied parameter is saved by its owning
// stage only.
struct EnginePieces {
  std::vector<checkpoint::Piece> pieces;
  std::vector<std::pair<int, Partition::Piece>> where;
  int64_t total = 0;
};

namespace engine {
// A pipeline boundary activation's type and shape (pipeline_step.cpp).
struct PipeBoundary {
  ScalarType type = ScalarType::f32;
  Shape shape;
  friend bool operator==(const PipeBoundary&, const PipeBoundary&) = default;
};
// The header sent before a boundary activation (pipe_header.cpp): kPipeHeader int32 words, the
// scalar type, the rank, then the dimensions, so the receiver needs no knowledge of the
// sender's Units.
constexpr int kPipeHeader = 8;
std::array<int32_t, kPipeHeader> encode_header(const PipeBoundary& b);
// Throws naming `where` and the sending pipeline rank `from` when the words are no header.
PipeBoundary decode_header(const int32_t* words, const std::string& where, int from);
// The most likely token (ties to the lower id) at every row of `out`, the last Unit's logits
// [.., V] (eval_argmax.cpp). With tensor slices `out` is this rank's vocabulary slice, and the
// result is the whole vocabulary's, the same on every rank of the group (collective over the
// tensor communicator then). `what` prefixes errors.
std::vector<int32_t> argmax_rows(Context& x, const Unit& last, const Tensor& out, const std::string& what);
}  // namespace engine

struct Engine::State {
  State(Model& m, Device& d, Stream& c, coll::Communicator& k, EngineOptions opt, PipelinePlace pl,
        TensorPlace tp)
      : x(m, d, c, k, std::move(opt), std::move(pl), tp), params(x), grads(x) {}
  ~State() { quiesce(); }

  engine::Context x;
  // offload_param on NVMe: the file engine and the swap store of the parameter shards (before
  // `host` and `params`, whose swaps use them: destroyed after both). The store locks its rank
  // directory, so the optimizer state on the same nvme_path shares this store (setup.cpp).
  std::unique_ptr<offload::AioEngine> nvme_io;
  std::unique_ptr<offload::SwapStore> nvme_store;
  // Declared before `params`: the offloaded parameter shards are its host memory.
  std::unique_ptr<engine::HostOffload> host;  // offload_optimizer only
  engine::ParamResidency params;
  engine::GradReduction grads;
  std::unique_ptr<engine::OptimizerStep> opt;
  // cpu_checkpointing only; before the runner, which borrows it.
  std::unique_ptr<engine::ActivationOffload> act_off;
  std::unique_ptr<engine::ScheduleRunner> runner;
  std::vector<engine::UnitPass> schedule;  // the passes of every step
  bool spec = false;  // the speculative host step is on (its second bank was allocated)
  // pipeline_step.cpp: each micro-batch's boundary activation as this stage first sent it to the
  // next stage and first received it from the previous one. Later steps post the activation's
  // receive with it where recv_activation sits (no header round trip), and both sides check that
  // it has not changed.
  std::map<int, engine::PipeBoundary> pipe_sent, pipe_received;

  // setup.cpp: after the option checks, the pieces' state, allocated and initialised.
  void set_up();

  // memory_plan.cpp: what the model state takes, from the partition and the options alone
  // (set_up allocates exactly this): on the device, and with offload on the host
  // (`second_bank`: with the speculative step's second copy of master, m and v).
  Engine::ModelStateBytes device_state() const;
  Engine::ModelStateBytes host_state(bool second_bank) const;
  Engine::ModelStateBytes nvme_state() const;
  // Throws the ledger's OutOfMemory when the model state cannot fit the device's capacities,
  // before anything of it is allocated.
  void check_fits() const;

  // engine_checkpoint.cpp
  EnginePieces checkpoint_pieces(bool saving) const;
  // Writes new state for this rank's pieces (master; m and v, or zeros when null), the working
  // copies from the master, and gathers the whole groups.
  void install(const EnginePieces& ep, const float* master_vals, const float* m_vals, const float* v_vals);
  // Nothing in flight may write what is read: the step-end all-gathers (in place over the owned
  // range), the host threads, the compute stream.
  void settle();

  // Waits for everything in flight (collectives, compute, host threads) before buffers they use
  // can go, e.g. when an exception (an out-of-memory mid-step) unwinds the step or the Engine is
  // destroyed. Errors met while waiting are dropped: the exception already on its way is the one
  // to report.
  void quiesce() noexcept {
    params.quiesce();
    grads.quiesce();
    try { x.compute.synchronize(); } catch (...) {}
    try { x.comm.stream().synchronize(); } catch (...) {}  // the timers' clock reads
    if (host) host->quiesce();
    if (act_off) act_off->quiesce();
  }
};

}  // namespace zero
