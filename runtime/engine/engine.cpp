#include "runtime/engine/engine.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>
#include <tbb/parallel_for.h>

#include "optim/clip.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "core/log.hpp"
#include "core/phase.hpp"
#include "optim/host_adam.hpp"
#include "runtime/engine/state_kernels.hpp"

namespace zero {

// This rank's pieces in the checkpoint's terms, with where each lives: group g, offset within
// the group's owned range. Stage 0 saves from rank 0 only (every rank holds everything); every
// rank loads everything.
struct EnginePieces {
  std::vector<checkpoint::Piece> pieces;
  std::vector<std::pair<int, Partition::Piece>> where;
  int64_t total = 0;
};

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
  std::vector<bool> whole;        // working parameters held whole: stage 0-2, persistent at 3
  std::vector<Tensor> work;       // whole: full padded buffer; else (stage 3) this rank's shard
  std::vector<Tensor> gathered;   // stage 3, not whole: the full buffer while Units need it
  // The all-gather filling gathered[g] (stage 3) or, after the optimizer step, work[g] (whole
  // groups at stage 1-3); a Unit reading the group waits for it first.
  std::vector<coll::Work> gathering;
  std::vector<Tensor> grad_full;  // stage 0/1: full padded gradient
  std::vector<coll::Work> reducing;  // stage 0/1: its all-reduce / reduce-scatter in flight
  // Stage 0/1 with 16-bit parameters and accumulation: the fp32 sum of the micro-batches'
  // gradients (what DeepSpeed's bf16 optimizer keeps too). After each Unit's backward its
  // group's 16-bit gradient is added here and zeroed; after the last micro-batch the sum is
  // rounded once into grad_full, which is reduced as before. Without it every micro-batch's
  // gradient would be added in 16-bit: one rounding per micro-batch, which loses the small
  // contributions (stage 2/3 accumulate their shard in fp32 for the same reason).
  std::vector<Tensor> grad_sum01;
  void fold_group(int g, bool last);
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
  Tensor master, m, v;  // on the device (without offload_optimizer)
  // Where AdamW's fp32 state is: the tensors above, or host memory with offload. P_master is
  // null when the fp32 working parameters are their own master copy (fp32, no offload).
  float *P_master = nullptr, *P_m = nullptr, *P_v = nullptr;

  // Offload (EngineOptions::offload_optimizer / offload_param). host outlives the HostBuffers
  // below (declared after it, destroyed before it).
  bool off = false, off_param = false;
  std::unique_ptr<offload::HostMemory> host;
  std::unique_ptr<offload::CopyEngine> copies;
  // The host's tasks, each kind in order on a thread of its own (cpu executors on either
  // backend): `worker` adds a landed gradient shard to the accumulator and takes its squared
  // norm; `optimizer` runs AdamW on a group, after that group's last landing. Two queues, so
  // that the last group's norm (which the step's all-reduce waits for) never queues behind the
  // AdamW of the groups before it.
  std::unique_ptr<Stream> worker, optimizer;
  std::vector<std::unique_ptr<Event>> adam_done;  // per group, recorded on `optimizer`
  std::vector<std::unique_ptr<Event>> land_done;  // per group: its landed shard was used
  std::unique_ptr<Event> norms_done;              // the last landed group's norm was taken
  void sync_host_threads() {
    worker->synchronize();
    optimizer->synchronize();
  }
  // The driving thread waiting for a host thread, counted as host AdamW not hidden
  // (conservative: part of such a wait may be accumulation or a norm).
  void wait_worker(Event& e) {
    const double t0 = now_seconds();
    e.synchronize();
    adam_waited += now_seconds() - t0;
  }
  offload::HostBuffer h_land;   // owned_total x e: this micro-batch's reduced shard, landed
  offload::HostBuffer h_acc;    // owned_total fp32: accumulator (stage 2/3, accumulation)
  offload::HostBuffer h_out;    // owned_total x e: AdamW's updated working copy, going up
  offload::HostBuffer h_master, h_m, h_v;  // owned_total fp32
  // Speculative host step (EngineOptions::speculative_host_step): a second bank of master, m, v.
  // Per group, bank[g] says which bank holds the current state; AdamW run ahead writes the
  // other one, and keeping its result flips bank[g] (dropping it costs nothing).
  bool spec = false;
  offload::HostBuffer h_master2, h_m2, h_v2;
  std::vector<uint8_t> bank;
  bool guess_next = true;     // the last step was applied unclipped: guess so again
  bool speculating = false;   // this step's last micro-batch runs AdamW ahead
  optim::AdamStep spec_as;    // the step it assumes: applied, unclipped
  optim::AdamParams spec_hp;
  std::vector<int> spec_order;  // groups whose AdamW ran ahead, in the order they landed
  std::vector<offload::HostBuffer> h_shard;  // offload_param: partitioned groups' shards
  std::vector<double> partial;  // per group: local squared norm of the final gradient shard

  std::vector<bool> checkpoint;
  std::unique_ptr<optim::HostAdam> adam;
  // The state arithmetic on the compute stream (accumulation, rounding, norms, AdamW of a
  // device-resident shard): host tasks on cpu, kernels on cuda.
  std::unique_ptr<StateKernels> kern;
  // Per group the squared norm of its final gradient (owned range), then one more float: the
  // scalar the norm's all-reduce runs on when the communicator takes device buffers (NCCL).
  Tensor norms;
  std::unique_ptr<optim::LossScaler> scaler;
  std::unique_ptr<Event> compute_done;  // hand-offs from the compute stream (see below)
  // How far the host runs ahead of the compute stream (stages 0-2): after enqueueing a Unit it
  // waits for the Unit before it, so the GPU runs one Unit while the host enqueues the next
  // (a wait for the Unit just enqueued would leave the GPU idle for every launch), and at most
  // two Units' transient memory is alive. Nothing the host touches depends on it: everything
  // that reads what a Unit wrote is stream-ordered (StateKernels, collectives' `after` events).
  std::unique_ptr<Event> fence[2];
  int fence_next = 0;
  void unit_fence() {
    compute.record(*fence[fence_next]);
    fence_next ^= 1;
    fence[fence_next]->synchronize();  // the previous Unit's point (never recorded: at once)
  }
  int64_t steps = 0;    // optimizer steps taken, skipped (fp16 overflow) ones included
  int64_t applied = 0;  // steps applied: Adam's t and the LR schedule's position, as in
                        // DeepSpeed, where a skipped step calls neither optimizer nor scheduler

  // Stage 3: the order Units run in during one step (per micro-batch: forward 0..U-1, then
  // backward U-1..0), the schedule prefetching and releasing follow.
  std::vector<int> trace;
  int64_t live_elems = 0;  // stage 3: elements gathered (present or in flight), not whole

  // Timers (EngineOptions::timers). comm_busy_ns is written on the communicator's stream.
  std::atomic<int64_t> comm_busy_ns{0};
  int64_t comm_busy_reported_ns = 0;
  double comm_t0 = 0;  // touched only on the communicator's stream
  double exposed = 0;  // this step's host time waiting on collectives
  double fwd_time = 0, bwd_time = 0;  // this step's host time in forward / backward
  double d2h_time = 0, h2d_time = 0, adam_waited = 0;  // offload: this step's host waits
  std::atomic<int64_t> adam_ns{0};  // offload: AdamW time on the host optimizer thread

  size_t esize() const { return size_of(dtype); }
  // A copy between any two buffers this device reaches (device memory, host memory), done when
  // it returns: a stream-ordered copy on the compute stream, then a wait. For set-up, checkpoints
  // and parameter reads, never inside a step.
  void copy_now(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    dev.copy_async(dst, src, bytes, compute);
    compute.synchronize();
  }
  // The same where one side is AdamW's fp32 state (state()) or an offloaded shard: host memory
  // with offload (a plain memcpy), device memory otherwise.
  void copy_state(void* dst, const void* src, size_t bytes) {
    if (off) std::memcpy(dst, src, bytes);
    else copy_now(dst, src, bytes);
  }
  // n fp32 values from the host, rounded to t, into `dst`, now: device memory, or host memory
  // when `host` (an offloaded parameter shard).
  void upload_as(void* dst, DType t, const float* vals, int64_t n, bool host = false);
  // The sum over ranks of each rank's `local` squared norm, as optim::global_grad_norm gives it;
  // over a device communicator (NCCL) through a device scalar.
  optim::GlobalNorm global_norm(float local);
  unsigned char* at(const Tensor& t, int64_t elems, size_t elem_size) const {
    return static_cast<unsigned char*>(t.data()) + static_cast<size_t>(elems) * elem_size;
  }
  int64_t owned_len(int g) const {
    return o.stage == 0 ? part.group(g).padded_numel : part.group(g).shard_numel;
  }
  // Where this rank's owned range of group g starts in work[g].
  int64_t work_owned_begin(int g) const { return whole[static_cast<size_t>(g)] ? owned_begin[static_cast<size_t>(g)] : 0; }
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

