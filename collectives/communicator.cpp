#include "collectives/communicator.hpp"

#include "core/error.hpp"

namespace zero::coll {

std::string_view to_string(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "?";
}

void Work::wait() {
  if (done_) done_->synchronize();
}

bool Work::test() { return !done_ || done_->query(); }

void Work::chain(Stream& stream) {
  if (done_) stream.wait(*done_);
}

std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Device& device) {
  if (device.kind() == DeviceKind::cuda) return make_nccl_communicator(comm, device);
  return make_mpi_communicator(comm, device);
}

}  // namespace zero::coll
