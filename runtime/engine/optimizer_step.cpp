#include "runtime/engine/optimizer_step.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

namespace zero::engine {

namespace {

// Bitwise equality of two AdamW steps' inputs (floats compared as bits: -0 != +0, NaN == NaN).
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_step(const optim::AdamStep& a, const optim::AdamParams& ha, const optim::AdamStep& b,
               const optim::AdamParams& hb) {
  return a.step == b.step && same_bits(a.lr, b.lr) && same_bits(a.grad_scale, b.grad_scale) &&
         same_bits(ha.beta1, hb.beta1) && same_bits(ha.beta2, hb.beta2) &&
         same_bits(ha.eps, hb.eps) && same_bits(ha.weight_decay, hb.weight_decay) &&
         ha.adam_w_mode == hb.adam_w_mode && ha.bias_correction == hb.bias_correction;
}

}  // namespace

OptimizerStep::OptimizerStep(Context& x, ParamResidency& params, GradReduction& grads, HostOffload* host)
    : x_(x), params_(params), grads_(grads), host_(host) {}

void OptimizerStep::allocate(bool speculative) {
  spec_ = speculative;
  const int G = x_.part.group_count();
  if (!host_) {
    const Shape owned{x_.owned_total};
    if (x_.dtype != DType::f32)
      master_ = Tensor::zeros(x_.dev, x_.compute, owned, ScalarType::f32, MemCategory::master_weights);
    m_ = Tensor::zeros(x_.dev, x_.compute, owned, ScalarType::f32, MemCategory::optimizer_states);
    v_ = Tensor::zeros(x_.dev, x_.compute, owned, ScalarType::f32, MemCategory::optimizer_states);
  }
  bank_.assign(static_cast<size_t>(G), 0);
  // One float per norm run (Context::norm_runs), the all-reduce scalar, and on a pipeline stage
  // or tensor rank 4 floats per stage or rank for the exchanges across them (one at a time).
  norm_slots_ = 0;
  for (const auto& runs : x_.norm_runs) norm_slots_ += static_cast<int64_t>(runs.size());
  const int64_t stages = x_.place.active() ? x_.place.stages : 0;
  const int64_t slices = x_.tensor.active() ? x_.tensor.comm->size() : 0;
  norms_ = Tensor::zeros(x_.dev, x_.compute, Shape{norm_slots_ + 1 + 4 * std::max(stages, slices)},
                         ScalarType::f32, MemCategory::other);
}

float* OptimizerStep::state(int g, int k, bool other, int64_t lo) const {
  const size_t gi = static_cast<size_t>(g);
  if (host_) return host_->state(g, k, spec_ && ((bank_[gi] != 0) != other), lo);
  const Tensor& t = k == 0 ? master_ : k == 1 ? m_ : v_;
  return t ? t.data_as<float>() + x_.owned_off[gi] + lo : nullptr;
}

bool OptimizerStep::keeps(int k) const {
  if (host_) return true;
  return static_cast<bool>(k == 0 ? master_ : k == 1 ? m_ : v_);
}

void OptimizerStep::read_state(int g, int k, int64_t off, float* dst, int64_t n) {
  if (host_ && host_->swap()) return host_->swap()->read_state(g, k, off, dst, n);
  const float* src = state(g, k, false, off);
  if (host_) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  else x_.copy_now(dst, src, static_cast<size_t>(n) * 4);
}

void OptimizerStep::write_state(int g, int k, int64_t off, const float* src, int64_t n) {
  if (host_ && host_->swap()) return host_->swap()->write_state(g, k, off, src, n);
  float* dst = state(g, k, false, off);
  const size_t bytes = static_cast<size_t>(n) * 4;
  if (host_) {
    if (src) std::memcpy(dst, src, bytes);
    else std::memset(dst, 0, bytes);
  } else if (src) {
    x_.copy_now(dst, src, bytes);
  } else {
    x_.dev.fill_async(dst, 0, bytes, x_.compute);
    x_.compute.synchronize();
  }
}

optim::AdamStep OptimizerStep::adam_step(int64_t t, float grad_scale, optim::AdamParams& hp) const {
  const double n = static_cast<double>(x_.world) * x_.o.gradient_accumulation_steps;
  hp = x_.o.adam;
  if (x_.o.betas) std::tie(hp.beta1, hp.beta2) = x_.o.betas(t);
  return optim::AdamStep{t, x_.o.lr(t), static_cast<float>(grad_scale / n)};
}

void OptimizerStep::plan_speculation() {
  speculating_ = spec_ && guess_next_;
  if (!speculating_) return;
  spec_as_ = adam_step(applied + 1, static_cast<float>(1.0 / loss_scale()), spec_hp_);
}

void OptimizerStep::landed(int g, bool last) {
  if (!last || !speculating_) return;
  // The group's gradient is final: its AdamW, ahead of the norm.
  host_->run_adam(g, [this, g](int64_t lo, int64_t n) { timed_adam(g, spec_as_, spec_hp_, true, lo, n); }, true);
  spec_order_.push_back(g);
}

optim::GlobalNorm OptimizerStep::global_norm(float local) {
  if (x_.comm.kind() == DeviceKind::cpu) return optim::global_grad_norm(x_.comm, local);
  float* scalar = norms_.data_as<float>() + norm_slots_;
  x_.copy_now(scalar, &local, sizeof local);
  x_.comm.all_reduce(scalar, scalar, 1, DType::f32, coll::ReduceOp::sum, x_.compute_point()).wait();
  float sq = 0;
  x_.copy_now(&sq, scalar, sizeof sq);
  optim::GlobalNorm g;
  g.squared = sq;
  g.norm = std::sqrt(sq);
  g.finite = std::isfinite(sq);
  return g;
}

// Every member's (squared norm, loss) to every member of `c` (the pipeline's stages, or a
// tensor group): an all-gather of their bits (4 floats per member: two doubles), summed in member
// order in double on every rank alike, so every member gets the same bits whatever the
// collective's arithmetic. A non-finite member's norm makes the sum non-finite (the fp16
// overflow check is global). Returns (the sum, the last member's loss).
std::pair<double, double> OptimizerStep::exchange(coll::Communicator& c, double sq_mine, double loss) {
  const size_t P = static_cast<size_t>(c.size());
  std::vector<double> all(2 * P, 0.0);
  const double mine[2] = {sq_mine, loss};
  std::memcpy(all.data() + 2 * static_cast<size_t>(c.rank()), mine, sizeof mine);
  if (c.kind() == DeviceKind::cpu) {
    c.all_gather(all.data() + 2 * static_cast<size_t>(c.rank()), all.data(), 4, DType::f32).wait();
  } else {
    float* area = norms_.data_as<float>() + norm_slots_ + 1;
    x_.copy_now(area + 4 * static_cast<size_t>(c.rank()), mine, sizeof mine);
    c.all_gather(area + 4 * static_cast<size_t>(c.rank()), area, 4, DType::f32, x_.compute_point()).wait();
    x_.copy_now(all.data(), area, all.size() * sizeof(double));
  }
  double sq = 0;
  for (size_t s = 0; s < P; ++s) sq += all[2 * s];
  return {sq, all[2 * (P - 1) + 1]};
}

void OptimizerStep::timed_adam(int g, const optim::AdamStep& as, const optim::AdamParams& hp, bool ahead,
                               int64_t lo, int64_t n) {
  const double t0 = now_seconds();
  adam_group(g, as, hp, ahead, lo, n);
  x_.timers.adam_ns += static_cast<int64_t>((now_seconds() - t0) * 1e9);
}

// AdamW on elements [lo, lo + n) of this rank's owned range of group g, writing the fp32 master
// (or the fp32 working parameters) and the working copy: in place on the device, or with offload
// into the host's `out` (the host shard itself for an offloaded parameter shard). `ahead`
// (speculative host step): from the current bank into the other one, and the working copy always
// into `out`, so that nothing a later use reads changes before the boundary knows the step is
// applied (it then flips the group's bank and, for an offloaded shard, copies `out` into it).
// A range cuts the group's pieces where it begins and ends (the NVMe tier's sub-groups): AdamW is
// element-wise, so the cut changes no bit.
void OptimizerStep::adam_group(int g, const optim::AdamStep& as, const optim::AdamParams& base, bool ahead,
                               int64_t lo, int64_t n) {
  optim::AdamParams hp = base;
  const int64_t hi = n < 0 ? x_.owned_len(g) : lo + n;
  // The state pointers start at element lo (with NVMe offload they point into lo's swap slot).
  float* const p_in = state(g, 0, false, lo);
  float* const m_in = state(g, 1, false, lo);
  float* const v_in = state(g, 2, false, lo);
  float* const p_out = state(g, 0, ahead, lo);
  float* const m_out = state(g, 1, ahead, lo);
  float* const v_out = state(g, 2, ahead, lo);
  const size_t e = x_.esize();
  for (const Partition::Piece& pc : x_.owned_pieces(g)) {
    const int64_t begin = std::max(lo, pc.shard_offset);
    const int64_t end = std::min(hi, pc.shard_offset + pc.count);
    if (begin >= end) continue;
    const size_t count = static_cast<size_t>(end - begin);
    const bool decays = x_.o.weight_decay_all || x_.model.params[static_cast<size_t>(pc.param)].weight_decay;
    hp.weight_decay = decays ? base.weight_decay : 0.0f;
    const size_t k = static_cast<size_t>(begin);       // in the owned range (working copy, gradient)
    const size_t r = static_cast<size_t>(begin - lo);  // from lo (the state pointers)
    unsigned char* working;
    // (A shard on NVMe gets its new copy in `out` too: apply() stores it from there.)
    if (!host_ || (params_.shard_on_host(g) && !params_.shard_on_drive(g) && !ahead))
      working = params_.working(g, begin);
    else
      working = host_->out(g) + k * e;
    float* p = p_in ? p_in + r : reinterpret_cast<float*>(working);
    float* po = p_out ? p_out + r : p;
    const bool copy16 = p_in && x_.dtype != DType::f32;
    const unsigned char* gr = grad(g) + k * size_of(grad_type());
    if (!host_) {  // device-resident state: in place, on the compute stream
      x_.kern->adam(hp, as, p, m_in + r, v_in + r, gr, grad_type(), count, copy16 ? working : nullptr, x_.dtype);
      continue;
    }
    x_.adam->step_into(hp, as, p, m_in + r, v_in + r, po, m_out + r, v_out + r, gr, grad_type(), count,
                       copy16 ? working : nullptr, x_.dtype);
    if (p_in && x_.dtype == DType::f32)  // offload with fp32 parameters: the copy going up
      std::memcpy(working, po, count * 4);
  }
}

StepStats OptimizerStep::apply(double loss) {
  const int G = x_.part.group_count();
  // Global norm: each rank's owned range (stage 0: all of it, identical on every rank, so no
  // communication; otherwise the shards partition the gradient and one all-reduce sums them).
  // Summed in group order either way (with offload the host thread took each group's part).
  double local = 0;
  if (host_) {
    // Every group landed its final shard (a group without parameters never lands: its partial
    // stays 0); the AdamW run ahead after the last one goes on during the all-reduce.
    host_->wait_norms();
    for (int g = 0; g < G; ++g) local += host_->partial_norm(g);
  } else {
    // Each group's squared norm on the compute stream (after the accumulation that made the
    // gradient), the G results to the host in one copy.
    // (On a pipeline stage holding a tied copy another stage owns, that copy is left out: one
    // squared norm per counted run, Context::norm_runs.)
    float* dn = norms_.data_as<float>();
    const size_t es = size_of(grad_type());
    size_t slot = 0;
    for (int g = 0; g < G; ++g)
      for (const auto& [off, len] : x_.norm_runs[static_cast<size_t>(g)])
        x_.kern->squared_norm(grad(g) + static_cast<size_t>(off) * es, grad_type(),
                              static_cast<size_t>(len), dn + slot++);
    std::vector<float> per_run(slot);
    x_.copy_now(per_run.data(), dn, per_run.size() * sizeof(float));
    for (float v : per_run) local += v;
  }
  optim::GlobalNorm norm;
  if (x_.o.stage == 0) {
    norm.squared = static_cast<float>(local);
    norm.norm = std::sqrt(norm.squared);
    norm.finite = std::isfinite(norm.squared);
  } else {
    norm = global_norm(static_cast<float>(local));
  }
  // Stage 0 sums nothing over the data group (every rank has the whole gradient): `local` is
  // this coordinate's norm already.
  double coord_sq = x_.o.stage == 0 ? local : double{norm.squared};
  if (x_.tensor.active()) {
    // A tensor rank: each rank's slices plus, on rank 0, the replicated parameters make the
    // norm of this stage's whole parameters. The loss is the same on every rank of the group.
    coord_sq = exchange(*x_.tensor.comm, coord_sq, loss).first;
    norm.squared = static_cast<float>(coord_sq);
    norm.norm = std::sqrt(norm.squared);
    norm.finite = std::isfinite(norm.squared);
  }
  if (x_.place.active()) {
    // A pipeline stage: the norm and the overflow are the whole model's, and the loss is the
    // last stage's, on every stage (every copy of a tied parameter must take the same step).
    const auto [sq, last_loss] = exchange(*x_.place.pipe, coord_sq, loss);
    norm.squared = static_cast<float>(sq);
    norm.norm = std::sqrt(norm.squared);
    norm.finite = std::isfinite(norm.squared);
    loss = last_loss;
  }
  // The gradients are sums over ranks and micro-batches of gradients of mean losses: the
  // objective's gradient is that divided by n.
  const double n = static_cast<double>(x_.world) * x_.o.gradient_accumulation_steps;
  optim::GlobalNorm mean = norm;
  mean.norm = static_cast<float>(norm.norm / n);
  mean.squared = static_cast<float>(norm.squared / (n * n));
  const optim::StepScale sc = scaler ? optim::prepare_step(*scaler, mean, x_.o.gradient_clipping)
                                     : optim::fold_grad_scale(mean, 1.0, x_.o.gradient_clipping);
  ++steps;
  StepStats st;
  st.step = steps;
  st.loss = loss;
  st.grad_norm = sc.grad_norm;
  st.lr = x_.o.lr(applied + 1);  // the step about to be applied
  st.loss_scale = sc.loss_scale;
  st.next_loss_scale = loss_scale();
  st.applied = sc.apply;
  guess_next_ = sc.apply && sc.clip_coef == 1.0f;

  optim::AdamParams hp;
  const optim::AdamStep as = adam_step(applied + 1, sc.grad_scale, hp);
  // The AdamW run ahead is this step exactly when every input of it is the same bits.
  const bool keep = speculating_ && sc.apply && same_step(as, hp, spec_as_, spec_hp_);
  if (speculating_) {
    st.speculation = keep ? StepStats::Speculation::kept : StepStats::Speculation::dropped;
    if (!keep) host_->sync_counted();  // its results are in the other bank, never read
    speculating_ = false;
  }
  if (!sc.apply) return st;
  ++applied;
  // The order groups finish AdamW in: with the step kept, those that ran ahead (landing order),
  // then the rest; else group order.
  std::vector<int> order = keep ? spec_order_ : std::vector<int>{};
  std::vector<bool> ahead(static_cast<size_t>(G), false);
  for (int g : order) ahead[static_cast<size_t>(g)] = true;
  for (int g = 0; g < G; ++g)
    if (!ahead[static_cast<size_t>(g)]) order.push_back(g);
  if (host_) {
    // The host thread runs AdamW group by group; each group's updated working copy goes up as
    // soon as its AdamW is done, then (whole groups) its all-gather starts, while the host
    // thread works on the next groups.
    for (int g : order)
      if (!ahead[static_cast<size_t>(g)])
        host_->run_adam(g, [this, g, as, hp](int64_t lo, int64_t n) { timed_adam(g, as, hp, false, lo, n); },
                        false);
  }
  for (int g : order) {
    const size_t gi = static_cast<size_t>(g);
    const size_t bytes = static_cast<size_t>(x_.owned_len(g)) * x_.esize();
    if (!host_) {
      adam_group(g, as, hp);
    } else {
      host_->wait_adam(g);
      if (ahead[gi]) bank_[gi] ^= 1;  // keep it: the other bank is now the state
      if (params_.shard_on_drive(g))  // the new working copy back to the drive
        params_.store_shard(g, host_->out(g), bytes);
      else if (params_.shard_on_host(g) && ahead[gi])  // from where it was written
        std::memcpy(params_.working(g, 0), host_->out(g), bytes);
      if (!params_.shard_on_host(g)) host_->copy_up(g, params_.working(g, 0), bytes);
    }
    // Every rank updated its shard of a whole group's working parameters: gather them in place,
    // now, while AdamW goes on with the next groups; the next forward waits for it (use()).
    // (Without offload AdamW wrote the shard on the compute stream: start after it.)
    if (x_.o.stage >= 1 && params_.whole(g)) params_.gather_whole(g, host_ ? nullptr : x_.compute_point());
  }
  return st;
}

void OptimizerStep::state_replaced() {
  std::fill(bank_.begin(), bank_.end(), 0);
  guess_next_ = true;
}

}  // namespace zero::engine