  // Issues one collective, `issue(after)`. With timers it is bracketed on the communicator's
  // stream by clock reads (after its `after` event: waiting for the compute stream is not
  // communication), which add its duration to comm_busy_ns.
  template <class F>
  coll::Work post(F&& issue, Event* after) {
    if (!o.timers) return issue(after);
    Stream& cs = comm.stream();
    if (after) cs.wait(*after);
    cs.launch_host([this] { comm_t0 = now_seconds(); });
    coll::Work w = issue(nullptr);
    cs.launch_host([this] {
      comm_busy_ns += static_cast<int64_t>((now_seconds() - comm_t0) * 1e9);
    });
    return w;
  }
  // The host needs collective `w` done. With timers, the compute stream is drained first (it
  // runs at most one Unit behind; its time is not communication) and the wait is counted as
  // exposed communication.
  void wait_comm(coll::Work& w) {
    if (!w.event() || w.test()) {
      w.wait();  // complete: only reports its error, if any
    } else if (o.timers) {
      compute.synchronize();
      const double t0 = now_seconds();
      w.wait();
      exposed += now_seconds() - t0;
    } else {
      w.wait();
    }
    w = coll::Work();
  }
  static double now_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }

  void init_state();
  // What the model state takes, from the partition and the options alone (init_state allocates
  // exactly this): on the device, and with offload on the host (`second_bank`: with the
  // speculative step's optional second copy of master, m and v).
  Engine::ModelStateBytes device_state() const;
  Engine::ModelStateBytes host_state(bool second_bank) const;
  // Stage 0/1 with 16-bit parameters and accumulation: an fp32 sum of the micro-batches' full
  // gradients. Stage 2/3 with offload: an fp32 host accumulator of the landed shards.
  bool fp32_full_sum() const {
    return o.stage <= 1 && o.gradient_accumulation_steps > 1 && dtype != DType::f32;
  }
  bool host_fp32_acc() const {
    return off && o.stage >= 2 && (o.gradient_accumulation_steps > 1 || dtype == DType::f32);
  }
  // Throws the ledger's OutOfMemory when the model state cannot fit the device's capacities, before
  // anything of it is allocated.
  void check_fits() const;
  std::vector<Tensor> views(int unit, bool grads);
  bool present(int g) const { return whole[static_cast<size_t>(g)] || gathered[static_cast<size_t>(g)]; }
  void gather_group(int g);
  void use(int unit);
  void prefetch(size_t pos);
  void release_after(size_t pos);
  void release_all();
  void start_reduce_full(int g);
  void reduce_group_stage2(int g, bool last);
  void finish_oldest_reduce();
  void land(int g, const void* shard, bool last);
  void adam_group(int g, const optim::AdamStep& as, const optim::AdamParams& base, bool ahead = false);
  void timed_adam(int g, const optim::AdamStep& as, const optim::AdamParams& hp, bool ahead) {
    const double t0 = now_seconds();
    adam_group(g, as, hp, ahead);
    adam_ns += static_cast<int64_t>((now_seconds() - t0) * 1e9);
  }
  // AdamW's fp32 state of group g's owned range: k = 0 master, 1 m, 2 v; `other`: the bank
  // the speculative step writes. Null master with fp32 parameters and no offload.
  float* state(int g, int k, bool other = false) const {
    const size_t gi = static_cast<size_t>(g);
    const bool second = spec && ((bank[gi] != 0) != other);
    float* base = k == 0 ? (second ? h_master2.as<float>() : P_master)
                : k == 1 ? (second ? h_m2.as<float>() : P_m)
                         : (second ? h_v2.as<float>() : P_v);
    return base ? base + owned_off[gi] : nullptr;
  }
  const unsigned char* grad_ptr(int g);
  DType grad_type() const { return o.stage >= 2 ? grad_acc_type : dtype; }
  // Offload, stage 3: where partitioned group g's shard lives (host with offload_param).
  void* shard_data(int g) {
    return off_param ? h_shard[static_cast<size_t>(g)].data() : work[static_cast<size_t>(g)].data();
  }

  // Stage 2/3 reductions in flight: the Work, and the full gradient buffer it reads, which must
  // live until the Work completes.
  struct PendingReduce {
    int group;
    coll::Work work;
    Tensor full;
    bool last;  // of the step's last micro-batch: the group's gradient is final
  };
  std::vector<PendingReduce> pending;  // oldest first
  int64_t pending_elems = 0;           // bounded by reduce_bucket_size (or one group)

  // The transient full-size buffers of stage 2/3 (gradients of a group during backward, gathered
  // parameters) come from pools kept across steps: freshly mapped memory page-faults on every
  // touch (measured: stage 2 a fifth slower than stage 0 when each micro-batch allocated them).
  // A buffer is reused only for a group of exactly its size (the transformer blocks share one
  // size; sizing every buffer for the largest group, the embedding, cost GPT-2 small 296 MB per
  // rank at stage 2). How many are in use at once is bounded by the communication options
  // (transient_bound()); the ledger counts them as communication buffers, apart from the model
  // state the ZeRO formula describes.
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
    for (std::vector<coll::Work>* ws : {&gathering, &reducing})
      for (coll::Work& w : *ws) {
        try { w.wait(); } catch (...) {}
        w = coll::Work();
      }
    for (PendingReduce& r : pending) {
      try { r.work.wait(); } catch (...) {}
    }
    pending.clear();
    pending_elems = 0;
    try { compute.synchronize(); } catch (...) {}
    try { comm.stream().synchronize(); } catch (...) {}  // the timers' clock reads
    if (worker) try { worker->synchronize(); } catch (...) {}
    if (optimizer) try { optimizer->synchronize(); } catch (...) {}
  }
  ~State() { quiesce(); }
  double micro_batch(const Batch& batch, float seed_scale, int mb);
  StepStats boundary(double loss);
  EnginePieces checkpoint_pieces(bool saving) const;
  void install(const EnginePieces& ep, const float* master_vals, const float* m_vals, const float* v_vals);

  // The AdamStep of applied step t with a global gradient scale (StepScale::grad_scale), as the
  // boundary computes it: the one place that knows the arithmetic, so that the guess made before
  // the norm and the step taken after it are equal bits exactly when they are the same step.
  optim::AdamStep adam_step(int64_t t, float grad_scale, optim::AdamParams& hp) const {
    const double n = static_cast<double>(world) * o.gradient_accumulation_steps;
    hp = o.adam;
    if (o.betas) std::tie(hp.beta1, hp.beta2) = o.betas(t);
    return optim::AdamStep{t, o.lr(t), static_cast<float>(grad_scale / n)};
  }
  // Before the last micro-batch: whether its groups' AdamW runs ahead, and the step it assumes
  // (the next applied step, unclipped, at the loss scale the gradients are computed at).
  void plan_speculation() {
    speculating = spec && guess_next;
    if (!speculating) return;
    const double loss_scale = scaler ? scaler->scale() : 1.0;
    spec_as = adam_step(applied + 1, static_cast<float>(1.0 / loss_scale), spec_hp);
  }
};

namespace {

// Host element write of an fp32 value in the working dtype.
// Bitwise equality of two AdamW steps' inputs (floats compared as bits: -0 != +0, NaN == NaN).
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_step(const optim::AdamStep& a, const optim::AdamParams& ha, const optim::AdamStep& b,
               const optim::AdamParams& hb) {
  return a.step == b.step && same_bits(a.lr, b.lr) && same_bits(a.grad_scale, b.grad_scale) &&
         same_bits(ha.beta1, hb.beta1) && same_bits(ha.beta2, hb.beta2) &&
         same_bits(ha.eps, hb.eps) && same_bits(ha.weight_decay, hb.weight_decay) &&
         ha.adam_w_mode == hb.adam_w_mode && ha.bias_correction == hb.bias_correction;
}

void store(void* dst, DType t, const float* src, int64_t n) {
  convert(src, DType::f32, dst, t, static_cast<size_t>(n));
}

// init_param_values over [begin, begin + count), in parallel chunks: each element's value is a
// function of (seed, name, element) alone, so the chunking changes no bit, and a billion-parameter
// model starts in seconds rather than minutes.
void init_values(const ParamSpec& spec, uint64_t seed, int64_t begin, int64_t count, float* out) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  if (count <= kChunk) return init_param_values(spec, seed, begin, count, out);
  tbb::parallel_for(int64_t{0}, (count + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t first = c * kChunk, n = std::min(kChunk, count - first);
    init_param_values(spec, seed, begin + first, n, out + first);
  });
}

}  // namespace

void Engine::State::upload_as(void* dst, DType t, const float* vals, int64_t n, bool host) {
  if (host) return store(dst, t, vals, n);
  std::vector<unsigned char> staged(static_cast<size_t>(n) * size_of(t));
  store(staged.data(), t, vals, n);
  copy_now(dst, staged.data(), staged.size());
}

optim::GlobalNorm Engine::State::global_norm(float local) {
  if (comm.kind() == DeviceKind::cpu) return optim::global_grad_norm(comm, local);
  float* scalar = norms.data_as<float>() + part.group_count();
  copy_now(scalar, &local, sizeof local);
  comm.all_reduce(scalar, scalar, 1, DType::f32, coll::ReduceOp::sum, compute_point()).wait();
  float sq = 0;
  copy_now(&sq, scalar, sizeof sq);
  optim::GlobalNorm g;
  g.squared = sq;
  g.norm = std::sqrt(sq);
  g.finite = std::isfinite(sq);
  return g;
}

