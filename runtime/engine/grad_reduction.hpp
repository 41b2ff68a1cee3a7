// Gradient reduction: from the buffers a Unit's backward adds to, to this rank's reduced
// gradient (its owned range, summed over ranks and micro-batches).
//
//   stage 0/1  a full padded gradient per group, accumulated over the micro-batches (with 16-bit
//              parameters through an fp32 sum, rounded once); after the group's last backward an
//              all-reduce (stage 0) or reduce-scatter (stage 1) in place, at once with
//              overlap_comm, else at the boundary (finish()).
//   stage 2/3  a full gradient per group only during one backward (pooled); once the group's
//              Unit has run its backward it is reduce-scattered in place, and the shard kept
//              (one micro-batch) or added to an fp32 accumulator; the full buffers waiting for or
//              in reduction hold at most reduce_bucket_size elements (at least one group).
// With offload_optimizer each reduced shard goes to `land` instead (HostOffload::land), which
// brings it down to the host as soon as its reduction is waited for.
//
// Called by the schedule (views, after_backward, drain), the step (begin_step, finish, clear) and the
// optimizer step (device_grad, grad_type).
//
// Ownership and threading: owns the gradient buffers and the reductions in flight (each keeps
// its full buffer until done). Only the thread driving the Engine calls it. Reductions start
// after the compute stream's current point and run on the communicator's stream; the host
// blocks only in drain(), finish(), when the bucket bound is reached, without overlap_comm, and
// with offload while a reduced shard is copied down (HostOffload::land).
#pragma once

#include <functional>
#include <vector>

#include "runtime/engine/context.hpp"

namespace zero::engine {

class GradReduction {
 public:
  explicit GradReduction(Context& x) : x_(x) {}

  void allocate();
  // Offload: where reduced shards go (group, device pointer to the shard, last micro-batch).
  std::function<void(int g, const void* shard, bool last)> land;

  // Views of the gradients of Unit `unit`'s parameters (stage 2/3: the group's pooled buffer,
  // taken and zeroed on first use in the step's backward order).
  std::vector<Tensor> views(int unit);
  // Group g's gradient of this micro-batch is complete (its Unit's backward is enqueued, and no
  // later Unit adds to it); `last`: the step's last micro-batch. Starts what can start.
  void after_backward(int g, bool last);
  // Stage 2/3: waits for every reduction in flight (end of a micro-batch's backward).
  void drain();
  // The boundary: stage 0/1's reductions waited for (started now without overlap_comm), and
  // with offload each reduced shard landed.
  void finish();
  // Fresh gradients for the next step (on the compute stream, after AdamW read them).
  void clear();
  // Waits for every reduction in flight, errors dropped (an exception is unwinding), and marks
  // what the failed step left half-summed for begin_step() to discard.
  void quiesce() noexcept;
  // Step start (compute stream): after a failed step (quiesce), its partial gradients go:
  // stage 0/1's full buffers and the tied sums zeroed, stage 2/3's pooled buffers given back.
  // So a step that throws (a data loader's error, an out-of-memory) leaves no trace in the next.
  void begin_step();

  // Where this rank's reduced gradient for its owned range of group g starts on the device
  // (without offload), and its type.
  const unsigned char* device_grad(int g) const;
  DType grad_type() const { return x_.o.stage >= 2 ? grad_acc_type_ : x_.dtype; }

 private:
  void fold_group(int g, bool last);
  Tensor& group_grad(int g);
  bool collect_tied(int g);
  void finish_tied();
  void start_reduce_full(int g);
  void reduce_group_stage2(int g, bool last);
  void finish_oldest_reduce();
  void add_or_widen(int g, float* sum, const void* x, size_t n);

  Context& x_;
  std::vector<Tensor> grad_full_;      // stage 0/1: full padded gradient
  std::vector<coll::Work> reducing_;   // stage 0/1: its all-reduce / reduce-scatter in flight
  // Stage 0/1 with 16-bit parameters and accumulation: the fp32 sum of the micro-batches'
  // gradients (what DeepSpeed's bf16 optimizer keeps too). After each Unit's backward its
  // group's 16-bit gradient is added here and zeroed; after the last micro-batch the sum is
  // rounded once into grad_full_, which is reduced as before. Without it every micro-batch's
  // gradient would be added in 16-bit: one rounding per micro-batch, which loses the small
  // contributions (stage 2/3 accumulate their shard in fp32 for the same reason).
  std::vector<Tensor> grad_sum01_;
  std::vector<Tensor> grad_tmp_;       // stage 2/3: full gradient during one backward, then freed
  // Stage 2/3: the reduced gradient shard. With accumulation an fp32 accumulator over the
  // micro-batches (DESIGN.md: 16-bit sums of many micro-batches lose the small ones); with one
  // micro-batch the 16-bit reduce-scatter result itself, as the ZeRO formula counts it (2 bytes).
  Tensor grad_acc_;
  DType grad_acc_type_ = DType::f32;
  // Stage 2/3 reductions in flight: the Work, and the full gradient buffer it reads, which must
  // live until the Work completes.
  struct PendingReduce {
    int group;
    coll::Work work;
    Tensor full;
    bool last;  // of the step's last micro-batch: the group's gradient is final
  };
  std::vector<PendingReduce> pending_;  // oldest first
  // A pipeline stage's tied parameters (PipelinePlace::tied): each micro-batch's gradient is
  // moved out of the group's buffer into an fp32 sum; at the boundary (finish) the sum goes over
  // the stages holding the parameter (an all-reduce over the tied communicator) and back into
  // the buffer, and then the group's data-parallel reduction starts. So the tied gradient enters the
  // reduction once, whole, at every ZeRO stage (at stage 2/3 the group's buffer otherwise lives
  // for one micro-batch only, and the stages' shards of the parameter differ).
  struct Tied {
    int param;
    int group;
    int64_t offset, numel;  // within the group's buffer
    Tensor sum;             // fp32, numel
  };
  std::vector<Tied> tied_;
  std::vector<int> deferred_;  // tied groups whose final gradient waits for finish()
  // Per group: no micro-batch of this step has written its fp32 sum (grad_sum01_ or an
  // accumulating grad_acc_) or its kept shard (grad_acc_ with one micro-batch) yet; the next
  // one writes over it instead of adding (add_or_widen), so clear() zeroes none of them.
  std::vector<char> fresh_;
  int64_t pending_elems_ = 0;           // bounded by reduce_bucket_size (or one group)
  bool stale_ = false;                  // a step failed since the last begin_step()
  Pool pool_;
};

}  // namespace zero::engine
