#include "runtime/engine/grad_reduction.hpp"

#include <algorithm>

namespace zero::engine {

void GradReduction::allocate() {
  const int G = x_.part.group_count();
  const size_t Gs = static_cast<size_t>(G);
  grad_full_.resize(Gs);
  reducing_.resize(Gs);
  grad_tmp_.resize(Gs);
  fresh_.assign(Gs, 1);
  const ScalarType st = scalar_type(x_.dtype);
  for (int g = 0; g < G; ++g) {
    const size_t gi = static_cast<size_t>(g);
    const int64_t n = x_.part.group(g).padded_numel;
    if (x_.o.stage <= 1)
      grad_full_[gi] = Tensor::zeros(x_.dev, x_.compute, Shape{n}, st, MemCategory::gradients);
    if (x_.fp32_full_sum()) {
      if (grad_sum01_.empty()) grad_sum01_.resize(Gs);
      grad_sum01_[gi] = Tensor::zeros(x_.dev, x_.compute, Shape{n}, ScalarType::f32, MemCategory::gradients);
    }
  }
  for (int p : x_.place.tied) {
    const Partition::Location& loc = x_.part.location(p);
    tied_.push_back({p, loc.group, loc.offset, loc.numel,
                     Tensor::zeros(x_.dev, x_.compute, Shape{loc.numel}, ScalarType::f32, MemCategory::gradients)});
  }
  if (x_.o.stage >= 2) grad_acc_type_ = x_.o.gradient_accumulation_steps > 1 ? DType::f32 : x_.dtype;
  if (x_.o.stage >= 2 && !x_.off)
    grad_acc_ = Tensor::zeros(x_.dev, x_.compute, Shape{x_.owned_total}, scalar_type(grad_acc_type_),
                              MemCategory::gradients);
}

std::vector<Tensor> GradReduction::views(int unit) {
  std::vector<Tensor> out;
  for (int id : x_.model.units[static_cast<size_t>(unit)]->param_ids()) {
    const int group = x_.part.location(id).group;
    const size_t g = static_cast<size_t>(group);
    if (x_.o.stage <= 1) {
      out.push_back(x_.view(grad_full_[g], id));
      continue;
    }
    // The group's gradient buffer exists from the first Unit (in backward order) that adds to it
    // until the group's own Unit has run its backward and it is reduce-scattered.
    if (!grad_tmp_[g]) {
      const int64_t n = x_.part.group(group).padded_numel;
      grad_tmp_[g] = pool_.take(x_.dev, n, scalar_type(x_.dtype));
      // Zeroed on the compute stream: the buffer's previous users were a finished reduction
      // (waited for) and compute work ahead of this in stream order.
      x_.dev.fill_async(grad_tmp_[g].data(), 0, static_cast<size_t>(n) * x_.esize(), x_.compute);
    }
    out.push_back(x_.view(grad_tmp_[g], id));
  }
  return out;
}

void GradReduction::after_backward(int g, bool last) {
  if (collect_tied(g) && last) {
    // A tied group's final gradient waits for the boundary (finish): the stages holding the
    // parameter sum it there, and another stage may still need this stage's later sends
    // before it gets that far (the last stage's head is done long before the first stage's
    // embedding).
    if (!grad_sum01_.empty()) fold_group(g, last);
    deferred_.push_back(g);
    return;
  }
  if (x_.o.stage >= 2) reduce_group_stage2(g, last);
  if (!grad_sum01_.empty()) fold_group(g, last);
  if (x_.o.stage <= 1 && last && x_.o.overlap_comm) start_reduce_full(g);
}

// The buffer group g's Units add to now: the full gradient (stage 0/1), or the pooled one of the
// current backward (stage 2/3; null when no Unit has added to it yet).
Tensor& GradReduction::group_grad(int g) {
  return x_.o.stage <= 1 ? grad_full_[static_cast<size_t>(g)] : grad_tmp_[static_cast<size_t>(g)];
}

// Moves this micro-batch's gradient of group g's tied parameters into their fp32 sums (the
// buffer's slice is zeroed, so the data-parallel reduction sees no part of it). On the compute
// stream. Returns whether group g holds a tied parameter.
bool GradReduction::collect_tied(int g) {
  bool any = false;
  for (Tied& t : tied_) {
    if (t.group != g) continue;
    any = true;
    Tensor& buf = group_grad(g);
    if (!buf) continue;
    unsigned char* slice = x_.at(buf, t.offset, x_.esize());
    x_.kern->accumulate(t.sum.data_as<float>(), slice, x_.dtype, static_cast<size_t>(t.numel));
    x_.dev.fill_async(slice, 0, static_cast<size_t>(t.numel) * x_.esize(), x_.compute);
  }
  return any;
}

// The boundary of a pipeline stage holding tied parameters: each tied sum all-reduced over the
// stages holding it (in parameter order, the same on every such stage), written back into its
// group's buffer rounded once, the sums cleared for the next step, and the groups' deferred
// data-parallel reductions started.
void GradReduction::finish_tied() {
  if (deferred_.empty()) return;
  for (Tied& t : tied_) {
    coll::Work w = x_.place.tied_comm->all_reduce(t.sum.data(), t.sum.data(), static_cast<size_t>(t.numel),
                                                  DType::f32, coll::ReduceOp::sum, x_.compute_point());
    x_.wait_comm(w);
    Tensor& buf = group_grad(t.group);
    ZERO_REQUIRE(buf, "pipeline stage: the gradient buffer of tied parameter " +
                          x_.model.params[static_cast<size_t>(t.param)].name + " is gone before its sum");
    float* sum = t.sum.data_as<float>();
    x_.kern->convert(sum, DType::f32, x_.at(buf, t.offset, x_.esize()), x_.dtype, static_cast<size_t>(t.numel));
    x_.dev.fill_async(sum, 0, static_cast<size_t>(t.numel) * 4, x_.compute);
  }
  for (int g : deferred_) {
    if (x_.o.stage >= 2) reduce_group_stage2(g, true);
    else if (x_.o.overlap_comm) start_reduce_full(g);
  }
  deferred_.clear();
  drain();  // stage 2/3: the reductions just started (the schedule drained the others)
}

// Stage 0/1 with a 16-bit gradient and accumulation: add group g's gradient of this micro-batch
// to the fp32 sum and clear it; after the last micro-batch put the sum, rounded once, back for
// the reduction (started after the compute stream's point past all this). Enqueued on the
// compute stream, after the Unit's backward.
void GradReduction::fold_group(int g, bool last) {
  const size_t gi = static_cast<size_t>(g);
  Tensor& full = grad_full_[gi];
  if (!full || full.numel() == 0) return;  // a group without parameters
  float* sum = grad_sum01_[gi].data_as<float>();
  const size_t n = static_cast<size_t>(full.numel());
  add_or_widen(g, sum, full.data(), n);
  if (last) {
    x_.kern->convert(sum, DType::f32, full.data(), x_.dtype, n);
  } else {
    x_.dev.fill_async(full.data(), 0, full.bytes(), x_.compute);
  }
}

// Stage 0/1: start group g's all-reduce / reduce-scatter in place, after the compute stream's
// current point. finish() waits for it.
void GradReduction::start_reduce_full(int g) {
  const size_t gi = static_cast<size_t>(g);
  const Partition::Group& grp = x_.part.group(g);
  Tensor& full = grad_full_[gi];
  reducing_[gi] = x_.post([&](Event* after) {
    if (x_.o.stage == 0)
      return x_.comm.all_reduce(full.data(), full.data(), static_cast<size_t>(grp.padded_numel),
                                x_.dtype, coll::ReduceOp::sum, after);
    return x_.comm.reduce_scatter(full.data(), x_.at(full, x_.owned_begin[gi], x_.esize()),
                                  static_cast<size_t>(grp.shard_numel), x_.dtype, coll::ReduceOp::sum, after);
  }, x_.compute_point());
  if (!x_.o.overlap_comm) x_.wait_comm(reducing_[gi]);
}

// Stage 2/3: start the reduce-scatter after the compute stream's point (in place: the rank's
// shard of the buffer receives the sum) and return: it runs on the communicator's stream while
// backward goes on. finish_oldest_reduce() takes the result.
void GradReduction::reduce_group_stage2(int g, bool last) {
  Tensor& full = grad_tmp_[static_cast<size_t>(g)];
  if (!full) return;  // no Unit added to it (a group of no parameters)
  const Partition::Group& grp = x_.part.group(g);
  while (!pending_.empty() && pending_elems_ + grp.padded_numel > x_.o.reduce_bucket_size) finish_oldest_reduce();
  unsigned char* shard = x_.at(full, x_.owned_begin[static_cast<size_t>(g)], x_.esize());
  coll::Work w = x_.post([&](Event* after) {
    return x_.comm.reduce_scatter(full.data(), shard, static_cast<size_t>(grp.shard_numel), x_.dtype,
                                  coll::ReduceOp::sum, after);
  }, x_.compute_point());
  pending_.push_back({g, std::move(w), std::move(full), last});
  pending_elems_ += grp.padded_numel;
  full = Tensor();
  if (!x_.o.overlap_comm) finish_oldest_reduce();
  // Take the reductions already done (in order) without waiting: their buffers go back to the
  // pool and, with offload, their shards land now, so that the host works on them (AdamW
  // included) while backward goes on, however large reduce_bucket_size is.
  while (!pending_.empty() && pending_.front().work.test()) finish_oldest_reduce();
}

// Waits for the oldest reduce-scatter, keeps its shard (or adds it to the fp32 accumulator) and
// frees the full buffer.
void GradReduction::finish_oldest_reduce() {
  PendingReduce r = std::move(pending_.front());
  pending_.erase(pending_.begin());
  pending_elems_ -= x_.part.group(r.group).padded_numel;
  struct GiveBack {  // the buffer returns to the pool however this function ends
    Pool& pool;
    Tensor& t;
    ~GiveBack() { pool.give(t); }
  } give_back{pool_, r.full};
  x_.wait_comm(r.work);
  const size_t g = static_cast<size_t>(r.group);
  const unsigned char* shard = x_.at(r.full, x_.owned_begin[g], x_.esize());
  const size_t n = static_cast<size_t>(x_.part.group(r.group).shard_numel);
  // The reduction has completed (waited for above); the compute stream reads the buffer after
  // it goes back to the pool, which is safe: the pool's next user is the compute stream too
  // (in stream order) or a collective that waits for the compute stream's current point.
  if (x_.off) {
    land(r.group, shard, r.last);
  } else if (x_.o.gradient_accumulation_steps == 1) {  // keep the reduced shard as it is
    x_.dev.copy_async(x_.at(grad_acc_, x_.owned_off[g], x_.esize()), shard, n * x_.esize(), x_.compute);
    fresh_[g] = 0;
  } else {
    add_or_widen(r.group, grad_acc_.data_as<float>() + x_.owned_off[g], shard, n);
  }
}

// The step's fp32 sums are not zeroed between steps: a group's first micro-batch writes its
// gradient, widened, over the sum (the sum of one term), and the later ones add to it. Zeroing
// and then adding cost two more passes over the whole sum per step (~0.5 GB for GPT-2 124M).
void GradReduction::add_or_widen(int g, float* sum, const void* x, size_t n) {
  char& fresh = fresh_[static_cast<size_t>(g)];
  if (fresh) x_.kern->convert(x, x_.dtype, sum, DType::f32, n);
  else x_.kern->accumulate(sum, x, x_.dtype, n);
  fresh = 0;
}

void GradReduction::drain() {
  while (!pending_.empty()) finish_oldest_reduce();
}

void GradReduction::finish() {
  finish_tied();
  // A group no micro-batch reduced into (every group with parameters gets one per micro-batch,
  // so this is a guard) holds the previous step's sum: zero it for the optimizer.
  for (int g = 0; g < x_.part.group_count() && grad_acc_; ++g) {
    const size_t gi = static_cast<size_t>(g);
    if (!fresh_[gi]) continue;
    x_.dev.fill_async(x_.at(grad_acc_, x_.owned_off[gi], size_of(grad_acc_type_)), 0,
                      static_cast<size_t>(x_.owned_len(g)) * size_of(grad_acc_type_), x_.compute);
    fresh_[gi] = 0;
  }
  for (int g = 0; g < x_.part.group_count() && x_.o.stage <= 1; ++g) {
    const size_t gi = static_cast<size_t>(g);
    coll::Work& w = reducing_[gi];
    if (!w.event() && !x_.o.overlap_comm) start_reduce_full(g);
    x_.wait_comm(w);
    if (x_.off) land(g, x_.at(grad_full_[gi], x_.owned_begin[gi], x_.esize()), true);
  }
}

void GradReduction::clear() {
  for (Tensor& t : grad_full_)
    if (t) x_.dev.fill_async(t.data(), 0, t.bytes(), x_.compute);
  std::fill(fresh_.begin(), fresh_.end(), 1);  // the sums: written over by the next step (add_or_widen)
}

const unsigned char* GradReduction::device_grad(int g) const {
  const size_t gi = static_cast<size_t>(g);
  if (x_.o.stage >= 2) return x_.at(grad_acc_, x_.owned_off[gi], size_of(grad_acc_type_));
  return x_.at(grad_full_[gi], x_.owned_begin[gi], x_.esize());
}

void GradReduction::quiesce() noexcept {
  for (coll::Work& w : reducing_) {
    try { w.wait(); } catch (...) {}
    w = coll::Work();
  }
  for (PendingReduce& r : pending_) {
    try { r.work.wait(); } catch (...) {}
  }
  pending_.clear();
  pending_elems_ = 0;
  deferred_.clear();
  std::fill(fresh_.begin(), fresh_.end(), 1);  // a failed step's partial sums are not carried over
  stale_ = true;  // and its partial gradients neither (begin_step: the compute stream may be running)
}

void GradReduction::begin_step() {
  if (!stale_) return;
  stale_ = false;
  clear();  // stage 0/1's full buffers
  for (Tensor& t : grad_tmp_)
    if (t) pool_.give(t);  // the next taker zeroes it (views)
  for (Tied& t : tied_) x_.dev.fill_async(t.sum.data(), 0, static_cast<size_t>(t.numel) * 4, x_.compute);
}

}  // namespace zero::engine