void Engine::State::init_state() {
  const int G = part.group_count();
  const size_t Gs = static_cast<size_t>(G);
  whole.resize(Gs);
  work.resize(Gs);
  gathered.resize(Gs);
  gathering.resize(Gs);
  grad_full.resize(Gs);
  reducing.resize(Gs);
  grad_tmp.resize(Gs);
  const ScalarType st = scalar_type(dtype);
  for (int g = 0; g < G; ++g) {
    const Partition::Group& grp = part.group(g);
    const size_t gi = static_cast<size_t>(g);
    whole[gi] = o.stage < 3 || grp.padded_numel <= o.param_persistence_threshold;
    owned_begin.push_back(o.stage == 0 ? 0 : static_cast<int64_t>(rank) * grp.shard_numel);
    owned_off.push_back(owned_total);
    owned_total += owned_len(g);
  }
  check_fits();
  for (int g = 0; g < G; ++g) {
    const Partition::Group& grp = part.group(g);
    const size_t gi = static_cast<size_t>(g);
    if (off_param && !whole[gi]) {  // the shard lives on the host
      h_shard.push_back(host->allocate(static_cast<size_t>(grp.shard_numel) * esize(), MemCategory::parameters));
    } else {
      h_shard.emplace_back();
      const int64_t n = whole[gi] ? grp.padded_numel : grp.shard_numel;
      work[gi] = Tensor::zeros(dev, compute, Shape{n}, st, MemCategory::parameters);
    }
    if (o.stage <= 1)
      grad_full[gi] = Tensor::zeros(dev, compute, Shape{grp.padded_numel}, st, MemCategory::gradients);
    if (fp32_full_sum()) {
      if (grad_sum01.empty()) grad_sum01.resize(Gs);
      grad_sum01[gi] = Tensor::zeros(dev, compute, Shape{grp.padded_numel}, ScalarType::f32, MemCategory::gradients);
    }
  }
  if (o.stage >= 2) grad_acc_type = o.gradient_accumulation_steps > 1 ? DType::f32 : dtype;
  const size_t owned = static_cast<size_t>(owned_total);
  if (off) {
    // Host memory is not zeroed: the accumulator and the moments must be.
    h_land = host->allocate(owned * esize(), MemCategory::gradients);
    if (host_fp32_acc()) {
      h_acc = host->allocate(owned * 4, MemCategory::gradients);
      std::memset(h_acc.data(), 0, h_acc.bytes());
    }
    h_out = host->allocate(owned * esize(), MemCategory::parameters);
    h_master = host->allocate(owned * 4, MemCategory::master_weights);
    h_m = host->allocate(owned * 4, MemCategory::optimizer_states);
    h_v = host->allocate(owned * 4, MemCategory::optimizer_states);
    std::memset(h_m.data(), 0, h_m.bytes());
    std::memset(h_v.data(), 0, h_v.bytes());
    P_master = h_master.as<float>();
    P_m = h_m.as<float>();
    P_v = h_v.as<float>();
    if (spec) {
      // The second bank is a speed-up, not a need: when host memory cannot hold it, the engine
      // says so and runs the norm-first step instead of failing.
      try {
        h_master2 = host->allocate(owned * 4, MemCategory::master_weights);
        h_m2 = host->allocate(owned * 4, MemCategory::optimizer_states);
        h_v2 = host->allocate(owned * 4, MemCategory::optimizer_states);
        for (offload::HostBuffer* b : {&h_master2, &h_m2, &h_v2}) std::memset(b->data(), 0, b->bytes());
      } catch (const OutOfMemory& e) {
        h_master2 = offload::HostBuffer();
        h_m2 = offload::HostBuffer();
        h_v2 = offload::HostBuffer();
        spec = false;
        log::warn("engine: the speculative host step is off: host memory cannot hold its second "
                    "copy of the optimizer state (" + format_bytes(owned * 12) + " per rank); AdamW "
                    "runs after backward (norm-first). " + e.message().substr(0, e.message().find('\n')));
      }
    }
    bank.assign(Gs, 0);
    partial.assign(Gs, 0.0);
    for (int g = 0; g < G; ++g) {
      adam_done.push_back(make_cpu_event());
      land_done.push_back(make_cpu_event());
    }
    norms_done = make_cpu_event();
  } else {
    if (o.stage >= 2)
      grad_acc = Tensor::zeros(dev, compute, Shape{owned_total}, scalar_type(grad_acc_type),
                               MemCategory::gradients);
    if (dtype != DType::f32)
      master = Tensor::zeros(dev, compute, Shape{owned_total}, ScalarType::f32, MemCategory::master_weights);
    m = Tensor::zeros(dev, compute, Shape{owned_total}, ScalarType::f32, MemCategory::optimizer_states);
    v = Tensor::zeros(dev, compute, Shape{owned_total}, ScalarType::f32, MemCategory::optimizer_states);
    P_master = master ? master.data_as<float>() : nullptr;
    P_m = m.data_as<float>();
    P_v = v.data_as<float>();
    bank.assign(Gs, 0);
  }
  norms = Tensor::zeros(dev, compute, Shape{G + 1}, ScalarType::f32, MemCategory::other);
  compute.synchronize();

  // Initial values: a pure function of (seed, name, element), so every stage and world size
  // starts from the same model. The working copy is the fp32 value rounded to the dtype.
  std::vector<float> vals;
  for (int g = 0; g < G; ++g) {
    const size_t gi = static_cast<size_t>(g);
    if (whole[gi]) {  // the full working buffer, on every rank
      for (int p : part.group(g).params) {
        const Partition::Location& loc = part.location(p);
        vals.resize(static_cast<size_t>(loc.numel));
        init_values(model.params[static_cast<size_t>(p)], o.seed, 0, loc.numel, vals.data());
        upload_as(at(work[gi], loc.offset, esize()), dtype, vals.data(), loc.numel);
      }
    }
    for (const Partition::Piece& pc : owned_pieces(g)) {
      vals.resize(static_cast<size_t>(pc.count));
      init_values(model.params[static_cast<size_t>(pc.param)], o.seed, pc.param_offset,
                  pc.count, vals.data());
      if (!whole[gi])
        upload_as(static_cast<unsigned char*>(shard_data(g)) + static_cast<size_t>(pc.shard_offset) * esize(),
                  dtype, vals.data(), pc.count, off_param);
      if (P_master)
        copy_state(P_master + owned_off[gi] + pc.shard_offset, vals.data(), static_cast<size_t>(pc.count) * 4);
    }
  }

  if (o.stage == 3) {
    const int U = static_cast<int>(model.units.size());
    for (int mb = 0; mb < o.gradient_accumulation_steps; ++mb) {
      for (int u = 0; u < U; ++u) trace.push_back(u);
      for (int u = U; u-- > 0;) trace.push_back(u);
    }
    prefetch(0);  // the first step's first groups
  }
}

void check_engine_options(const EngineOptions& o) {
  ZERO_REQUIRE(o.stage >= 0 && o.stage <= 3,
               "engine: zero_optimization.stage must be 0, 1, 2 or 3, got " + std::to_string(o.stage));
  ZERO_REQUIRE(o.gradient_accumulation_steps >= 1,
               "engine: gradient_accumulation_steps must be >= 1, got " +
                   std::to_string(o.gradient_accumulation_steps));
  ZERO_REQUIRE(o.reduce_bucket_size >= 1,
               "engine: zero_optimization.reduce_bucket_size must be >= 1 element, got " +
                   std::to_string(o.reduce_bucket_size));
  ZERO_REQUIRE(o.prefetch_bucket_size >= 0 && o.max_live_parameters >= 0 &&
                   o.param_persistence_threshold >= 0,
               "engine: zero_optimization.stage3_prefetch_bucket_size, stage3_max_live_parameters "
               "and stage3_param_persistence_threshold must be >= 0");
  ZERO_REQUIRE(to_dtype(o.param_type).has_value(),
               "engine: parameters must be fp32, bf16 or fp16, got " +
                   std::string(to_string(o.param_type)));
  ZERO_REQUIRE(!o.offload_optimizer || o.stage >= 1,
               "engine: zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3 (stage 0 "
               "keeps the whole optimizer state on every rank): set zero_optimization.stage");
  ZERO_REQUIRE(!o.offload_param || o.stage == 3,
               "engine: zero_optimization.offload_param needs ZeRO stage 3 (only stage 3 "
               "partitions the parameters): set zero_optimization.stage to 3");
  ZERO_REQUIRE(!o.offload_param || o.offload_optimizer,
               "engine: zero_optimization.offload_param needs offload_optimizer too (the host "
               "optimizer writes the offloaded parameter shards): add offload_optimizer "
               "{\"device\": \"cpu\"}");
}

Engine::Engine(Model& model, Device& device, Stream& compute, coll::Communicator& comm,
               EngineOptions options)
    : s_(std::make_unique<State>(model, device, compute, comm, std::move(options))) {
  State& s = *s_;
  check_engine_options(s.o);
  s.dtype = *to_dtype(s.o.param_type);
  ZERO_REQUIRE(comm.kind() == device.kind(),
               "engine on " + device.name() + ": the communicator is for " +
                   std::string(to_string(comm.kind())) + " buffers; the engine's collectives run "
                   "on the device's own buffers: use make_communicator(comm, device) (NCCL for "
                   "cuda, MPI for cpu)");
  ZERO_REQUIRE(compute.kind() == device.kind(),
               "engine on " + device.name() + ": the compute stream belongs to another backend");
  ZERO_REQUIRE(s.dtype != DType::bf16 || device.supports_bf16(),
               "engine on " + device.name() + ": bf16 needs compute capability 8.0 or newer; "
               "use fp16 (with loss scaling) or fp32 on this GPU");
  for (const ParamSpec& p : model.params)
    ZERO_REQUIRE(p.type == s.o.param_type,
                 "engine: parameter " + p.name + " is " + std::string(to_string(p.type)) +
                     " but the engine trains " + std::string(to_string(s.o.param_type)) +
                     " parameters: build the model with that parameter type");
  s.off = s.o.offload_optimizer;
  s.off_param = s.o.offload_param;
  s.spec = s.off && s.o.speculative_host_step;
  if (s.off) {
    offload::HostMemoryOptions hm;
    hm.pin = s.o.pin;
    s.host = std::make_unique<offload::HostMemory>(device, hm);
    s.copies = std::make_unique<offload::CopyEngine>(device, *s.host);
    s.worker = make_cpu_stream("host-gradients");
    s.optimizer = make_cpu_stream("host-optimizer");
  }
  s.compute_done = device.create_event();
  s.fence[0] = device.create_event();
  s.fence[1] = device.create_event();
  s.checkpoint = checkpoint_plan(model, s.o.number_checkpoints);
  s.adam = std::make_unique<optim::HostAdam>(s.o.host_threads);
  s.kern = make_state_kernels(device, compute, *s.adam);
  if (s.o.loss_scaler) s.scaler = std::make_unique<optim::LossScaler>(*s.o.loss_scaler);
  s.init_state();
}

Engine::~Engine() = default;

const Partition& Engine::partition() const noexcept { return s_->part; }
int64_t Engine::steps_taken() const noexcept { return s_->steps; }
const EngineOptions& Engine::options() const noexcept { return s_->o; }

std::vector<Tensor> Engine::State::views(int unit, bool grads) {
  std::vector<Tensor> out;
  for (int id : model.units[static_cast<size_t>(unit)]->param_ids()) {
    const ParamSpec& spec = model.params[static_cast<size_t>(id)];
    const Partition::Location& loc = part.location(id);
    const size_t g = static_cast<size_t>(loc.group);
    Tensor base;
    if (!grads) {
      base = whole[g] ? work[g] : gathered[g];
    } else if (o.stage <= 1) {
      base = grad_full[g];
    } else {
      // The group's gradient buffer exists from the first Unit (in backward order) that adds
      // to it until the group's own Unit has run its backward and it is reduce-scattered.
      if (!grad_tmp[g]) {
        grad_tmp[g] = grad_pool.take(dev, part.group(loc.group).padded_numel, scalar_type(dtype));
        // Zeroed on the compute stream: the buffer's previous users were a finished reduction
        // (waited for) and compute work ahead of this in stream order.
        dev.fill_async(grad_tmp[g].data(), 0, static_cast<size_t>(part.group(loc.group).padded_numel) * esize(), compute);
      }
      base = grad_tmp[g];
    }
    ZERO_REQUIRE(base, "engine: group " + std::to_string(loc.group) + " of " + spec.name +
                           " is not present for unit " + model.units[static_cast<size_t>(unit)]->name());
    out.push_back(Tensor::view(at(base, loc.offset, esize()), spec.shape, spec.type));
  }
  return out;
}

