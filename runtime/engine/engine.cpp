#include "runtime/engine/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "optim/clip.hpp"
#include "optim/host_adam.hpp"

namespace zero {

struct Engine::State {
  State(Model& m, Device& d, Stream& c, coll::Communicator& k, EngineOptions opt)
      : model(m), dev(d), compute(c), comm(k), o(std::move(opt)), part(m, k.size()),
        rank(k.rank()), world(k.size()) {}

  Model& model;
  Device& dev;
  Stream& compute;
  coll::Communicator& comm;
  EngineOptions o;
  Partition part;
  int rank, world;
  DType dtype = DType::f32;  // of the working parameters and the gradients

  // Per group (see engine.hpp for which exist at which stage).
  std::vector<Tensor> work;       // stage 0-2: full padded buffer; stage 3: this rank's shard
  std::vector<Tensor> gathered;   // stage 3: the full buffer while a Unit needs it
  std::vector<coll::Work> gathering;  // stage 3: the all-gather filling gathered[g]
  std::vector<Tensor> grad_full;  // stage 0/1: full padded gradient
  std::vector<Tensor> grad_tmp;   // stage 2/3: full gradient during one backward, then freed
  // Stage 2/3: the reduced gradient shard. With accumulation an fp32 accumulator over the
  // micro-batches (DESIGN.md: 16-bit sums of many micro-batches lose the small ones); with one
  // micro-batch the 16-bit reduce-scatter result itself, as the ZeRO formula counts it (2 bytes).
  Tensor grad_acc;
  DType grad_acc_type = DType::f32;
  // The elements this rank updates, concatenated group by group: the whole padded model at
  // stage 0, the rank's shards otherwise. master is empty with fp32 parameters.
  std::vector<int64_t> owned_begin;  // per group: first owned element within the group
  std::vector<int64_t> owned_off;    // per group: offset within the concatenation
  int64_t owned_total = 0;
  Tensor master, m, v;

  std::vector<bool> checkpoint;
  std::unique_ptr<optim::HostAdam> adam;
  std::unique_ptr<optim::LossScaler> scaler;
  std::unique_ptr<Event> compute_done;  // hand-offs from the compute stream (see below)
  int64_t steps = 0;

  size_t esize() const { return size_of(dtype); }
  unsigned char* at(const Tensor& t, int64_t elems, size_t elem_size) const {
    return static_cast<unsigned char*>(t.data()) + static_cast<size_t>(elems) * elem_size;
  }
  int64_t owned_len(int g) const {
    return o.stage == 0 ? part.group(g).padded_numel : part.group(g).shard_numel;
  }
  // The pieces of parameters inside this rank's owned range of group g; shard_offset is
  // relative to the owned range's start.
  std::vector<Partition::Piece> owned_pieces(int g) const {
    if (o.stage != 0) return part.pieces(rank, g);
    std::vector<Partition::Piece> out;
    for (int p : part.group(g).params) {
      const Partition::Location& loc = part.location(p);
      out.push_back({p, 0, loc.offset, loc.numel});
    }
    return out;
  }

  // The compute stream's work so far, as an event a collective can start after. Every hand-off
  // from compute to communication goes through it: a reduction must not read a gradient the
  // compute stream is still adding to.
  Event* compute_point() {
    compute.record(*compute_done);
    return compute_done.get();
  }

  void init_state();
  std::vector<Tensor> views(int unit, bool grads);
  void gather(int unit);
  void use(int unit);
  void release_except(int keep_unit);
  void reduce_group_stage2(int g);
  void finish_oldest_reduce();

  // Stage 2/3 reductions in flight: the Work, and the full gradient buffer it reads, which must
  // live until the Work completes.
  struct PendingReduce {
    int group;
    coll::Work work;
    Tensor full;
  };
  std::vector<PendingReduce> pending;  // oldest first
  // At most this many reductions in flight: bounds the full gradient buffers alive at once.
  static constexpr size_t kMaxReducesInFlight = 2;

