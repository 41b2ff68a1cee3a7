// The Engine: one training step as the data flow of DESIGN.md's "One training step", driving the
// pieces of engine_state.hpp. Construction checks the options and sets the pieces up.
#include "runtime/engine/engine.hpp"

#include <algorithm>

#include "core/phase.hpp"
#include "runtime/engine/engine_state.hpp"

namespace zero {
namespace {

// Every parameter's slice must be this tensor rank's: a model built for another rank or degree
// would train silently wrong (its collectives pair up with the wrong shards).
void check_tensor_place(const Model& model, const TensorPlace& tp, const Device& device) {
  const int rank = tp.comm ? tp.comm->rank() : 0, degree = tp.comm ? tp.comm->size() : 1;
  if (tp.comm)
    ZERO_REQUIRE(tp.comm->kind() == device.kind(),
                 "engine on " + device.name() + ": the tensor communicator is for " +
                     std::string(to_string(tp.comm->kind())) + " buffers; use one of the device's kind");
  for (const ParamSpec& p : model.params) {
    const ParamSlice& sl = p.slice;
    if (sl.split == TensorSplit::none) {
      ZERO_REQUIRE(degree == 1, "engine: parameter " + p.name + " says nothing of tensor slicing, but the "
                                "engine is tensor rank " + std::to_string(rank) + " of " + std::to_string(degree) +
                                ": build the model with models::make_gpt_tensor_parallel");
      continue;
    }
    ZERO_REQUIRE(sl.rank == rank && sl.degree == degree,
                 "engine: parameter " + p.name + " is tensor rank " + std::to_string(sl.rank) + " of " +
                     std::to_string(sl.degree) + "'s, but the engine is tensor rank " + std::to_string(rank) +
                     " of " + std::to_string(degree) + (tp.comm ? "" : " (no tensor communicator was given)") +
                     ": build the model for the engine's tensor communicator");
  }
}

}  // namespace

Engine::Engine(Model& model, Device& device, Stream& compute, coll::Communicator& comm,
               EngineOptions options, PipelinePlace place, TensorPlace tensor)
    : s_(std::make_unique<State>(model, device, compute, comm, std::move(options), std::move(place), tensor)) {
  State& s = *s_;
  engine::Context& x = s.x;
  check_engine_options(x.o);
  x.dtype = *to_dtype(x.o.param_type);
  ZERO_REQUIRE(comm.kind() == device.kind(),
               "engine on " + device.name() + ": the communicator is for " +
                   std::string(to_string(comm.kind())) + " buffers; the engine's collectives run "
                   "on the device's own buffers: use make_communicator(comm, device) (NCCL for "
                   "cuda, MPI for cpu)");
  ZERO_REQUIRE(compute.kind() == device.kind(),
               "engine on " + device.name() + ": the compute stream belongs to another backend");
  ZERO_REQUIRE(x.dtype != DType::bf16 || device.supports_bf16(),
               "engine on " + device.name() + ": bf16 needs compute capability 8.0 or newer; "
               "use fp16 (with loss scaling) or fp32 on this GPU");
  for (const ParamSpec& p : model.params)
    ZERO_REQUIRE(p.type == x.o.param_type,
                 "engine: parameter " + p.name + " is " + std::string(to_string(p.type)) +
                     " but the engine trains " + std::string(to_string(x.o.param_type)) +
                     " parameters: build the model with that parameter type");
  check_tensor_place(model, tensor, device);
  x.off = x.o.offload_optimizer;
  x.off_param = x.o.offload_param;
  s.spec = x.off && x.o.speculative_host_step;
  if (x.off) s.host = std::make_unique<engine::HostOffload>(x, x.o.pin);
  if (x.off_param && !x.o.param_nvme_path.empty()) {
    // One directory per process (zero-swap/rank<r>): r counts every rank of the grid, not just
    // the data-parallel one, since pipeline stages and tensor ranks of a node share the drive.
    const int T = x.tensor.active() ? x.tensor.comm->size() : 1;
    const int t = x.tensor.active() ? x.tensor.comm->rank() : 0;
    const int stage = x.place.active() ? x.place.stage : 0;
    s.nvme_io = std::make_unique<offload::AioEngine>(x.o.aio);
    s.nvme_store = std::make_unique<offload::SwapStore>(*s.nvme_io, x.o.param_nvme_path,
                                                        (stage * T + t) * x.world + x.rank);
  }
  std::vector<bool> checkpoint = checkpoint_plan(model, x.o.number_checkpoints);
  x.adam = std::make_unique<optim::HostAdam>(x.o.host_threads);
  x.kern = make_state_kernels(device, compute, *x.adam);
  s.opt = std::make_unique<engine::OptimizerStep>(x, s.params, s.grads, s.host.get());
  if (x.o.loss_scaler) s.opt->scaler = std::make_unique<optim::LossScaler>(*x.o.loss_scaler);
  if (s.host) {
    // A reduced shard lands on the host; once final, its AdamW may run ahead of the norm.
    s.grads.land = [&s](int g, const void* shard, bool last) {
      s.host->land(g, shard, last);
      s.opt->landed(g, last);
    };
  }
  // On a pipeline stage before the last, the last Unit's output goes to the next stage.
  if (x.o.cpu_checkpointing && std::find(checkpoint.begin(), checkpoint.end(), true) != checkpoint.end())
    s.act_off = std::make_unique<engine::ActivationOffload>(device, compute, x.o.pin);
  s.runner = std::make_unique<engine::ScheduleRunner>(x, s.params, s.grads, std::move(checkpoint),
                                                      !x.place.active() || x.place.next() < 0, s.act_off.get());
  s.set_up();
}

Engine::~Engine() = default;

const Partition& Engine::partition() const noexcept { return s_->x.part; }
int64_t Engine::steps_taken() const noexcept { return s_->opt->steps; }
const EngineOptions& Engine::options() const noexcept { return s_->x.o; }

StepStats Engine::step(const std::function<Batch(int micro)>& next) {
  State& s = *s_;
  engine::Context& x = s.x;
  const int M = x.o.gradient_accumulation_steps;
  ZERO_REQUIRE(!x.place.active(),
               "Engine::step: this Engine is pipeline stage " + std::to_string(x.place.stage) + " of " +
                   std::to_string(x.place.stages) + " (built with a PipelinePlace); its step is "
                   "Engine::pipeline_step with the stage's instruction list");
  try {
    x.timers.reset_step();
    s.opt->begin_step();
    s.grads.begin_step();
    // 1. The schedule's passes: every micro-batch forward, then backward (the parameters
    //    gathered before each Unit at stage 3), each group's gradient reduced as soon as its
    //    Unit's last backward is done. Before the last micro-batch the optimizer decides
    //    whether the host AdamW runs ahead of the norm (offload).
    const float seed = static_cast<float>(s.opt->loss_scale());
    const double loss = s.runner->run(
        s.schedule, next, [&](int micro) { if (micro + 1 == M) s.opt->plan_speculation(); }, seed);
    const double t0 = engine::now_seconds();
    phase::set("optimizer step (gradient norm, AdamW, parameter all-gather)");
    // 2. The boundary: the last reductions complete (stage 0/1: here), the global norm, the
    //    loss scale and clipping, AdamW on this rank's shard, the updated shards all-gathered.
    s.grads.finish();
    StepStats st = s.opt->apply(loss / M);
    // 3. Fresh gradients for the next step (on the compute stream: after AdamW read them), and
    //    at stage 3 the next step's first groups prefetched from the updated shards.
    s.grads.clear();
    if (s.host) s.host->clear();
    if (x.o.stage == 3) s.params.prefetch(0);
    if (x.o.timers) {
      st.time.forward = x.timers.forward;
      st.time.backward = x.timers.backward;
      st.time.optimizer = engine::now_seconds() - t0;
      st.time.comm_exposed = x.timers.exposed;
      st.time.d2h = x.timers.d2h;
      st.time.h2d = x.timers.h2d;
      st.time.host_adam = static_cast<double>(x.timers.adam_ns.load()) * 1e-9;  // apply synced it
      st.time.host_adam_waited = x.timers.adam_waited;
      const int64_t busy = x.timers.comm_busy_ns.load();
      st.time.comm_busy = static_cast<double>(busy - x.timers.comm_busy_reported_ns) * 1e-9;
      x.timers.comm_busy_reported_ns = busy;
    }
    return st;
  } catch (...) {
    s.quiesce();  // nothing in flight may outlive the buffers the unwinding frees
    throw;
  }
}

}  // namespace zero