// Stage 3: starts the all-gather of group g into a pooled full buffer unless it is whole,
// present or in flight. Returns at once: it runs on the communicator's stream.
void Engine::State::gather_group(int g) {
  const size_t gi = static_cast<size_t>(g);
  if (present(g)) return;
  const Partition::Group& grp = part.group(g);
  gathered[gi] = param_pool.take(dev, grp.padded_numel, scalar_type(dtype));
  live_elems += grp.padded_numel;
  // The collective (or the copy) starts after the compute stream's current point: the shard
  // (work[g]) is written there by the optimizer step's AdamW, and a freshly allocated buffer is
  // ordered on the compute stream. The host runs at most one Unit ahead of the compute stream,
  // so this waits for little.
  Event* after = compute_point();
  const void* send = work[gi].data();
  if (off_param) {
    // The shard comes up from the host into its own place in the full buffer, and is gathered
    // in place from there. The host waits for the copy: on cuda a DMA of 1/N of the group.
    unsigned char* mine = at(gathered[gi], owned_begin[gi], esize());
    const double t0 = now_seconds();
    copies->to_device(mine, h_shard[gi], 0, static_cast<size_t>(grp.shard_numel) * esize(), after).wait();
    h2d_time += now_seconds() - t0;
    send = mine;
    after = nullptr;
  }
  gathering[gi] = post([&](Event* a) {
    return comm.all_gather(send, gathered[gi].data(), static_cast<size_t>(grp.shard_numel), dtype, a);
  }, after);
  if (!o.overlap_comm) wait_comm(gathering[gi]);
}

// Unit `unit` is about to run: its groups' all-gathers (stage 3, or the step-end all-gather of a
// whole group at stage 1-3) must have landed before the compute stream reads them. chain()
// makes the compute stream wait, not the host; with timers the host waits instead (the compute
// stream is idle here anyway: the host is at most one Unit ahead) so the wait can be measured.
void Engine::State::use(int unit) {
  for (int g : part.unit_groups(unit)) {
    if (o.stage == 3) gather_group(g);
    coll::Work& w = gathering[static_cast<size_t>(g)];
    if (o.timers) {
      wait_comm(w);
    } else {
      w.chain(compute);
      w = coll::Work();
    }
  }
}

// Stage 3: gathers ahead the groups of the Units at trace[from], trace[from + 1], ... : the
// window of groups ahead (present or not, whole groups aside) holds at most prefetch_bucket_size
// elements or the next Unit's, and never more than max_live_parameters are gathered at once. Stops at the first Unit
// that does not fit, so what is gathered ahead is always a prefix of what comes next.
void Engine::State::prefetch(size_t from) {
  if (o.prefetch_bucket_size <= 0) return;
  int64_t budget = o.prefetch_bucket_size;
  std::vector<bool> counted(gathered.size(), false);
  for (size_t q = from; q < trace.size(); ++q) {
    int64_t size = 0, need = 0;
    for (int g : part.unit_groups(trace[q])) {
      const size_t gi = static_cast<size_t>(g);
      if (whole[gi] || counted[gi]) continue;
      size += part.group(g).padded_numel;
      if (!gathered[gi]) need += part.group(g).padded_numel;
    }
    // The next Unit is gathered ahead even when it alone is larger than the bucket: DeepSpeed
    // would prefetch part of it, our unit of gathering is the whole group.
    if ((size > budget && q != from) || live_elems + need > o.max_live_parameters) return;
    budget -= size;
    for (int g : part.unit_groups(trace[q])) {
      counted[static_cast<size_t>(g)] = true;
      gather_group(g);
    }
  }
}

// Stage 3: trace[pos] has been enqueued. Release the gathered groups no Unit within the gathered
// prefix of what follows needs (the next Unit's groups are "reused soon": the head's, between
// forward and backward). The views the finished Unit was given own nothing and its ops may
// still be queued: wait for the compute stream first (this is also the engine's one-Unit bound
// on how far the host runs ahead).
void Engine::State::release_after(size_t pos) {
  compute_point()->synchronize();
  std::vector<bool> keep(gathered.size(), false);
  for (size_t q = pos + 1; q < trace.size(); ++q) {
    bool all = true;
    for (int g : part.unit_groups(trace[q])) all = all && present(g);
    if (!all) break;
    for (int g : part.unit_groups(trace[q])) keep[static_cast<size_t>(g)] = true;
  }
  for (size_t g = 0; g < gathered.size(); ++g)
    if (!keep[g] && gathered[g]) {
      wait_comm(gathering[g]);  // a prefetch nobody used (cannot happen in order; cheap if done)
      live_elems -= part.group(static_cast<int>(g)).padded_numel;
      param_pool.give(gathered[g]);
    }
}

// Stage 3, end of the step's last backward: the optimizer step is about to change the shards,
// so no gathered copy may survive it.
void Engine::State::release_all() {
  compute_point()->synchronize();
  for (size_t g = 0; g < gathered.size(); ++g)
    if (gathered[g]) {
      wait_comm(gathering[g]);
      live_elems -= part.group(static_cast<int>(g)).padded_numel;
      param_pool.give(gathered[g]);
    }
}

// Stage 0/1: group g's gradient is complete (its Unit's backward of the last micro-batch is
// enqueued, and no later Unit adds to it): start its all-reduce / reduce-scatter in place, after
// the compute stream's current point. The boundary waits for it.
void Engine::State::start_reduce_full(int g) {
  const size_t gi = static_cast<size_t>(g);
  const Partition::Group& grp = part.group(g);
  Tensor& full = grad_full[gi];
  reducing[gi] = post([&](Event* after) {
    if (o.stage == 0)
      return comm.all_reduce(full.data(), full.data(), static_cast<size_t>(grp.padded_numel), dtype,
                             coll::ReduceOp::sum, after);
    return comm.reduce_scatter(full.data(), at(full, owned_begin[gi], esize()),
                               static_cast<size_t>(grp.shard_numel), dtype, coll::ReduceOp::sum, after);
  }, compute_point());
  if (!o.overlap_comm) wait_comm(reducing[gi]);
}

// Stage 2/3: group g's gradient of this micro-batch is complete once the compute stream has run
// its Unit's backward. Start the reduce-scatter after that point (in place: the rank's shard of
// the buffer receives the sum) and return: it runs on the communicator's stream while backward
// goes on. finish_oldest_reduce() takes the result. The full buffers in reduction hold at most
// reduce_bucket_size elements, or one group if it is larger.
void Engine::State::reduce_group_stage2(int g, bool last) {
  Tensor& full = grad_tmp[static_cast<size_t>(g)];
  if (!full) return;  // no Unit added to it (a group of no parameters)
  const Partition::Group& grp = part.group(g);
  while (!pending.empty() && pending_elems + grp.padded_numel > o.reduce_bucket_size) finish_oldest_reduce();
  unsigned char* shard = at(full, owned_begin[static_cast<size_t>(g)], esize());
  coll::Work w = post([&](Event* after) {
    return comm.reduce_scatter(full.data(), shard, static_cast<size_t>(grp.shard_numel), dtype,
                               coll::ReduceOp::sum, after);
  }, compute_point());
  pending.push_back({g, std::move(w), std::move(full), last});
  pending_elems += grp.padded_numel;
  full = Tensor();
  if (!o.overlap_comm) finish_oldest_reduce();
  // Take the reductions already done (in order) without waiting: their buffers go back to the
  // pool and, with offload, their shards land now, so that the host works on them (AdamW
  // included) while backward goes on, however large reduce_bucket_size is.
  while (!pending.empty() && pending.front().work.test()) finish_oldest_reduce();
}

// Waits for the oldest reduce-scatter, keeps its shard (or adds it to the fp32 accumulator) and
// frees the full buffer.
void Engine::State::finish_oldest_reduce() {
  PendingReduce r = std::move(pending.front());
  pending.erase(pending.begin());
  pending_elems -= part.group(r.group).padded_numel;
  struct GiveBack {  // the buffer returns to the pool however this function ends
    Pool& pool;
    Tensor& t;
    ~GiveBack() { pool.give(t); }
  } give_back{grad_pool, r.full};
  wait_comm(r.work);
  const size_t g = static_cast<size_t>(r.group);
  const unsigned char* shard = at(r.full, owned_begin[g], esize());
  const size_t n = static_cast<size_t>(part.group(r.group).shard_numel);
  // The reduction has completed (waited for above); the compute stream reads the buffer after
  // it goes back to the pool, which is safe: the pool's next user is the compute stream too
  // (in stream order) or a collective that waits for the compute stream's current point.
  if (off) {
    land(r.group, shard, r.last);
  } else if (o.gradient_accumulation_steps == 1) {  // keep the reduced shard as it is
    dev.copy_async(at(grad_acc, owned_off[g], esize()), shard, n * esize(), compute);
  } else {
    kern->accumulate(grad_acc.data_as<float>() + owned_off[g], shard, dtype, n);
  }
}

