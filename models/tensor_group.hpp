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

 private:
  coll::Communicator* comm_ = nullptr;
  std::unique_ptr<Event> ready_;  // the compute stream's point each all-reduce starts after
  int64_t bytes_ = 0, calls_ = 0;
};

}  // namespace zero::models
