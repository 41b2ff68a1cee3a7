// CountingCommunicator: a Communicator that passes every call to another one and counts what it
// moves, so a test or a report can compare the traffic with a formula (Megatron's tensor-parallel
// volume per layer, ZeRO's per step) without timing anything. It adds no synchronisation and no
// copy: the Works returned are the wrapped communicator's own.
//
// What is counted, per kind of call, on this rank: the calls, the elements' bytes of the buffer
// the caller sees (all_reduce: count; reduce_scatter: its input, count x size; all_gather: its
// output, count x size; broadcast: count; send/recv: count), and the bytes a ring (bandwidth-
// optimal) algorithm sends from each rank for it, the figure the papers' volumes use:
//   all_reduce       2 (N-1)/N x payload        reduce_scatter, all_gather   (N-1)/N x payload
//   broadcast        payload (once per rank except the last of the chain; counted on every rank)
//   send             payload                    recv, barrier                0
// A world of one sends nothing. These are the algorithm's bytes, not a measurement of the wire
// (NCCL may pick trees, MPI other algorithms; the volume of a ring is the lower bound for
// bandwidth-bound sizes).
//
// Thread-safety: as the wrapped communicator (one thread at a time); the counters are read by
// the same thread. split() returns the wrapped communicator's split, uncounted.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "collectives/communicator.hpp"

namespace zero::coll {

enum class CallKind { all_reduce, reduce_scatter, all_gather, broadcast, send, recv, barrier };
inline constexpr int kCallKinds = 7;

struct Traffic {
  struct Count {
    int64_t calls = 0;
    int64_t payload_bytes = 0;  // the caller's buffer, as above
    double ring_bytes = 0;      // bytes this rank sends under a ring algorithm
  };
  std::array<Count, kCallKinds> by_kind{};
  const Count& operator[](CallKind k) const noexcept { return by_kind[static_cast<size_t>(k)]; }
  double ring_bytes() const noexcept;  // over every kind
  int64_t calls() const noexcept;
};

class CountingCommunicator final : public Communicator {
 public:
  // `inner` must outlive this.
  explicit CountingCommunicator(Communicator& inner);

  const Traffic& traffic() const noexcept { return traffic_; }
  void reset() noexcept { traffic_ = Traffic{}; }
  Communicator& inner() noexcept { return inner_; }

  DeviceKind kind() const noexcept override { return inner_.kind(); }
  Stream& stream() noexcept override { return inner_.stream(); }
  Work all_gather(const void* send, void* recv, size_t count, DType dtype, Event* after = nullptr) override;
  Work reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                      Event* after = nullptr) override;
  Work all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                  Event* after = nullptr) override;
  Work broadcast(void* buf, size_t count, DType dtype, int root, Event* after = nullptr) override;
  Work barrier(Event* after = nullptr) override;
  std::vector<Work> batch_send_recv(std::span<const P2POp> ops, Event* after = nullptr) override;
  std::unique_ptr<Communicator> split(int color, int key) override { return inner_.split(color, key); }

 private:
  void add(CallKind k, size_t elems, DType dtype, double ring_factor);

  Communicator& inner_;
  Traffic traffic_;
};

}  // namespace zero::coll