// Offload: group g's reduced gradient shard of this micro-batch is complete at device pointer
// `shard`. It comes down (16-bit, e bytes per element: the host waits for the copy, after which
// the device buffer may be reused), and the host optimizer thread adds it to the fp32
// accumulator (stage 2/3 with accumulation) and, once it is final, takes its squared norm.
// Same arithmetic, same order as the device path: the results are bitwise the same.
void Engine::State::land(int g, const void* shard, bool last) {
  const size_t gi = static_cast<size_t>(g);
  const size_t n = static_cast<size_t>(part.group(g).shard_numel);
  // The landing area of g is free once the host thread has used the previous micro-batch's
  // (with one micro-batch, the previous step's AdamW read it: the boundary waited for that).
  wait_worker(*land_done[gi]);
  const double t0 = now_seconds();
  copies->to_host(h_land, static_cast<size_t>(owned_off[gi]) * esize(), shard, n * esize()).wait();
  d2h_time += now_seconds() - t0;
  worker->launch_host([this, g, gi, n, last] {
    const unsigned char* landed = static_cast<const unsigned char*>(h_land.data()) + static_cast<size_t>(owned_off[gi]) * esize();
    if (h_acc) {
      float* acc = h_acc.as<float>() + owned_off[gi];
      std::vector<float> widened(n);
      convert(landed, dtype, widened.data(), DType::f32, n);
      for (size_t i = 0; i < n; ++i) acc[i] += widened[i];
    }
    if (last)
      partial[gi] = optim::local_squared_norm(grad_ptr(g), grad_type(), static_cast<size_t>(owned_len(g)));
  });
  worker->record(*land_done[gi]);
  if (last) worker->record(*norms_done);
  if (last && speculating) {  // the group's gradient is final: its AdamW, ahead of the norm
    optimizer->wait(*land_done[gi]);
    optimizer->launch_host([this, g] { timed_adam(g, spec_as, spec_hp, true); });
    optimizer->record(*adam_done[gi]);
    spec_order.push_back(g);
  }
}

// Where this rank's reduced gradient for its owned range of group g starts.
const unsigned char* Engine::State::grad_ptr(int g) {
  const size_t gi = static_cast<size_t>(g);
  if (off) {
    if (h_acc) return static_cast<const unsigned char*>(h_acc.data()) + static_cast<size_t>(owned_off[gi]) * 4;
    return static_cast<const unsigned char*>(h_land.data()) + static_cast<size_t>(owned_off[gi]) * esize();
  }
  if (o.stage >= 2) return at(grad_acc, owned_off[gi], size_of(grad_acc_type));
  return at(grad_full[gi], owned_begin[gi], esize());
}

// AdamW on this rank's owned range of group g, writing the fp32 master (or the fp32 working
// parameters) and the working copy: in place on the device, or with offload into h_out (the
// host shard itself for an offloaded parameter shard). `ahead` (speculative host step): from
// the current bank into the other one, and the working copy always into h_out, so that nothing
// a later use reads changes before the boundary knows the step is applied (it then flips the
// group's bank and, for an offloaded shard, copies h_out into it).
void Engine::State::adam_group(int g, const optim::AdamStep& as, const optim::AdamParams& base, bool ahead) {
  const size_t gi = static_cast<size_t>(g);
  optim::AdamParams hp = base;
  float* const p_in = state(g, 0);
  float* const m_in = state(g, 1);
  float* const v_in = state(g, 2);
  float* const p_out = state(g, 0, ahead);
  float* const m_out = state(g, 1, ahead);
  float* const v_out = state(g, 2, ahead);
  for (const Partition::Piece& pc : owned_pieces(g)) {
    const bool decays = o.weight_decay_all || model.params[static_cast<size_t>(pc.param)].weight_decay;
    hp.weight_decay = decays ? base.weight_decay : 0.0f;
    const int64_t off_e = owned_off[gi] + pc.shard_offset;
    const size_t k = static_cast<size_t>(pc.shard_offset);
    unsigned char* working;
    if (!off)
      working = at(work[gi], work_owned_begin(g) + pc.shard_offset, esize());
    else if (off_param && !whole[gi] && !ahead)
      working = static_cast<unsigned char*>(h_shard[gi].data()) + k * esize();
    else
      working = static_cast<unsigned char*>(h_out.data()) + static_cast<size_t>(off_e) * esize();
    float* p = p_in ? p_in + k : reinterpret_cast<float*>(working);
    float* po = p_out ? p_out + k : p;
    const bool copy16 = p_in && dtype != DType::f32;
    if (!off) {  // device-resident state: in place, on the compute stream
      kern->adam(hp, as, p, m_in + k, v_in + k, grad_ptr(g) + k * size_of(grad_type()), grad_type(),
                 static_cast<size_t>(pc.count), copy16 ? working : nullptr, dtype);
      continue;
    }
    adam->step_into(hp, as, p, m_in + k, v_in + k, po, m_out + k, v_out + k,
                    grad_ptr(g) + k * size_of(grad_type()), grad_type(),
                    static_cast<size_t>(pc.count), copy16 ? working : nullptr, dtype);
    if (p_in && dtype == DType::f32)  // offload with fp32 parameters: the copy going up
      std::memcpy(working, po, static_cast<size_t>(pc.count) * 4);
  }
}

// Stage 0/1 with a 16-bit gradient and accumulation: group g's gradient of this micro-batch is
// complete (its Unit's backward is enqueued; the tied embedding's other part came earlier).
// Add it to the fp32 sum and clear it; after the last micro-batch put the sum, rounded once,
// back for the reduction (started after the compute stream's point past all this). Enqueued on
// the compute stream, after the Unit's backward.
void Engine::State::fold_group(int g, bool last) {
  const size_t gi = static_cast<size_t>(g);
  Tensor& full = grad_full[gi];
  if (!full || full.numel() == 0) return;  // a group without parameters
  float* sum = grad_sum01[gi].data_as<float>();
  const size_t n = static_cast<size_t>(full.numel());
  kern->accumulate(sum, full.data(), dtype, n);
  if (last) {
    kern->convert(sum, DType::f32, full.data(), dtype, n);
    dev.fill_async(sum, 0, n * 4, compute);
  } else {
    dev.fill_async(full.data(), 0, full.bytes(), compute);
  }
}

double Engine::State::micro_batch(const Batch& batch, float seed_scale, int mb) {
  const size_t U = model.units.size();
  const bool last = mb + 1 == o.gradient_accumulation_steps;
  const size_t base = static_cast<size_t>(mb) * 2 * U;  // stage 3: this micro-batch in trace
  std::vector<UnitContext> ctx(U);
  Tensor prev;
  double t0 = now_seconds();
  phase::set("forward");
  for (size_t u = 0; u < U; ++u) {
    UnitContext& c = ctx[u];
    use(static_cast<int>(u));
    if (o.stage == 3) prefetch(base + u + 1);
    c.batch = &batch;
    c.input = prev;
    c.checkpoint = checkpoint[u];
    c.params = views(static_cast<int>(u), false);
    model.units[u]->forward(c);
    c.params.clear();
    prev = c.output;
    // Stage 3 frees the gathered parameters here (after the stream has passed the Unit); else
    // the host waits only for the Unit before this one (unit_fence).
    if (o.stage == 3) release_after(base + u); else unit_fence();
  }
  // The loss (fp32, or fp64 with fp64 activations) to the host; the synchronize also reports a
  // bad token or target found by this micro-batch's ops.
  double loss64 = 0;
  float loss32 = 0;
  const bool f64 = ctx.back().loss.type() == ScalarType::f64;
  copy_to_host(dev, compute, f64 ? static_cast<void*>(&loss64) : static_cast<void*>(&loss32), ctx.back().loss);
  compute.synchronize();
  const double loss = f64 ? loss64 : loss32;
  double t1 = now_seconds();
  fwd_time += t1 - t0;

  Tensor dprev;
  phase::set("backward and gradient reduction");
  for (size_t u = U; u-- > 0;) {
    const size_t pos = base + U + (U - 1 - u);
    UnitContext& c = ctx[u];
    if (o.stage == 3) {
      use(static_cast<int>(u));
      prefetch(pos + 1);
    }
    c.params = views(static_cast<int>(u), false);
    c.grads = views(static_cast<int>(u), true);
    c.grad_output = dprev;
    c.grad_scale = seed_scale;
    model.units[u]->backward(c);
    dprev = c.grad_input;
    c = UnitContext();
    if (o.stage >= 2) reduce_group_stage2(static_cast<int>(u), last);  // group u is complete now
    if (!grad_sum01.empty()) fold_group(static_cast<int>(u), last);
    if (o.stage <= 1 && last && o.overlap_comm) start_reduce_full(static_cast<int>(u));
    if (o.stage == 3) {
      if (last && u == 0) release_all(); else release_after(pos);
    } else {
      unit_fence();
    }
  }
  while (!pending.empty()) finish_oldest_reduce();
  bwd_time += now_seconds() - t1;
  return loss;
}