  // The transient full-size buffers of stage 2/3 (gradients of a group during backward, gathered
  // parameters) come from pools kept across steps: freshly mapped memory page-faults on every
  // touch (measured: stage 2 a fifth slower than stage 0 when each micro-batch allocated them).
  // A buffer is reused only for a group of exactly its size (the transformer blocks share one
  // size; sizing every buffer for the largest group, the embedding, cost GPT-2 small 296 MB per
  // rank at stage 2). At most 4 gradient and 3 parameter buffers are in use at once, so a size
  // class holds at most that many; the ledger counts them as communication buffers, apart from
  // the model state the ZeRO formula describes.
  struct Pool {
    std::vector<Tensor> free;
    Tensor take(Device& d, int64_t elems, ScalarType t) {
      for (size_t i = 0; i < free.size(); ++i)
        if (free[i].numel() == elems) {
          Tensor x = std::move(free[i]);
          free.erase(free.begin() + static_cast<std::ptrdiff_t>(i));
          return x;
        }
      return Tensor::empty(d, Shape{elems}, t, MemCategory::comm_buffers);
    }
    void give(Tensor& t) {
      if (t) free.push_back(std::move(t));
      t = Tensor();
    }
  };
  Pool grad_pool, param_pool;

  // Waits for everything in flight (collectives, compute) before buffers they use can go, e.g.
  // when an exception (an out-of-memory mid-step) unwinds the step or the Engine is destroyed.
  // Errors met while waiting are dropped: the exception already on its way is the one to report.
  void quiesce() noexcept {
    for (coll::Work& w : gathering) {
      try { w.wait(); } catch (...) {}
      w = coll::Work();
    }
    for (PendingReduce& r : pending) {
      try { r.work.wait(); } catch (...) {}
    }
    pending.clear();
    try { compute.synchronize(); } catch (...) {}
  }
  ~State() { quiesce(); }
  double micro_batch(const Batch& batch, float seed_scale);
  StepStats boundary(double loss);
};

namespace {

// Host element write of an fp32 value in the working dtype.
void store(void* dst, DType t, const float* src, int64_t n) {
  convert(src, DType::f32, dst, t, static_cast<size_t>(n));
}

}  // namespace

void Engine::State::init_state() {
  const int G = part.group_count();
  work.resize(static_cast<size_t>(G));
  gathered.resize(static_cast<size_t>(G));
  gathering.resize(static_cast<size_t>(G));
  grad_full.resize(static_cast<size_t>(G));
  grad_tmp.resize(static_cast<size_t>(G));
  const ScalarType st = scalar_type(dtype);
  for (int g = 0; g < G; ++g) {
    const Partition::Group& grp = part.group(g);
    owned_begin.push_back(o.stage == 0 ? 0 : static_cast<int64_t>(rank) * grp.shard_numel);
    owned_off.push_back(owned_total);
    owned_total += owned_len(g);
    const int64_t n = o.stage == 3 ? grp.shard_numel : grp.padded_numel;
    work[static_cast<size_t>(g)] = Tensor::zeros(dev, compute, Shape{n}, st, MemCategory::parameters);
    if (o.stage <= 1)
      grad_full[static_cast<size_t>(g)] =
          Tensor::zeros(dev, compute, Shape{grp.padded_numel}, st, MemCategory::gradients);
  }
  if (o.stage >= 2) {
    grad_acc_type = o.gradient_accumulation_steps > 1 ? DType::f32 : dtype;
    grad_acc = Tensor::zeros(dev, compute, Shape{owned_total}, scalar_type(grad_acc_type),
                             MemCategory::gradients);
  }
  if (dtype != DType::f32)
    master = Tensor::zeros(dev, compute, Shape{owned_total}, ScalarType::f32, MemCategory::master_weights);
  m = Tensor::zeros(dev, compute, Shape{owned_total}, ScalarType::f32, MemCategory::optimizer_states);
  v = Tensor::zeros(dev, compute, Shape{owned_total}, ScalarType::f32, MemCategory::optimizer_states);
  compute.synchronize();

  // Initial values: a pure function of (seed, name, element), so every stage and world size
  // starts from the same model. The working copy is the fp32 value rounded to the dtype.
  std::vector<float> vals;
  for (int g = 0; g < G; ++g) {
    if (o.stage < 3) {  // the full working buffer, on every rank
      for (int p : part.group(g).params) {
        const Partition::Location& loc = part.location(p);
        vals.resize(static_cast<size_t>(loc.numel));
        init_param_values(model.params[static_cast<size_t>(p)], o.seed, 0, loc.numel, vals.data());
        store(at(work[static_cast<size_t>(g)], loc.offset, esize()), dtype, vals.data(), loc.numel);
      }
    }
    for (const Partition::Piece& pc : owned_pieces(g)) {
      vals.resize(static_cast<size_t>(pc.count));
      init_param_values(model.params[static_cast<size_t>(pc.param)], o.seed, pc.param_offset,
                        pc.count, vals.data());
      if (o.stage == 3)
        store(at(work[static_cast<size_t>(g)], pc.shard_offset, esize()), dtype, vals.data(), pc.count);
      if (master)
        std::memcpy(at(master, owned_off[static_cast<size_t>(g)] + pc.shard_offset, 4), vals.data(),
                    static_cast<size_t>(pc.count) * 4);
    }
  }
}

Engine::Engine(Model& model, Device& device, Stream& compute, coll::Communicator& comm,
               EngineOptions options)
    : s_(std::make_unique<State>(model, device, compute, comm, std::move(options))) {
  State& s = *s_;
  ZERO_REQUIRE(s.o.stage >= 0 && s.o.stage <= 3,
               "engine: zero_optimization.stage must be 0, 1, 2 or 3, got " + std::to_string(s.o.stage));
  ZERO_REQUIRE(s.o.gradient_accumulation_steps >= 1,
               "engine: gradient_accumulation_steps must be >= 1, got " +
                   std::to_string(s.o.gradient_accumulation_steps));
  const std::optional<DType> dt = to_dtype(s.o.param_type);
  ZERO_REQUIRE(dt.has_value(), "engine: parameters must be fp32, bf16 or fp16, got " +
                                   std::string(to_string(s.o.param_type)));
  s.dtype = *dt;
  ZERO_REQUIRE(device.kind() == DeviceKind::cpu,
               "engine on " + device.name() +
                   ": the ZeRO engine runs on the cpu backend so far; the cuda optimizer step and "
                   "device-side accumulation come with the GPU work (issue 9)");
  for (const ParamSpec& p : model.params)
    ZERO_REQUIRE(p.type == s.o.param_type,
                 "engine: parameter " + p.name + " is " + std::string(to_string(p.type)) +
                     " but the engine trains " + std::string(to_string(s.o.param_type)) +
                     " parameters: build the model with that parameter type");
  s.compute_done = device.create_event();
  s.checkpoint = checkpoint_plan(model, s.o.number_checkpoints);
  s.adam = std::make_unique<optim::HostAdam>();
  if (s.o.loss_scaler) s.scaler = std::make_unique<optim::LossScaler>(*s.o.loss_scaler);
  s.init_state();
}

Engine::~Engine() = default;

const Partition& Engine::partition() const noexcept { return s_->part; }
const EngineOptions& Engine::options() const noexcept { return s_->o; }

std::vector<Tensor> Engine::State::views(int unit, bool grads) {
  std::vector<Tensor> out;
  for (int id : model.units[static_cast<size_t>(unit)]->param_ids()) {
    const ParamSpec& spec = model.params[static_cast<size_t>(id)];
    const Partition::Location& loc = part.location(id);
    const size_t g = static_cast<size_t>(loc.group);
    Tensor base;
    if (!grads) {
      base = o.stage == 3 ? gathered[g] : work[g];
    } else if (o.stage <= 1) {
      base = grad_full[g];
    } else {
      // The group's gradient buffer exists from the first Unit (in backward order) that adds
      // to it until the group's own Unit has run its backward and it is reduce-scattered.
      if (!grad_tmp[g]) {
        grad_tmp[g] = grad_pool.take(dev, part.group(loc.group).padded_numel, scalar_type(dtype));
        // Host memset: the buffer's previous users (a finished reduction) are done with it.
        std::memset(grad_tmp[g].data(), 0, static_cast<size_t>(part.group(loc.group).padded_numel) * esize());
      }
      base = grad_tmp[g];
    }
    ZERO_REQUIRE(base, "engine: group " + std::to_string(loc.group) + " of " + spec.name +
                           " is not present for unit " + model.units[static_cast<size_t>(unit)]->name());
    out.push_back(Tensor::view(at(base, loc.offset, esize()), spec.shape, spec.type));
  }
  return out;
}

// Stage 3: start the all-gathers of the groups Unit `unit` uses (those not already present or
// in flight). Returns at once: the prefetch of the next Unit runs on the communicator's stream
// while the compute stream works on the current one.
void Engine::State::gather(int unit) {
  if (unit < 0 || unit >= static_cast<int>(model.units.size())) return;
  for (int g : part.unit_groups(unit)) {
    Tensor& full = gathered[static_cast<size_t>(g)];
    if (full) continue;
    const Partition::Group& grp = part.group(g);
    full = param_pool.take(dev, grp.padded_numel, scalar_type(dtype));
    // The shard (work[g]) changes only in the optimizer step, between steps: nothing to wait for.
    gathering[static_cast<size_t>(g)] =
        comm.all_gather(work[static_cast<size_t>(g)].data(), full.data(),
                        static_cast<size_t>(grp.shard_numel), dtype);
  }
}

// Stage 3: Unit `unit` is about to run: its groups' all-gathers must have landed before the
// compute stream reads them. chain() makes the compute stream wait, not the host.
void Engine::State::use(int unit) {
  gather(unit);
  for (int g : part.unit_groups(unit)) {
    gathering[static_cast<size_t>(g)].chain(compute);
    gathering[static_cast<size_t>(g)] = coll::Work();
  }
}

// Stage 3: free the gathered groups Unit `keep_unit` (the next to run) does not need. The views
// the finished Unit was given own nothing and its ops may still be queued: wait for the compute
// stream first (this is also the engine's one-Unit bound on how far the host runs ahead).
void Engine::State::release_except(int keep_unit) {
  compute_point()->synchronize();
  std::vector<bool> keep(gathered.size(), false);
  if (keep_unit >= 0 && keep_unit < static_cast<int>(model.units.size()))
    for (int g : part.unit_groups(keep_unit)) keep[static_cast<size_t>(g)] = true;
  for (size_t g = 0; g < gathered.size(); ++g)
    if (!keep[g] && gathered[g]) {
      gathering[g].wait();  // a prefetch nobody used (cannot happen in order; cheap if done)
      gathering[g] = coll::Work();
      param_pool.give(gathered[g]);
    }
}

// Stage 2/3: group g's gradient of this micro-batch is complete once the compute stream has run
// its Unit's backward. Start the reduce-scatter after that point (in place: the rank's shard of
// the buffer receives the sum) and return: it runs on the communicator's stream while backward
// goes on. finish_oldest_reduce() takes the result.
void Engine::State::reduce_group_stage2(int g) {
  Tensor& full = grad_tmp[static_cast<size_t>(g)];
  if (!full) return;  // no Unit added to it (a group of no parameters)
  const Partition::Group& grp = part.group(g);
  unsigned char* shard = at(full, owned_begin[static_cast<size_t>(g)], esize());
  coll::Work w = comm.reduce_scatter(full.data(), shard, static_cast<size_t>(grp.shard_numel),
                                     dtype, coll::ReduceOp::sum, compute_point());
  pending.push_back({g, std::move(w), std::move(full)});
  full = Tensor();
  if (pending.size() > kMaxReducesInFlight) finish_oldest_reduce();
}

// Waits for the oldest reduce-scatter, keeps its shard (or adds it to the fp32 accumulator) and
// frees the full buffer.
void Engine::State::finish_oldest_reduce() {
  PendingReduce r = std::move(pending.front());
  pending.erase(pending.begin());
  r.work.wait();
  struct GiveBack {  // the buffer returns to the pool however this function ends
    Pool& pool;
    Tensor& t;
    ~GiveBack() { pool.give(t); }
  } give_back{grad_pool, r.full};
  const size_t g = static_cast<size_t>(r.group);
  const unsigned char* shard = at(r.full, owned_begin[g], esize());
  const size_t n = static_cast<size_t>(part.group(r.group).shard_numel);
  if (o.gradient_accumulation_steps == 1) {  // keep the reduced shard as it is
    std::memcpy(at(grad_acc, owned_off[g], esize()), shard, n * esize());
  } else {
    float* acc = static_cast<float*>(grad_acc.data()) + owned_off[g];
    std::vector<float> widened(n);
    convert(shard, dtype, widened.data(), DType::f32, n);
    for (size_t i = 0; i < n; ++i) acc[i] += widened[i];
  }
}

double Engine::State::micro_batch(const Batch& batch, float seed_scale) {
  const size_t U = model.units.size();
  std::vector<UnitContext> ctx(U);
  Tensor prev;
  for (size_t u = 0; u < U; ++u) {
    UnitContext& c = ctx[u];
    if (o.stage == 3) {
      use(static_cast<int>(u));
      gather(static_cast<int>(u) + 1);  // prefetch the next Unit's parameters
    }
    c.batch = &batch;
    c.input = prev;
    c.checkpoint = checkpoint[u];
    c.params = views(static_cast<int>(u), false);
    model.units[u]->forward(c);
    c.params.clear();
    prev = c.output;
    // At most one Unit in flight on the stream: memory a Unit dropped is free once the stream
    // has passed it (stage 3 also frees the gathered parameters here).
    if (o.stage == 3) release_except(static_cast<int>(u) + 1); else compute_point()->synchronize();
  }
  // The loss (fp32, or fp64 with fp64 activations) to the host; the synchronize also reports a
  // bad token or target found by this micro-batch's ops.
  double loss64 = 0;
  float loss32 = 0;
  const bool f64 = ctx.back().loss.type() == ScalarType::f64;
  copy_to_host(dev, compute, f64 ? static_cast<void*>(&loss64) : static_cast<void*>(&loss32), ctx.back().loss);
  compute.synchronize();
  const double loss = f64 ? loss64 : loss32;

  Tensor dprev;
  for (size_t u = U; u-- > 0;) {
    UnitContext& c = ctx[u];
    if (o.stage == 3) {
      use(static_cast<int>(u));
      gather(static_cast<int>(u) - 1);  // prefetch the next Unit in backward order
    }
    c.params = views(static_cast<int>(u), false);
    c.grads = views(static_cast<int>(u), true);
    c.grad_output = dprev;
    c.grad_scale = seed_scale;
    model.units[u]->backward(c);
    dprev = c.grad_input;
    c = UnitContext();
    if (o.stage >= 2) reduce_group_stage2(static_cast<int>(u));  // group u is complete now
    if (o.stage == 3) release_except(static_cast<int>(u) - 1); else compute_point()->synchronize();
  }
  while (!pending.empty()) finish_oldest_reduce();
  return loss;
}

StepStats Engine::State::boundary(double loss) {
  const int G = part.group_count();
  // Stage 0/1: reduce the accumulated gradients now.
  for (int g = 0; g < G && o.stage <= 1; ++g) {
    const Partition::Group& grp = part.group(g);
    Tensor& full = grad_full[static_cast<size_t>(g)];
    if (o.stage == 0)
      comm.all_reduce(full.data(), full.data(), static_cast<size_t>(grp.padded_numel), dtype,
                      coll::ReduceOp::sum, compute_point()).wait();
    else
      comm.reduce_scatter(full.data(), at(full, owned_begin[static_cast<size_t>(g)], esize()),
                          static_cast<size_t>(grp.shard_numel), dtype, coll::ReduceOp::sum,
                          compute_point()).wait();
  }
  // Where this rank's reduced gradient for its owned range of group g starts.
  const DType gtype = o.stage >= 2 ? grad_acc_type : dtype;
  auto grad_ptr = [&](int g) -> unsigned char* {
    if (o.stage >= 2) return at(grad_acc, owned_off[static_cast<size_t>(g)], size_of(grad_acc_type));
    return at(grad_full[static_cast<size_t>(g)], owned_begin[static_cast<size_t>(g)], esize());
  };

  // Global norm: each rank's owned range (stage 0: all of it, identical on every rank, so no
  // communication; otherwise the shards partition the gradient and one all-reduce sums them).
  double local = 0;
  for (int g = 0; g < G; ++g)
    local += optim::local_squared_norm(grad_ptr(g), gtype, static_cast<size_t>(owned_len(g)));
  optim::GlobalNorm norm;
  if (o.stage == 0) {
    norm.squared = static_cast<float>(local);
    norm.norm = std::sqrt(norm.squared);
    norm.finite = std::isfinite(norm.squared);
  } else {
    norm = optim::global_grad_norm(comm, static_cast<float>(local));
  }
  // The gradients are sums over ranks and micro-batches of gradients of mean losses: the
  // objective's gradient is that divided by n.
  const double n = static_cast<double>(world) * o.gradient_accumulation_steps;
  optim::GlobalNorm mean = norm;
  mean.norm = static_cast<float>(norm.norm / n);
  mean.squared = static_cast<float>(norm.squared / (n * n));
  const optim::StepScale sc = scaler ? optim::prepare_step(*scaler, mean, o.gradient_clipping)
                                     : optim::fold_grad_scale(mean, 1.0, o.gradient_clipping);
  ++steps;
  StepStats st;
  st.step = steps;
  st.loss = loss;
  st.grad_norm = sc.grad_norm;
  st.lr = o.lr(steps);
  st.loss_scale = sc.loss_scale;
  st.applied = sc.apply;

  if (sc.apply) {
    optim::AdamStep as{steps, st.lr, static_cast<float>(sc.grad_scale / n)};
    optim::AdamParams hp = o.adam;
    for (int g = 0; g < G; ++g) {
      const size_t gi = static_cast<size_t>(g);
      for (const Partition::Piece& pc : owned_pieces(g)) {
        hp.weight_decay = model.params[static_cast<size_t>(pc.param)].weight_decay ? o.adam.weight_decay : 0.0f;
        const int64_t off = owned_off[gi] + pc.shard_offset;
        // The working copy of these elements: stage 3 keeps only the shard; stages 0-2 the
        // full buffer, of which this rank's range starts at owned_begin.
        unsigned char* working = at(work[gi], (o.stage == 3 ? 0 : owned_begin[gi]) + pc.shard_offset, esize());
        float* p = master ? reinterpret_cast<float*>(at(master, off, 4)) : reinterpret_cast<float*>(working);
        adam->step(hp, as, p, reinterpret_cast<float*>(at(m, off, 4)), reinterpret_cast<float*>(at(v, off, 4)),
                   grad_ptr(g) + static_cast<size_t>(pc.shard_offset) * size_of(gtype), gtype,
                   static_cast<size_t>(pc.count), master ? working : nullptr, dtype);
      }
    }
    // Stage 1/2: every rank updated its shard of the working parameters; gather them.
    for (int g = 0; g < G && (o.stage == 1 || o.stage == 2); ++g) {
      const Partition::Group& grp = part.group(g);
      comm.all_gather(at(work[static_cast<size_t>(g)], owned_begin[static_cast<size_t>(g)], esize()),
                      work[static_cast<size_t>(g)].data(), static_cast<size_t>(grp.shard_numel), dtype)
          .wait();
    }
  }
  // Fresh gradients for the next step.
  for (Tensor& t : grad_full)
    if (t) std::memset(t.data(), 0, t.bytes());
  if (grad_acc) std::memset(grad_acc.data(), 0, grad_acc.bytes());
  return st;
}

StepStats Engine::step(const std::function<Batch(int micro)>& next) {
  State& s = *s_;
  const float seed = s.scaler ? static_cast<float>(s.scaler->scale()) : 1.0f;
  try {
    double loss = 0;
    for (int mb = 0; mb < s.o.gradient_accumulation_steps; ++mb) {
      const Batch batch = next(mb);
      loss += s.micro_batch(batch, seed);
    }
    return s.boundary(loss / s.o.gradient_accumulation_steps);
  } catch (...) {
    s.quiesce();  // nothing in flight may outlive the buffers the unwinding frees
    throw;
  }
}

std::vector<float> Engine::parameter(int p) {
  State& s = *s_;
  const Partition::Location& loc = s.part.location(p);
  const size_t g = static_cast<size_t>(loc.group);
  std::vector<float> out(static_cast<size_t>(loc.numel), 0.0f);
  for (const Partition::Piece& pc : s.owned_pieces(loc.group)) {
    if (pc.param != p) continue;
    const float* src;
    if (s.master) {
      src = reinterpret_cast<const float*>(s.at(s.master, s.owned_off[g] + pc.shard_offset, 4));
    } else {
      src = reinterpret_cast<const float*>(
          s.at(s.work[g], (s.o.stage == 3 ? 0 : s.owned_begin[g]) + pc.shard_offset, 4));
    }
    std::memcpy(out.data() + pc.param_offset, src, static_cast<size_t>(pc.count) * 4);
  }
  // Each element is owned by exactly one rank; the others hold 0 there, so the sum is the
  // value (a -0.0 reads back as +0.0). Stage 0: every rank owns everything already.
  if (s.o.stage != 0 && s.world > 1)
    s.comm.all_reduce(out.data(), out.data(), out.size(), DType::f32, coll::ReduceOp::sum).wait();
  return out;
}

Engine::ModelStateBytes Engine::expected_model_state() const {
  const State& s = *s_;
  const size_t psi = static_cast<size_t>(s.part.padded_numel_total());
  const size_t shard = static_cast<size_t>(s.part.shard_numel_total());
  const size_t e = size_of(s.dtype);
  const size_t owned = s.o.stage == 0 ? psi : shard;
  ModelStateBytes b;
  b.parameters = e * (s.o.stage == 3 ? shard : psi);
  if (s.o.stage <= 1)
    b.gradients = e * psi;
  else
    b.gradients = (s.o.gradient_accumulation_steps > 1 ? 4 : e) * shard;
  b.master = s.dtype == DType::f32 ? 0 : 4 * owned;
  b.optimizer = 8 * owned;
  return b;
}

std::string Engine::memory_report() const {
  const State& s = *s_;
  const ModelStateBytes b = expected_model_state();
  const LedgerSnapshot snap = s.dev.ledger().snapshot();
  const double psi = static_cast<double>(s.model.parameter_count());
  std::string out = "ZeRO stage " + std::to_string(s.o.stage) + ", " + std::to_string(s.world) +
                    " rank(s), " + std::string(to_string(s.dtype)) + " parameters, " +
                    std::to_string(s.model.parameter_count()) + " parameters (" +
                    std::to_string(s.part.padded_numel_total()) + " padded)\n";
  char line[200];
  std::snprintf(line, sizeof line,
                "model state per rank: expected %s = %.2f bytes/parameter (params %s, grads %s, "
                "master %s, adam %s)\n",
                format_bytes(b.total()).c_str(), static_cast<double>(b.total()) / psi,
                format_bytes(b.parameters).c_str(), format_bytes(b.gradients).c_str(),
                format_bytes(b.master).c_str(), format_bytes(b.optimizer).c_str());
  return out + line + snap.table();
}

}  // namespace zero
