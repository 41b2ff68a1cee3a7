#include "runtime/engine/schedule.hpp"

#include <map>

#include "core/error.hpp"
#include "core/phase.hpp"

namespace zero::engine {

using Part = UnitPass::Part;

std::vector<UnitPass> local_schedule(int units, int micro_batches) {
  std::vector<UnitPass> out;
  for (int mb = 0; mb < micro_batches; ++mb) {
    for (int u = 0; u < units; ++u) out.push_back({mb, u, Part::forward});
    for (int u = units; u-- > 0;) out.push_back({mb, u, Part::backward});
  }
  return out;
}

std::vector<int> unit_order(const std::vector<UnitPass>& passes) {
  std::vector<int> out;
  out.reserve(passes.size());
  for (const UnitPass& p : passes)
    if (p.reads_params()) out.push_back(p.unit);
  return out;
}

ScheduleRunner::ScheduleRunner(Context& x, ParamResidency& params, GradReduction& grads,
                               std::vector<bool> checkpoint, bool has_loss, ActivationOffload* act)
    : x_(x), params_(params), grads_(grads), checkpoint_(std::move(checkpoint)), has_loss_(has_loss), act_(act) {}

void ScheduleRunner::plan(const std::vector<UnitPass>& passes) {
  const size_t U = x_.model.units.size();
  passes_ = passes;
  last_grad_.assign(U, 0);
  last_reader_ = 0;
  order_pos_.assign(passes.size(), -1);
  count_.clear();
  long readers = 0;
  for (size_t pos = 0; pos < passes.size(); ++pos) {
    const UnitPass& p = passes[pos];
    ZERO_REQUIRE(p.micro >= 0 && p.unit >= 0 && static_cast<size_t>(p.unit) < U,
                 "schedule: pass " + std::to_string(pos) + " names micro-batch " + std::to_string(p.micro) +
                     " and Unit " + std::to_string(p.unit) + " of " + std::to_string(U));
    if (static_cast<size_t>(p.micro) >= count_.size()) count_.resize(static_cast<size_t>(p.micro) + 1, 0);
    ++count_[static_cast<size_t>(p.micro)];
    if (p.ends_grad()) last_grad_[static_cast<size_t>(p.unit)] = pos;
    if (p.reads_params()) {
      order_pos_[pos] = readers++;
      last_reader_ = pos;
    }
  }
  // Stage 3 gathers in the order the passes read parameters; set once per distinct order (a
  // pipeline stage runs the same list every step).
  std::vector<int> order = unit_order(passes);
  if (order != order_) {
    order_ = order;
    params_.set_order(std::move(order));
  }
}

int ScheduleRunner::passes(int micro) const {
  return static_cast<size_t>(micro) < count_.size() ? count_[static_cast<size_t>(micro)] : 0;
}

void ScheduleRunner::pass(MicroState& m, size_t pos, float seed_scale) {
  const UnitPass& p = passes_[pos];
  if (m.ctx.empty()) m.ctx.resize(x_.model.units.size());
  const double t0 = now_seconds();
  if (p.part == Part::forward) {
    phase::set("forward");
    forward(m, p.unit, pos);
    x_.timers.forward += now_seconds() - t0;
  } else {
    phase::set("backward and gradient reduction");
    backward(m, p, pos, seed_scale);
    x_.timers.backward += now_seconds() - t0;
  }
  --m.passes_left;
}

double ScheduleRunner::run(const std::vector<UnitPass>& passes, const std::function<Batch(int)>& next,
                           const std::function<void(int)>& fetched, float seed_scale) {
  plan(passes);
  std::map<int, MicroState> live;  // micro-batches in flight (node-based: Batch addresses stay put)
  double total = 0;
  for (size_t pos = 0; pos < passes.size(); ++pos) {
    const UnitPass& p = passes[pos];
    auto it = live.find(p.micro);
    if (it == live.end()) {
      phase::set("loading a micro-batch");
      MicroState fresh;
      fresh.batch = next(p.micro);
      fresh.passes_left = this->passes(p.micro);
      it = live.emplace(p.micro, std::move(fresh)).first;
      if (fetched) fetched(p.micro);
    }
    MicroState& m = it->second;
    pass(m, pos, seed_scale);
    if (m.passes_left == 0) {  // the micro-batch is done: its reductions too
      grads_.drain();
      total += m.loss;
      live.erase(it);
    }
  }
  return total;
}

void ScheduleRunner::forward(MicroState& m, int unit, size_t pos) {
  const size_t u = static_cast<size_t>(unit);
  UnitContext& c = m.ctx[u];
  const size_t q = static_cast<size_t>(order_pos_[pos]);
  params_.use(unit);
  if (x_.o.stage == 3) params_.prefetch(q + 1);
  c.batch = &m.batch;
  c.input = m.carry;
  c.checkpoint = checkpoint_[u];
  c.params = params_.views(unit);
  x_.model.units[u]->forward(c);
  c.params.clear();
  m.carry = c.output;
  if (c.checkpoint) {
    partition_input(m, unit);
    stash_input(m, unit);
  }
  // Stage 3 frees the gathered parameters here (after the stream has passed the Unit); else the
  // host waits only for the Unit before this one (unit_fence).
  if (x_.o.stage == 3) params_.release_after(q); else x_.unit_fence();
  if (u + 1 != x_.model.units.size() || !has_loss_) return;
  // The loss (fp32, or fp64 with fp64 activations) to the host; the synchronize also reports a
  // bad token or target found by this micro-batch's ops.
  double loss64 = 0;
  float loss32 = 0;
  const bool f64 = c.loss.type() == ScalarType::f64;
  copy_to_host(x_.dev, x_.compute, f64 ? static_cast<void*>(&loss64) : static_cast<void*>(&loss32), c.loss);
  x_.compute.synchronize();
  m.loss = f64 ? loss64 : loss32;
  m.carry = Tensor();  // the last Unit's backward starts from the loss, not from a gradient
}

void ScheduleRunner::backward(MicroState& m, const UnitPass& p, size_t pos, float seed_scale) {
  const size_t u = static_cast<size_t>(p.unit);
  UnitContext& c = m.ctx[u];
  Unit& unit = *x_.model.units[u];
  const bool reads = p.reads_params();
  const size_t q = reads ? static_cast<size_t>(order_pos_[pos]) : 0;
  if (x_.o.stage == 3 && reads) {
    params_.use(p.unit);
    params_.prefetch(q + 1);
  }
  if (reads) {
    c.params = params_.views(p.unit);
    c.grad_output = m.carry;
    c.grad_scale = seed_scale;
  }
  c.grads = grads_.views(p.unit);
  if (p.part != Part::weight) {
    fetch_input(m, p.unit);
    if (p.unit > 0) prefetch_input(m, p.unit - 1);  // its copy runs while this Unit computes
    gather_input(m, p.unit);
  }
  switch (p.part) {
    case Part::backward: unit.backward(c); break;
    case Part::input: unit.backward_input(c); break;
    case Part::weight: unit.backward_weight(c); break;
    case Part::forward: break;
  }
  if (reads) m.carry = c.grad_input;
  if (p.part == Part::input) {
    // W reads only ctx.state and ctx.grads (core/unit.hpp): drop the rest now, so a stage's
    // boundary tensors do not wait for the W passes.
    c.params.clear();
    c.grads.clear();
    c.input = Tensor();
    c.output = Tensor();
    c.grad_output = Tensor();
    c.grad_input = Tensor();
  } else {
    c = UnitContext();
    grads_.after_backward(p.unit, pos == last_grad_[u]);  // group `unit` is complete now
  }
  if (x_.o.stage == 3 && reads) {
    // After the step's last pass that reads parameters the optimizer step changes the shards:
    // nothing stays gathered.
    if (pos == last_reader_) params_.release_all(); else params_.release_after(q);
  } else {
    x_.unit_fence();
  }
}

// partition_activations (DeepSpeed's activation_checkpointing key; Megatron's
// distribute-saved-activations): the input a checkpointed Unit keeps for its recomputation is the
// same whole tensor on every rank of a tensor group, so each rank keeps only its 1/T of it
// (elements [t n/T, (t+1) n/T)) and the group all-gathers it back before the Unit's backward.
// The whole input is released here: from this Unit's context and from the previous Unit's
// output (the same tensor), so the peak holds a T-th of each checkpointed input. Every rank of
// the group runs the same Units in the same order, so the all-gathers pair up with each other and
// with the Units' own collectives. Inputs whose size the degree does not divide stay whole.
void ScheduleRunner::partition_input(MicroState& m, int unit) {
  // With sequence parallelism the input is already this rank's token shard (and differs per
  // rank): nothing to split, and an all-gather would build a wrong tensor.
  if (!x_.o.partition_activations || !x_.tensor.active() || x_.model.sharded_activations) return;
  const size_t u = static_cast<size_t>(unit);
  UnitContext& c = m.ctx[u];
  const int64_t T = x_.tensor.comm->size();
  if (!c.input || c.input.numel() % T != 0 || !to_dtype(c.input.type())) return;
  if (m.parts.empty()) {
    m.parts.resize(m.ctx.size());
    m.part_shapes.resize(m.ctx.size());
  }
  const int64_t n = c.input.numel() / T;
  const size_t bytes = static_cast<size_t>(n) * size_of(*to_dtype(c.input.type()));
  Tensor part = Tensor::empty(x_.dev, Shape{n}, c.input.type(), MemCategory::activations);
  x_.dev.copy_async(part.data(), static_cast<const unsigned char*>(c.input.data()) + bytes * static_cast<size_t>(x_.tensor.comm->rank()),
                    bytes, x_.compute);
  m.parts[u] = std::move(part);
  m.part_shapes[u] = c.input.shape();
  // A raw copy holds nothing: the whole input must live until the copy has run (hold_input).
  hold_input(std::move(c.input));
  c.input = Tensor();
  if (u > 0) m.ctx[u - 1].output = Tensor();
}

// cpu: a no-op on the compute stream holds `t` until the stream has passed what was enqueued
// before (a raw copy or a collective's chain holds nothing). cuda: dropping `t` here is enough:
// its memory goes back with cudaFreeAsync on the allocation stream, the compute stream, after
// that work; and a host task must not free it (cudaLaunchHostFunc callbacks may not call CUDA).
void ScheduleRunner::hold_input(Tensor t) {
  if (x_.dev.kind() == DeviceKind::cpu) x_.compute.launch_host([held = std::move(t)] { (void)held; });
}

void ScheduleRunner::gather_input(MicroState& m, int unit) {
  const size_t u = static_cast<size_t>(unit);
  if (m.parts.empty() || !m.parts[u]) return;
  Tensor& part = m.parts[u];
  Tensor whole = Tensor::empty(x_.dev, m.part_shapes[u], part.type(), MemCategory::activations);
  coll::Work w = x_.tensor.comm->all_gather(part.data(), whole.data(), static_cast<size_t>(part.numel()),
                                            *to_dtype(part.type()), x_.compute_point());
  w.chain(x_.compute);  // the recomputation waits for it; the host does not
  m.ctx[u].input = std::move(whole);
  // `part` must outlive the all-gather (the compute stream has waited for it: hold_input).
  hold_input(std::move(part));
  m.parts[u] = Tensor();
}

// cpu_checkpointing (DeepSpeed's activation_checkpointing key): what a checkpointed Unit keeps
// for its recomputation, its input or (partition_activations) this tensor rank's part, waits in
// host memory. The whole input is also the previous Unit's output: that reference goes too, so
// the device holds none of it between the forward and the backward.
void ScheduleRunner::stash_input(MicroState& m, int unit) {
  if (act_ == nullptr) return;
  const size_t u = static_cast<size_t>(unit);
  const bool part = !m.parts.empty() && m.parts[u];
  Tensor& kept = part ? m.parts[u] : m.ctx[u].input;
  if (!kept) return;
  if (m.stashed.empty()) {
    m.stashed.resize(m.ctx.size());
    m.stashed_part.assign(m.ctx.size(), 0);
  }
  m.stashed[u] = act_->stash(std::move(kept));
  if (!m.stashed[u]) return;  // not stashable (stays where it was)
  m.stashed_part[u] = part ? 1 : 0;
  if (!part && u > 0) m.ctx[u - 1].output = Tensor();
}

void ScheduleRunner::prefetch_input(MicroState& m, int unit) {
  const size_t u = static_cast<size_t>(unit);
  if (act_ != nullptr && u < m.stashed.size() && m.stashed[u]) act_->prefetch(m.stashed[u]);
}

void ScheduleRunner::fetch_input(MicroState& m, int unit) {
  const size_t u = static_cast<size_t>(unit);
  if (act_ == nullptr || u >= m.stashed.size() || !m.stashed[u]) return;
  Tensor t = act_->fetch(m.stashed[u]);
  if (m.stashed_part[u]) m.parts[u] = std::move(t); else m.ctx[u].input = std::move(t);
}

}  // namespace zero::engine
