#include "models/tensor_group.hpp"

#include <string>

#include "core/error.hpp"

namespace zero::models {

TensorGroup::TensorGroup(coll::Communicator& comm, Device& device, const std::string& who)
    : comm_(&comm) {
  ZERO_REQUIRE(comm.kind() == device.kind(),
               who + ": the tensor communicator (" + std::string(to_string(comm.kind())) +
                   ") and the model's device (" + device.name() + ") differ in kind");
  ready_ = device.create_event();
}

void TensorGroup::all_reduce(Ops& ops, const Tensor& t, coll::ReduceOp op) {
  if (size() == 1) return;  // the unsplit model: nothing to combine
  const std::optional<DType> dtype = to_dtype(t.type());
  ZERO_REQUIRE(dtype.has_value(), "tensor group all-reduce: " + t.describe() +
                                      " has a type the collectives do not sum (fp32, bf16, fp16)");
  ops.stream().record(*ready_);
  coll::Work w = comm_->all_reduce(t.data(), t.data(), static_cast<size_t>(t.numel()), *dtype, op,
                                   ready_.get());
  w.chain(ops.stream());
  bytes_ += static_cast<int64_t>(t.bytes());
  ++calls_;
}

std::pair<DType, size_t> TensorGroup::check_pair(const Tensor& shard, const Tensor& full,
                                                 const char* what) const {
  ZERO_REQUIRE(size() > 1, std::string("tensor group ") + what + ": a group of one has nothing to exchange");
  const std::optional<DType> dtype = to_dtype(full.type());
  ZERO_REQUIRE(dtype.has_value(), std::string("tensor group ") + what + ": " + full.describe() +
                                      " has a type the collectives do not move (fp32, bf16, fp16)");
  ZERO_REQUIRE(shard.type() == full.type() && shard.numel() * size() == full.numel() &&
                   full.shape().rank() >= 1 && full.shape().rows() % size() == 0 &&
                   shard.shape().back() == full.shape().back(),
               std::string("tensor group ") + what + ": the shard " + shard.describe() + " must be 1/" +
                   std::to_string(size()) + " of " + full.describe() +
                   " (its rows split into equal blocks), of the same width and type");
  return {*dtype, static_cast<size_t>(shard.numel())};
}

void TensorGroup::hold(Ops& ops, const Tensor& a, const Tensor& b) {
  if (ops.device().kind() != DeviceKind::cpu) return;
  ops.stream().launch_host([a, b] {});
}

void TensorGroup::all_gather(Ops& ops, const Tensor& shard, const Tensor& full) {
  const auto [dtype, count] = check_pair(shard, full, "all-gather");
  ops.stream().record(*ready_);
  coll::Work w = comm_->all_gather(shard.data(), full.data(), count, dtype, ready_.get());
  w.chain(ops.stream());
  hold(ops, shard, full);
  gs_bytes_ += static_cast<int64_t>(full.bytes());
  ++gs_calls_;
}

void TensorGroup::reduce_scatter(Ops& ops, const Tensor& full, const Tensor& shard) {
  const auto [dtype, count] = check_pair(shard, full, "reduce-scatter");
  ops.stream().record(*ready_);
  coll::Work w = comm_->reduce_scatter(full.data(), shard.data(), count, dtype, coll::ReduceOp::sum,
                                       ready_.get());
  w.chain(ops.stream());
  hold(ops, full, shard);
  gs_bytes_ += static_cast<int64_t>(full.bytes());
  ++gs_calls_;
}

}  // namespace zero::models
