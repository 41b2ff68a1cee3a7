#include "collectives/communicator.hpp"

#include <string>

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

Work Communicator::send(const void* buf, size_t count, DType dtype, int peer, Event* after) {
  const P2POp op = P2POp::send(buf, count, dtype, peer);
  return batch_send_recv({&op, 1}, after).front();
}

Work Communicator::recv(void* buf, size_t count, DType dtype, int peer, Event* after) {
  const P2POp op = P2POp::recv(buf, count, dtype, peer);
  return batch_send_recv({&op, 1}, after).front();
}

void Communicator::check_p2p(std::span<const P2POp> ops) const {
  for (const P2POp& op : ops) {
    const std::string what = std::string(op.kind == P2POp::Kind::send ? "send to" : "recv from") +
                             " peer " + std::to_string(op.peer) + " on rank " +
                             std::to_string(rank()) + " (communicator of " +
                             std::to_string(size()) + " ranks)";
    ZERO_REQUIRE(op.peer >= 0 && op.peer < size(),
                 what + ": the peer is not a rank of this communicator\nHINT: peers are 0.." +
                     std::to_string(size() - 1) +
                     "; a pipeline's first and last stages have no neighbour on one side and "
                     "post nothing there");
    ZERO_REQUIRE(op.peer != rank(),
                 what + ": a rank cannot send to or receive from itself\nHINT: copy the buffer "
                        "instead; with one stage there is no neighbour to talk to");
    ZERO_REQUIRE(op.count == 0 || op.buf != nullptr, what + ": null buffer for " +
                                                         std::to_string(op.count) + " elements");
  }
}

std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Device& device) {
  if (device.kind() == DeviceKind::cuda) return make_nccl_communicator(comm, device);
  return make_mpi_communicator(comm, device);
}

}  // namespace zero::coll
