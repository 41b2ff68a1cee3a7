// The tensor group as a model Unit sees it (docs/tensor-parallel.md): this rank's place among the
// T ranks that split each matrix, and the in-place all-reduces (Megatron's f and g) that stitch
// the shards together. Degree 1 is the unsplit model: no communicator, every all-reduce a no-op,
// so a Unit written once over a TensorGroup is make_gpt's Unit at degree 1, op for op.
//
// Streams. all_reduce records an event on the compute stream (the Ops' stream) at the point
// where the buffer is complete, issues the collective on the communicator's stream with that
// event as `after`, and makes the compute stream wait for its completion (Work::chain). The host
// never waits. The caller must enqueue a reader of the buffer right away (which keeps its storage
// alive until the collective is done: cpu ops hold their operands, cuda frees in compute-stream
// order, after the wait). Every rank of the group must call all_reduce in the same order.
//
// Ownership: one TensorGroup per Unit (it owns its event); the communicator and the device must
// outlive it. Thread-safety: as the Unit that owns it (one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>

#include "collectives/communicator.hpp"
#include "core/tensor.hpp"
#include "models/ops.hpp"

namespace zero::models {

class TensorGroup {
 public:
  // Degree 1 without a communicator: rank 0 of 1.
  TensorGroup() = default;
  // The group of `comm` (the grid's tensor communicator). Throws zero::Error unless its kind is
  // `device`'s (collectives run on the device's own buffers); `who` names the Unit in the error.
  TensorGroup(coll::Communicator& comm, Device& device, const std::string& who);

  int rank() const noexcept { return comm_ ? comm_->rank() : 0; }
  int size() const noexcept { return comm_ ? comm_->size() : 1; }
  coll::Communicator* comm() const noexcept { return comm_; }

  // t = op over the group of t, in place, stream-ordered as above. A no-op at size 1 (nothing
  // is counted). t's type must be fp32, bf16 or fp16.
  void all_reduce(Ops& ops, const Tensor& t, coll::ReduceOp op = coll::ReduceOp::sum);

  // Payload handed to all-reduces so far (bytes of the buffers, not the wire traffic: a ring
  // sends 2 (T-1)/T of it per rank), and the number of calls.
  int64_t all_reduce_bytes() const noexcept { return bytes_; }
  int64_t all_reduce_calls() const noexcept { return calls_; }

  // Sequence parallelism (docs/tensor-parallel.md, "Sequence parallelism"). `full` holds N rows
  // (all dimensions but the last: the micro-batch's token rows), `shard` N / size() rows of the
  // same width and type, any leading shape (the Units use [B, S/size, C]); rank r's shard is
  // full's rows [r N/size, (r+1) N/size), one contiguous block, so each exchange is one
  // collective. all_gather: full = the group's shards in rank order (Megatron-SP's g-bar, f's
  // forward). reduce_scatter: shard = this rank's rows of the sum over the group of full (g's
  // forward; f's backward). Stream-ordered as all_reduce; out of place, and both buffers are kept
  // alive until the collective is done (the caller need not read the send buffer again).
  // size() must be > 1 (a group of one has nothing to exchange: the Unit skips the call).
  void all_gather(Ops& ops, const Tensor& shard, const Tensor& full);
  void reduce_scatter(Ops& ops, const Tensor& full, const Tensor& shard);

  // Payload handed to all-gathers and reduce-scatters so far: the bytes of `full` per call (a
  // ring sends (T-1)/T of it per rank, so one of each moves what one all-reduce of `full` does),
  // and the number of calls.
  int64_t gather_scatter_bytes() const noexcept { return gs_bytes_; }
  int64_t gather_scatter_calls() const noexcept { return gs_calls_; }

  // Keeps `a` and `b` alive until the compute stream has run what was enqueued so far (cpu: a
  // host function holding them; cuda frees in compute-stream order anyway), for buffers that
  // only views or a collective still read.
  static void hold(Ops& ops, const Tensor& a, const Tensor& b);

 private:
  coll::Communicator* comm_ = nullptr;
  std::unique_ptr<Event> ready_;  // the compute stream's point each all-reduce starts after
  int64_t bytes_ = 0, calls_ = 0;
  int64_t gs_bytes_ = 0, gs_calls_ = 0;

  // Checks the pair and returns its dtype and the shard's element count.
  std::pair<DType, size_t> check_pair(const Tensor& shard, const Tensor& full, const char* what) const;
};

}  // namespace zero::models