StepStats Engine::State::boundary(double loss) {
  const int G = part.group_count();
  // Stage 0/1: the reductions started during the last backward (or, without overlap_comm, now).
  // With offload (stage 1) each reduced shard comes down as soon as its reduction is waited for.
  for (int g = 0; g < G && o.stage <= 1; ++g) {
    coll::Work& w = reducing[static_cast<size_t>(g)];
    if (!w.event() && !o.overlap_comm) start_reduce_full(g);
    wait_comm(w);
    if (off) land(g, at(grad_full[static_cast<size_t>(g)], owned_begin[static_cast<size_t>(g)], esize()), true);
  }

  // Global norm: each rank's owned range (stage 0: all of it, identical on every rank, so no
  // communication; otherwise the shards partition the gradient and one all-reduce sums them).
  // Summed in group order either way (with offload the host thread took each group's part).
  double local = 0;
  if (off) {
    // Every group landed its final shard (a group without parameters never lands: its partial
    // stays 0); the AdamW run ahead after the last one goes on during the all-reduce.
    wait_worker(*norms_done);
    for (int g = 0; g < G; ++g) local += partial[static_cast<size_t>(g)];
  } else {
    // Each group's squared norm on the compute stream (after the accumulation that made the
    // gradient), the G results to the host in one copy.
    float* dn = norms.data_as<float>();
    for (int g = 0; g < G; ++g)
      kern->squared_norm(grad_ptr(g), grad_type(), static_cast<size_t>(owned_len(g)), dn + g);
    std::vector<float> per_group(static_cast<size_t>(G));
    copy_now(per_group.data(), dn, per_group.size() * sizeof(float));
    for (float x : per_group) local += x;
  }
  optim::GlobalNorm norm;
  if (o.stage == 0) {
    norm.squared = static_cast<float>(local);
    norm.norm = std::sqrt(norm.squared);
    norm.finite = std::isfinite(norm.squared);
  } else {
    norm = global_norm(static_cast<float>(local));
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
  st.lr = o.lr(applied + 1);  // the step about to be applied
  st.loss_scale = sc.loss_scale;
  st.next_loss_scale = scaler ? scaler->scale() : 1.0;
  st.applied = sc.apply;
  guess_next = sc.apply && sc.clip_coef == 1.0f;

  optim::AdamParams hp;
  const optim::AdamStep as = adam_step(applied + 1, sc.grad_scale, hp);
  // The AdamW run ahead is this step exactly when every input of it is the same bits.
  const bool keep = speculating && sc.apply && same_step(as, hp, spec_as, spec_hp);
  if (speculating) {
    st.speculation = keep ? StepStats::Speculation::kept : StepStats::Speculation::dropped;
    if (!keep) {  // its results are in the other bank, never read: wait for it and go on
      const double t0 = now_seconds();
      sync_host_threads();
      adam_waited += now_seconds() - t0;
    }
    speculating = false;
  }
  if (sc.apply) {
    ++applied;
    // The order groups finish AdamW in: with the step kept, those that ran ahead (landing order),
    // then the rest; else group order.
    std::vector<int> order = keep ? spec_order : std::vector<int>{};
    std::vector<bool> ahead(static_cast<size_t>(G), false);
    for (int g : order) ahead[static_cast<size_t>(g)] = true;
    for (int g = 0; g < G; ++g)
      if (!ahead[static_cast<size_t>(g)]) order.push_back(g);
    if (off) {
      // The host thread runs AdamW group by group; each group's updated working copy goes up as
      // soon as its AdamW is done, then (whole groups) its all-gather starts, while the host
      // thread works on the next groups.
      for (int g : order) {
        if (ahead[static_cast<size_t>(g)]) continue;
        optimizer->launch_host([this, g, as, hp] { timed_adam(g, as, hp, false); });
        optimizer->record(*adam_done[static_cast<size_t>(g)]);
      }
    }
    for (int g : order) {
      const size_t gi = static_cast<size_t>(g);
      if (!off) {
        adam_group(g, as, hp);
      } else {
        wait_worker(*adam_done[gi]);
        if (ahead[gi]) {  // keep it: the other bank is now the state
          bank[gi] ^= 1;
          if (off_param && !whole[gi])  // the shard's new working copy, from where it was written
            std::memcpy(h_shard[gi].data(), static_cast<unsigned char*>(h_out.data()) + static_cast<size_t>(owned_off[gi]) * esize(),
                        static_cast<size_t>(owned_len(g)) * esize());
        }
        if (!(off_param && !whole[gi])) {
          const size_t bytes = static_cast<size_t>(owned_len(g)) * esize();
          const double t0 = now_seconds();
          copies->to_device(at(work[gi], work_owned_begin(g), esize()), h_out,
                            static_cast<size_t>(owned_off[gi]) * esize(), bytes).wait();
          h2d_time += now_seconds() - t0;
        }
      }
      // Every rank updated its shard of a whole group's working parameters: gather them in
      // place, now, while AdamW goes on with the next groups; the next forward waits for it
      // (use()).
      // (Without offload AdamW wrote the shard on the compute stream: start after it.)
      if (o.stage >= 1 && whole[gi]) {
        const Partition::Group& grp = part.group(g);
        gathering[gi] = post([&](Event* after) {
          return comm.all_gather(at(work[gi], owned_begin[gi], esize()), work[gi].data(),
                                 static_cast<size_t>(grp.shard_numel), dtype, after);
        }, off ? nullptr : compute_point());
        if (!o.overlap_comm) wait_comm(gathering[gi]);
      }
    }
  }
  // Fresh gradients for the next step.
  // (On the compute stream: after AdamW read them; a stage 0/1 reduction in place was waited for.)
  for (Tensor& t : grad_full)
    if (t) dev.fill_async(t.data(), 0, t.bytes(), compute);
  if (grad_acc) dev.fill_async(grad_acc.data(), 0, grad_acc.bytes(), compute);
  if (h_acc) std::memset(h_acc.data(), 0, h_acc.bytes());
  if (o.stage == 3) prefetch(0);  // the next step's first groups, from the updated shards
  return st;
}

StepStats Engine::step(const std::function<Batch(int micro)>& next) {
  State& s = *s_;
  const float seed = s.scaler ? static_cast<float>(s.scaler->scale()) : 1.0f;
  try {
    s.fwd_time = s.bwd_time = s.exposed = 0;
    s.d2h_time = s.h2d_time = s.adam_waited = 0;
    s.adam_ns = 0;
    double loss = 0;
    s.speculating = false;
    s.spec_order.clear();
    for (int mb = 0; mb < s.o.gradient_accumulation_steps; ++mb) {
      phase::set("loading a micro-batch");
      const Batch batch = next(mb);
      if (mb + 1 == s.o.gradient_accumulation_steps) s.plan_speculation();
      loss += s.micro_batch(batch, seed, mb);
    }
    const double t0 = State::now_seconds();
    phase::set("optimizer step (gradient norm, AdamW, parameter all-gather)");
    StepStats st = s.boundary(loss / s.o.gradient_accumulation_steps);
    if (s.o.timers) {
      st.time.forward = s.fwd_time;
      st.time.backward = s.bwd_time;
      st.time.optimizer = State::now_seconds() - t0;
      st.time.comm_exposed = s.exposed;
      st.time.d2h = s.d2h_time;
      st.time.h2d = s.h2d_time;
      st.time.host_adam = static_cast<double>(s.adam_ns.load()) * 1e-9;  // boundary synced it
      st.time.host_adam_waited = s.adam_waited;
      const int64_t busy = s.comm_busy_ns.load();
      st.time.comm_busy = static_cast<double>(busy - s.comm_busy_reported_ns) * 1e-9;
      s.comm_busy_reported_ns = busy;
    }
    return st;
  } catch (...) {
    s.quiesce();  // nothing in flight may outlive the buffers the unwinding frees
    throw;
  }
}

std::vector<float> Engine::parameter(int p) {
  State& s = *s_;
  const Partition::Location& loc = s.part.location(p);
  const size_t g = static_cast<size_t>(loc.group);
  // The step-end all-gather of a whole group writes work[g] (this rank's range included, in
  // place): let it land first.
  s.gathering[g].wait();
  if (s.off) s.sync_host_threads();
  s.compute.synchronize();  // AdamW of a device-resident shard runs on the compute stream
  std::vector<float> out(static_cast<size_t>(loc.numel), 0.0f);
  for (const Partition::Piece& pc : s.owned_pieces(loc.group)) {
    if (pc.param != p) continue;
    const size_t bytes = static_cast<size_t>(pc.count) * 4;
    if (float* master = s.state(loc.group, 0)) {
      s.copy_state(out.data() + pc.param_offset, master + pc.shard_offset, bytes);
    } else {  // fp32 without offload: the working parameters (device) are the master
      s.copy_now(out.data() + pc.param_offset, s.at(s.work[g], s.work_owned_begin(loc.group) + pc.shard_offset, 4), bytes);
    }
  }
  // Each element is owned by exactly one rank; the others hold 0 there, so the sum is the
  // value (a -0.0 reads back as +0.0). Stage 0: every rank owns everything already.
  if (s.o.stage != 0 && s.world > 1) {
    if (s.comm.kind() == DeviceKind::cpu) {
      s.comm.all_reduce(out.data(), out.data(), out.size(), DType::f32, coll::ReduceOp::sum).wait();
    } else {  // NCCL takes device buffers
      Tensor t = Tensor::empty(s.dev, Shape{static_cast<int64_t>(out.size())}, ScalarType::f32, MemCategory::other);
      s.copy_now(t.data(), out.data(), out.size() * 4);
      s.comm.all_reduce(t.data(), t.data(), out.size(), DType::f32, coll::ReduceOp::sum, s.compute_point()).wait();
      s.copy_now(out.data(), t.data(), out.size() * 4);
    }
  }
  return out;
}

Engine::ModelStateBytes Engine::State::device_state() const {
  const size_t psi = static_cast<size_t>(part.padded_numel_total());
  const size_t shard = static_cast<size_t>(part.shard_numel_total());
  const size_t e = size_of(dtype);
  const size_t owned = o.stage == 0 ? psi : shard;
  ModelStateBytes b;
  for (int g = 0; g < part.group_count(); ++g) {
    const Partition::Group& grp = part.group(g);
    const bool w = whole[static_cast<size_t>(g)];
    if (!w && off_param) continue;  // on the host
    b.parameters += e * static_cast<size_t>(w ? grp.padded_numel : grp.shard_numel);
  }
  if (o.stage <= 1)
    b.gradients = e * psi + (fp32_full_sum() ? 4 * psi : 0);  // + the fp32 sum, see above
  else if (!off)
    b.gradients = (o.gradient_accumulation_steps > 1 ? 4 : e) * shard;
  if (!off) {
    b.master = dtype == DType::f32 ? 0 : 4 * owned;
    b.optimizer = 8 * owned;
  }
  return b;
}

Engine::ModelStateBytes Engine::State::host_state(bool second_bank) const {
  ModelStateBytes b;
  if (!off) return b;
  const size_t owned = static_cast<size_t>(owned_total);
  const size_t e = size_of(dtype);
  b.parameters = e * owned;
  for (int g = 0; g < part.group_count() && off_param; ++g)
    if (!whole[static_cast<size_t>(g)]) b.parameters += e * static_cast<size_t>(part.group(g).shard_numel);
  b.gradients = e * owned + (host_fp32_acc() ? 4 * owned : 0);
  const size_t banks = second_bank ? 2 : 1;  // the speculative step's second copy
  b.master = 4 * owned * banks;
  b.optimizer = 8 * owned * banks;
  return b;
}

namespace {

std::string state_text(const Engine::ModelStateBytes& b) {
  return format_bytes(b.total()) + " (parameters " + format_bytes(b.parameters) + ", gradients " +
         format_bytes(b.gradients) + ", master weights " + format_bytes(b.master) +
         ", optimizer states " + format_bytes(b.optimizer) + ")";
}

}  // namespace

// A model whose state cannot fit is refused here, before its first byte is allocated: filling
// memory up to the limit first would take time and, where the limit is the machine's, push
// other processes out. Activations and transient buffers come on top, so passing this check is
// necessary, not sufficient; the ledger still refuses any allocation past a capacity.
void Engine::State::check_fits() const {
  const MemoryLedger& ledger = dev.ledger();
  const ModelStateBytes d = device_state(), h = host_state(false);
  const size_t dcap = ledger.capacity(MemSpace::device), hcap = ledger.capacity(MemSpace::host);
  const size_t shared = ledger.shared_capacity();
  const size_t dnow = ledger.current(MemSpace::device), hnow = ledger.current(MemSpace::host);
  auto over = [](size_t now, size_t need, size_t cap) { return need > cap || now > cap - need; };
  std::string what, hint;
  if (over(dnow, d.total(), dcap)) {
    what = "out of device memory on " + dev.name() + ": the model state needs " + state_text(d) +
           " per rank, and " + format_bytes(dcap - std::min(dcap, dnow)) + " of the device's " +
           format_bytes(dcap) + " are free";
    hint = "use a higher ZeRO stage, more ranks, offload (offload_optimizer, offload_param), or a "
           "larger zero_train.device_memory_limit";
  } else if (over(hnow, h.total(), hcap)) {
    what = "out of host memory on " + dev.name() + ": the offloaded model state needs " +
           state_text(h) + " per rank, and " + format_bytes(hcap - std::min(hcap, hnow)) +
           " of the host memory limit " + format_bytes(hcap) + " are free";
    hint = "use more ranks (on more nodes), a smaller model, or a larger "
           "zero_train.host_memory_limit if the host really has the memory";
  } else if (shared != kUnlimited && over(dnow + hnow, d.total() + h.total(), shared)) {
    what = "out of memory on " + dev.name() + ": the model state needs " + state_text(d) +
           " of device memory" + (h.total() ? " and " + state_text(h) + " of host memory" : "") +
           " per rank, and " + format_bytes(shared - std::min(shared, dnow + hnow)) + " of the " +
           format_bytes(shared) + " that device and host memory share here are free";
    hint = "on this device, device and host memory are the same RAM, so offloading makes no room: "
           "use a higher ZeRO stage, more ranks on more nodes, a smaller model, or give the job "
           "more memory (the container's or the batch system's memory limit)";
  }
  if (what.empty()) return;
  throw OutOfMemory(what + " (checked before allocating any of it)\nHINT: " + hint + ".",
                    ledger.snapshot());
}

Engine::ModelStateBytes Engine::expected_model_state() const { return s_->device_state(); }

Engine::ModelStateBytes Engine::expected_host_state() const { return s_->host_state(s_->spec); }

offload::CopyCounters Engine::offload_traffic() const {
  return s_->copies ? s_->copies->counters() : offload::CopyCounters{};
}

// The pools hold, per size class s (groups of padded size s, `count` of them), as many buffers
// as were ever in use at once:
//   gradients (stage 2/3): the groups being added to (at most two: the Unit's own and the tied
//     embedding's, held from the head's backward to the embedding's) plus those in reduction
//     (total at most max(reduce_bucket_size, s) elements, so at most max(1, bucket / s) of s);
//   parameters (stage 3): at most max_live_parameters elements gathered ahead, plus the current
//     Unit's groups (gathered even past the bound).
size_t Engine::transient_bound() const {
  const State& s = *s_;
  std::map<int64_t, int64_t> count;
  int64_t unit_max = 0;
  for (int g = 0; g < s.part.group_count(); ++g) ++count[s.part.group(g).padded_numel];
  for (int u = 0; u < static_cast<int>(s.model.units.size()); ++u) {
    int64_t n = 0;
    for (int g : s.part.unit_groups(u)) n += s.part.group(g).padded_numel;
    unit_max = std::max(unit_max, n);
  }
  size_t bytes = 0;
  for (const auto& [size, n] : count) {
    if (s.o.stage >= 2) {
      const int64_t in_use = 2 + std::max<int64_t>(1, s.o.reduce_bucket_size / size);
      bytes += static_cast<size_t>(size * std::min(n, in_use)) * s.esize();
    }
    if (s.o.stage == 3) {
      const int64_t in_use = (std::min(s.o.max_live_parameters, int64_t{1} << 50) + unit_max) / size;
      bytes += static_cast<size_t>(size * std::min(n, in_use)) * s.esize();
    }
  }
  return bytes;
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
  char line[400];
  std::snprintf(line, sizeof line,
                "model state per rank: expected %s = %.2f bytes/parameter (params %s, grads %s, "
                "master %s, adam %s)\n",
                format_bytes(b.total()).c_str(), static_cast<double>(b.total()) / psi,
                format_bytes(b.parameters).c_str(), format_bytes(b.gradients).c_str(),
                format_bytes(b.master).c_str(), format_bytes(b.optimizer).c_str());
  out += line;
  if (s.off) {
    const ModelStateBytes h = expected_host_state();
    std::snprintf(line, sizeof line,
                  "offloaded to host memory: %s (params %s, grads %s, master %s, adam %s); %s\n",
                  format_bytes(h.total()).c_str(), format_bytes(h.parameters).c_str(),
                  format_bytes(h.gradients).c_str(), format_bytes(h.master).c_str(),
                  format_bytes(h.optimizer).c_str(), s.host->summary().c_str());
    out += line;
  }
  return out + snap.table();
}

// ---- checkpoints ----------------------------------------------------------------------------------

namespace {

constexpr const char* kArrays[3] = {"master", "exp_avg", "exp_avg_sq"};

// Agrees on failure across ranks: every rank learns whether any failed and the highest failing
// rank. A rank that failed rethrows its own error; the others throw one naming that rank.
void agree(coll::Communicator& comm, const std::string& what, const std::string& error) {
  float failed = error.empty() ? -1.0f : static_cast<float>(comm.rank());
  comm.all_reduce(&failed, &failed, 1, DType::f32, coll::ReduceOp::max).wait();
  if (!error.empty()) ZERO_FAIL(error);
  if (failed >= 0)
    ZERO_FAIL(what + ": rank " + std::to_string(static_cast<int>(failed)) +
              " failed (its error is reported there); nothing was changed here");
}

}  // namespace

void Engine::save_checkpoint(const std::string& dir, const std::string& tag,
                             coll::Communicator& host_comm, const std::string& user_metadata) {
  State& s = *s_;
  ZERO_REQUIRE(host_comm.kind() == DeviceKind::cpu && host_comm.size() == s.world,
               "save_checkpoint: host_comm must be a cpu communicator over the engine's " +
                   std::to_string(s.world) + " ranks");
  // Nothing in flight may write what is read: the step-end all-gathers (in place over the
  // owned range) and the host threads.
  for (coll::Work& w : s.gathering) w.wait();
  if (s.off) s.sync_host_threads();
  s.compute.synchronize();

  const EnginePieces ep = s.checkpoint_pieces(true);
  std::vector<std::vector<float>> data(3, std::vector<float>(static_cast<size_t>(ep.total)));
  int64_t k = 0;
  for (const auto& [g, pc] : ep.where) {
    for (int a = 0; a < 3; ++a) {
      float* dst = data[static_cast<size_t>(a)].data() + k;
      const size_t bytes = static_cast<size_t>(pc.count) * 4;
      if (const float* src = s.state(g, a)) {
        s.copy_state(dst, src + pc.shard_offset, bytes);
      } else {  // fp32 without offload: the working parameters (device) are the master
        s.copy_now(dst, s.at(s.work[static_cast<size_t>(g)], s.work_owned_begin(g) + pc.shard_offset, 4), bytes);
      }
    }
    k += pc.count;
  }
  // A checkpoint holds only finite state: one saved after the run diverged would replace the
  // last good one as `latest` and could only resume into NaN. Refused on every rank, before
  // anything is written.
  std::string nonfinite;
  for (int a = 0; a < 3 && nonfinite.empty(); ++a) {
    const int64_t bad = checkpoint::first_non_finite(data[static_cast<size_t>(a)]);
    if (bad < 0) continue;
    const std::vector<checkpoint::Piece>& pieces = ep.pieces;
    int64_t start = 0;
    size_t p = 0;
    while (p + 1 < pieces.size() && start + pieces[p].count <= bad) start += pieces[p++].count;
    nonfinite = "save_checkpoint " + dir + "/" + tag + ": the model state is not finite (" +
                kArrays[a] + " of parameter " + s.model.params[static_cast<size_t>(pieces[p].param)].name +
                ", element " + std::to_string(pieces[p].offset + (bad - start)) +
                ", is " + std::to_string(data[static_cast<size_t>(a)][static_cast<size_t>(bad)]) +
                "): not saved, so the checkpoints already in " + dir + " stay as they are";
  }
  agree(host_comm, "save_checkpoint " + dir + "/" + tag, nonfinite);
  nlohmann::json meta;
  nlohmann::json engine = {{"steps", s.steps},
                           {"applied_steps", s.applied},
                           {"stage", s.o.stage},
                           {"world_size", s.world},
                           {"param_type", to_string(s.dtype)},
                           {"loss_scaler", nullptr}};
  if (s.scaler) {
    const optim::LossScalerState ls = s.scaler->state();
    engine["loss_scaler"] = {{"scale", ls.scale},
                             {"cur_iter", ls.cur_iter},
                             {"last_overflow_iter", ls.last_overflow_iter},
                             {"cur_hysteresis", ls.cur_hysteresis},
                             {"skipped_steps", ls.skipped_steps}};
  }
  meta["engine"] = std::move(engine);
  std::string user_error;
  try {
    meta["user"] = nlohmann::json::parse(user_metadata);
  } catch (const std::exception& e) {
    user_error = std::string("save_checkpoint: user_metadata is not JSON: ") + e.what();
  }
  agree(host_comm, "save_checkpoint", user_error);
  const std::string text = meta.dump();

  const std::vector<checkpoint::ParamInfo> table = checkpoint::param_table(s.model);
  const std::vector<checkpoint::ConstArray> arrays = {{kArrays[0], data[0].data()},
                                                      {kArrays[1], data[1].data()},
                                                      {kArrays[2], data[2].data()}};
  checkpoint::SaveRequest req;
  req.params = table;
  req.pieces = ep.pieces;
  req.arrays = arrays;
  req.metadata = text;
  checkpoint::save(dir, tag, host_comm, req);
}

uint64_t Engine::checkpoint_bytes() const {
  const State& s = *s_;
  const EnginePieces ep = s.checkpoint_pieces(true);
  const std::vector<checkpoint::ParamInfo> table = checkpoint::param_table(s.model);
  // Names only: save_bytes reads no data. The metadata is bounded by a generous stand-in (the
  // engine's counters, the loss scaler and a caller's few keys are a few hundred bytes).
  const std::vector<checkpoint::ConstArray> arrays = {{kArrays[0], nullptr}, {kArrays[1], nullptr},
                                                      {kArrays[2], nullptr}};
  const std::string metadata(4096, ' ');
  checkpoint::SaveRequest req;
  req.params = table;
  req.pieces = ep.pieces;
  req.arrays = arrays;
  req.metadata = metadata;
  return checkpoint::save_bytes(req, s.rank);
}

std::string Engine::load_checkpoint(const std::string& dir, const std::string& tag,
                                    coll::Communicator& host_comm) {
  State& s = *s_;
  ZERO_REQUIRE(host_comm.kind() == DeviceKind::cpu && host_comm.size() == s.world,
               "load_checkpoint: host_comm must be a cpu communicator over the engine's " +
                   std::to_string(s.world) + " ranks");
  const EnginePieces ep = s.checkpoint_pieces(false);
  std::vector<std::vector<float>> data(3, std::vector<float>(static_cast<size_t>(ep.total)));
  const std::vector<checkpoint::ParamInfo> table = checkpoint::param_table(s.model);
  const std::vector<checkpoint::Array> arrays = {{kArrays[0], data[0].data()},
                                                 {kArrays[1], data[1].data()},
                                                 {kArrays[2], data[2].data()}};
  nlohmann::json meta;
  std::string error;
  int64_t steps = 0, applied = 0;
  std::optional<optim::LossScalerState> scaler_state;
  try {
    checkpoint::LoadRequest req;
    req.params = table;
    req.pieces = ep.pieces;
    req.arrays = arrays;
    req.require_finite = true;  // NaN weights or moments would only train NaN
    const checkpoint::LoadResult r = checkpoint::load(dir, tag, req);
    meta = nlohmann::json::parse(r.metadata);
    const nlohmann::json& e = meta.at("engine");
    steps = e.at("steps").get<int64_t>();
    applied = e.at("applied_steps").get<int64_t>();
    if (e.contains("loss_scaler") && e["loss_scaler"].is_object()) {
      const nlohmann::json& l = e["loss_scaler"];
      optim::LossScalerState ls;
      ls.scale = l.at("scale").get<double>();
      ls.cur_iter = l.at("cur_iter").get<int64_t>();
      ls.last_overflow_iter = l.at("last_overflow_iter").get<int64_t>();
      ls.cur_hysteresis = l.at("cur_hysteresis").get<int>();
      ls.skipped_steps = l.at("skipped_steps").get<int64_t>();
      scaler_state = ls;
    }
  } catch (const Error& e) {
    error = e.message();
  } catch (const std::exception& e) {
    error = "checkpoint " + dir + "/" + tag + ": its metadata has no engine counters (" + e.what() +
            "): it was not written by Engine::save_checkpoint";
  }
  agree(host_comm, "load_checkpoint " + dir + "/" + tag, error);

  s.install(ep, data[0].data(), data[1].data(), data[2].data());
  s.steps = steps;
  s.applied = applied;
  if (s.scaler && scaler_state) s.scaler->restore(*scaler_state);
  return meta.contains("user") ? meta["user"].dump() : "{}";
}

// Writes new state for this rank's pieces (master; m and v, or zeros when null), the working
// copies from the master, and gathers the whole groups. Nothing may fail here but communication.
void Engine::State::install(const EnginePieces& ep, const float* master_vals, const float* m_vals,
                            const float* v_vals) {
  for (coll::Work& w : gathering) w.wait();
  if (off) sync_host_threads();
  if (o.stage == 3) release_all();  // gathered copies of the old shards
  compute.synchronize();
  std::fill(bank.begin(), bank.end(), 0);
  int64_t k = 0;
  for (const auto& [g, pc] : ep.where) {
    const size_t gi = static_cast<size_t>(g);
    const size_t n = static_cast<size_t>(pc.count);
    const float* src[3] = {master_vals + k, m_vals ? m_vals + k : nullptr, v_vals ? v_vals + k : nullptr};
    for (int a = 0; a < 3; ++a)
      if (float* dst = state(g, a)) {
        if (src[a]) {
          copy_state(dst + pc.shard_offset, src[a], n * 4);
        } else if (off) {
          std::memset(dst + pc.shard_offset, 0, n * 4);
        } else {
          dev.fill_async(dst + pc.shard_offset, 0, n * 4, compute);
          compute.synchronize();
        }
      }
    // The working copy: the master rounded to the parameter type, where this rank keeps it.
    unsigned char* working =
        whole[gi] ? at(work[gi], work_owned_begin(g) + pc.shard_offset, esize())
                  : static_cast<unsigned char*>(shard_data(g)) + static_cast<size_t>(pc.shard_offset) * esize();
    upload_as(working, dtype, master_vals + k, pc.count, !whole[gi] && off_param);
    k += pc.count;
  }
  // Whole groups: every rank wrote its shard; gather them (stage 0: every rank wrote all).
  for (int g = 0; g < part.group_count() && o.stage >= 1; ++g) {
    const size_t gi = static_cast<size_t>(g);
    if (!whole[gi]) continue;
    comm.all_gather(at(work[gi], owned_begin[gi], esize()), work[gi].data(),
                    static_cast<size_t>(part.group(g).shard_numel), dtype).wait();
  }
  guess_next = true;
  if (o.stage == 3) prefetch(0);
}

void Engine::set_parameters(const std::vector<std::vector<float>>& values) {
  State& s = *s_;
  ZERO_REQUIRE(values.size() == s.model.params.size(),
               "set_parameters: " + std::to_string(values.size()) + " arrays for a model of " +
                   std::to_string(s.model.params.size()) + " parameters");
  for (size_t p = 0; p < values.size(); ++p)
    ZERO_REQUIRE(static_cast<int64_t>(values[p].size()) == s.part.location(static_cast<int>(p)).numel,
                 "set_parameters: parameter " + s.model.params[p].name + " has " +
                     std::to_string(s.part.location(static_cast<int>(p)).numel) + " elements, got " +
                     std::to_string(values[p].size()));
  const EnginePieces ep = s.checkpoint_pieces(false);
  std::vector<float> master(static_cast<size_t>(ep.total));
  int64_t k = 0;
  for (const auto& [g, pc] : ep.where) {
    std::memcpy(master.data() + k, values[static_cast<size_t>(pc.param)].data() + pc.param_offset,
                static_cast<size_t>(pc.count) * 4);
    k += pc.count;
  }
  s.install(ep, master.data(), nullptr, nullptr);
}

double Engine::evaluate(const Batch& batch, std::vector<int32_t>* argmax) {
  State& s = *s_;
  try {
    const size_t U = s.model.units.size();
    std::vector<UnitContext> ctx(U);
    Tensor prev;
    if (s.o.stage == 3) s.release_all();  // gathered on demand below, one Unit at a time
    for (size_t u = 0; u < U; ++u) {
      UnitContext& c = ctx[u];
      s.use(static_cast<int>(u));
      c.batch = &batch;
      c.input = prev;
      c.checkpoint = true;  // keep no activations for a backward that never comes
      c.params = s.views(static_cast<int>(u), false);
      s.model.units[u]->forward(c);
      c.params.clear();
      prev = c.output;
      if (s.o.stage == 3) s.release_all(); else s.compute_point()->synchronize();
    }
    double loss64 = 0;
    float loss32 = 0;
    const bool f64 = ctx.back().loss.type() == ScalarType::f64;
    copy_to_host(s.dev, s.compute, f64 ? static_cast<void*>(&loss64) : static_cast<void*>(&loss32), ctx.back().loss);
    s.compute.synchronize();
    if (argmax) {
      const Tensor& out = ctx.back().output;
      const std::optional<DType> lt = out ? to_dtype(out.type()) : std::nullopt;
      ZERO_REQUIRE(out && out.shape().rank() >= 1 && (out.type() == ScalarType::f64 || lt),
                   "evaluate: the model's last Unit gives no floating-point logits to take the argmax of");
      const int64_t V = out.shape()[out.shape().rank() - 1];
      const int64_t rows = out.numel() / V;
      std::vector<double> logits(static_cast<size_t>(out.numel()));
      if (out.type() == ScalarType::f64) {
        copy_to_host(s.dev, s.compute, logits.data(), out);
        s.compute.synchronize();
      } else {  // fp32, or the 16-bit logits of a GPU run, widened exactly
        std::vector<unsigned char> raw(static_cast<size_t>(out.numel()) * size_of(*lt));
        copy_to_host(s.dev, s.compute, raw.data(), out);
        s.compute.synchronize();
        std::vector<float> f(logits.size());
        convert(raw.data(), *lt, f.data(), DType::f32, f.size());
        std::copy(f.begin(), f.end(), logits.begin());
      }
      argmax->assign(static_cast<size_t>(rows), 0);
      for (int64_t r = 0; r < rows; ++r) {
        const double* row = logits.data() + r * V;
        (*argmax)[static_cast<size_t>(r)] = static_cast<int32_t>(std::max_element(row, row + V) - row);
      }
    }
    if (s.o.stage == 3) s.prefetch(0);  // the next step's first groups again
    return f64 ? loss64 : loss32;
  } catch (...) {
    s.quiesce();
    throw;
  }
}

EnginePieces Engine::State::checkpoint_pieces(bool saving) const {
  const State& s = *this;
  EnginePieces ep;
  if (saving && s.o.stage == 0 && s.rank != 0) return ep;
  for (int g = 0; g < s.part.group_count(); ++g)
    for (const Partition::Piece& pc : s.owned_pieces(g)) {
      if (pc.count <= 0) continue;
      ep.pieces.push_back({pc.param, pc.param_offset, pc.count});
      ep.where.emplace_back(g, pc);
      ep.total += pc.count;
    }
  return ep;
}

}  // namespace zero
