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

}  // namespace zero::models
