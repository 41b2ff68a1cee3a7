// The set-up the multi-rank cuda tests share (cuda_engine_test, cuda_pipeline_test,
// cuda_tensor_test): whether every rank has a GPU, one GPU per rank with an NCCL communicator
// over the whole World, device memory ordered on a stream, and the single-GPU reference run the
// parallel layouts are compared with. Test-only.
//
// Contract: every_rank_has_a_gpu() is collective (every rank gets the same answer, so all skip
// alike). cuda_env() is made on first use and kept for the process; every rank must first call
// it at the same point (it creates an NCCL communicator, a collective), and only when
// every_rank_has_a_gpu().
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "collectives/communicator.hpp"
#include "core/device.hpp"
#include "core/world.hpp"
#include "models/ops.hpp"
#include "runtime/engine/engine.hpp"

namespace zero::test {

inline bool every_rank_has_a_gpu() {
  World& w = World::get();
  return !w.any(cuda_device_count() < w.local_size());
}

// One GPU per rank (the node-local rank's) and an NCCL communicator over the world.
struct CudaEnv {
  std::unique_ptr<Device> device;
  std::unique_ptr<coll::Communicator> comm;
  CudaEnv() {
    device = make_device(DeviceKind::cuda, World::get().local_rank());
    comm = coll::make_nccl_communicator(World::get().comm(), *device);
  }
};
inline CudaEnv& cuda_env() {
  static CudaEnv e;
  return e;
}

// Device memory ordered on `stream` while it lives (what zero-train does on cuda).
struct AllocationStream {
  Device& d;
  AllocationStream(Device& dev, Stream& s) : d(dev) { d.set_allocation_stream(&s); }
  ~AllocationStream() { d.set_allocation_stream(nullptr); }
  AllocationStream(const AllocationStream&) = delete;
  AllocationStream& operator=(const AllocationStream&) = delete;
};

// What a training run leaves for the comparison.
struct TrainedRun {
  std::vector<std::vector<float>> params;  // Engine::parameter of each of the model's parameters
  std::vector<ParamSpec> specs;            // the model's parameter table, same order
  std::vector<double> losses;              // StepStats::loss per step
  std::vector<float> grad_norms;           // StepStats::grad_norm per step (before clipping)
  double eval_loss = 0;                    // Engine::evaluate of the held-out batch, if any
  std::vector<int32_t> argmax;             // and its most likely tokens
};

// Micro-batch m of step `step` on `dev`, copied in on `stream`.
using BatchFn = std::function<Batch(Device& dev, Stream& stream, int step, int m)>;
// The model on `ops` (the device and stream the run made).
using BuildFn = std::function<Model(models::Ops& ops)>;

// The reference of the multi-GPU layouts: the whole model, trained by Engine::step on this
// rank's GPU alone (a communicator of this rank only: no NCCL traffic), `steps` steps of
// options.gradient_accumulation_steps micro-batches, then `held_out` evaluated when given.
// Every rank runs it (each on its own GPU); it is collective only through cuda_env().
inline TrainedRun train_on_one_gpu(const BuildFn& build, const EngineOptions& options, int steps,
                                   const BatchFn& batch, const BatchFn& held_out = nullptr) {
  CudaEnv& e = cuda_env();
  auto alone = e.comm->split(e.comm->rank(), 0);
  auto stream = e.device->create_stream("compute");
  const AllocationStream ordered(*e.device, *stream);
  auto ops = models::make_ops(*e.device, *stream);
  Model model = build(*ops);
  Engine engine(model, *e.device, *stream, *alone, options);
  TrainedRun run;
  for (int step = 0; step < steps; ++step) {
    const StepStats st = engine.step([&](int m) { return batch(*e.device, *stream, step, m); });
    run.losses.push_back(st.loss);
    run.grad_norms.push_back(st.grad_norm);
  }
  if (held_out) run.eval_loss = engine.evaluate(held_out(*e.device, *stream, -1, 0), &run.argmax);
  for (size_t p = 0; p < model.params.size(); ++p) {
    run.params.push_back(engine.parameter(static_cast<int>(p)));
    run.specs.push_back(model.params[p]);
  }
  return run;
}

}  // namespace zero::test
