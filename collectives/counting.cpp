#include "collectives/counting.hpp"

namespace zero::coll {

double Traffic::ring_bytes() const noexcept {
  double b = 0;
  for (const Count& c : by_kind) b += c.ring_bytes;
  return b;
}

int64_t Traffic::calls() const noexcept {
  int64_t n = 0;
  for (const Count& c : by_kind) n += c.calls;
  return n;
}

CountingCommunicator::CountingCommunicator(Communicator& inner)
    : Communicator(inner.rank(), inner.size()), inner_(inner) {}

void CountingCommunicator::add(CallKind k, size_t elems, DType dtype, double ring_factor) {
  Traffic::Count& c = traffic_.by_kind[static_cast<size_t>(k)];
  const int64_t bytes = static_cast<int64_t>(elems * size_of(dtype));
  ++c.calls;
  c.payload_bytes += bytes;
  c.ring_bytes += static_cast<double>(bytes) * ring_factor;
}

Work CountingCommunicator::all_gather(const void* send, void* recv, size_t count, DType dtype, Event* after) {
  const double n = size();
  add(CallKind::all_gather, count * static_cast<size_t>(size()), dtype, (n - 1) / n);
  return inner_.all_gather(send, recv, count, dtype, after);
}

Work CountingCommunicator::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                          Event* after) {
  const double n = size();
  add(CallKind::reduce_scatter, count * static_cast<size_t>(size()), dtype, (n - 1) / n);
  return inner_.reduce_scatter(send, recv, count, dtype, op, after);
}

Work CountingCommunicator::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                                      Event* after) {
  const double n = size();
  add(CallKind::all_reduce, count, dtype, 2 * (n - 1) / n);
  return inner_.all_reduce(send, recv, count, dtype, op, after);
}

Work CountingCommunicator::broadcast(void* buf, size_t count, DType dtype, int root, Event* after) {
  add(CallKind::broadcast, count, dtype, size() > 1 ? 1.0 : 0.0);
  return inner_.broadcast(buf, count, dtype, root, after);
}

Work CountingCommunicator::barrier(Event* after) {
  add(CallKind::barrier, 0, DType::f32, 0.0);
  return inner_.barrier(after);
}

std::vector<Work> CountingCommunicator::batch_send_recv(std::span<const P2POp> ops, Event* after) {
  for (const P2POp& op : ops) {
    if (op.kind == P2POp::Kind::send) add(CallKind::send, op.count, op.dtype, 1.0);
    else add(CallKind::recv, op.count, op.dtype, 0.0);
  }
  return inner_.batch_send_recv(ops, after);
}

}  // namespace zero::coll
