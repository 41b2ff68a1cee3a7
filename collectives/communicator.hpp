// The Communicator: asynchronous collectives over a group of ranks, the face of collectives/.
//
//   all_gather      recv[q*count, (q+1)*count) = send of rank q          (count per rank)
//   reduce_scatter  recv[0, count) = op over ranks q of send_q[rank*count, (rank+1)*count)
//   all_reduce      recv[0, count) = op over ranks q of send_q[0, count)
//   broadcast       buf of every rank = buf of `root`
//   barrier         completes once every rank has reached it
//   send / recv     point-to-point: buf of this rank -> buf of `peer` (see "Send and receive")
//
// Backends: MPI for host buffers (make_mpi_communicator), NCCL for device buffers
// (make_nccl_communicator); make_communicator picks by the device's kind.
//
// Asynchrony. Every call returns at once with a Work handle; the collective runs on the
// communicator's own stream (MPI: a cpu executor whose worker drives MPI, so progress never
// needs the caller to poll; NCCL: a CUDA stream of its own). Collectives of one communicator
// run in the order they were called, and every rank must call them in the same order. `after`
// (optional, an event of the communicator's stream kind) makes the collective start only once
// the event has completed: record it on the stream that produced the input.
//
// Buffers. `send` and `recv` must stay valid and untouched (send: unwritten; recv: unread and
// unwritten) until the Work completes. In place: all_gather when send == recv + rank*count
// (elements), reduce_scatter when recv == send + rank*count, all_reduce when send == recv.
// Otherwise send and recv must not overlap. count = 0 is allowed everywhere.
//
// Arithmetic. Sums accumulate in fp32 for every dtype, adding ranks in rank order 0, 1, ...,
// N-1, and 16-bit results are rounded once (to nearest even) at the end: a 16-bit sum is the
// correctly rounded fp32 rank-order sum, and the result does not depend on message sizes,
// segmenting or which backend algorithm ran. all_reduce(sum) gives bitwise the values
// reduce_scatter(sum) gives for the same inputs. avg = that sum divided by the number of ranks,
// rounded once. max propagates NaN; among equal values (+0, -0) the lower rank's wins. Every
// NaN a reduction produces is the canonical quiet NaN (fp32 0x7fc00000, fp16 0x7e00, bf16
// 0x7fc0), the same on every backend; a world of one copies bits unchanged.
//
// A world of one rank does no communication and no copy it need not do (an in-place call is a
// marker on the stream; an out-of-place one is one copy).
//
// Send and receive (point-to-point, for pipeline stages: docs/collectives.md, "Send and receive").
//   send(buf, count, dtype, peer) on rank A and recv(buf, count, dtype, A) on rank `peer` move
//   `count` elements. Not collective: only the two ranks take part. Like the collectives they
//   return at once; the transfer starts once `after` has completed. The send's Work completes
//   when `buf` may be reused, the recv's when `buf` holds the data. Both sides must agree on
//   count and dtype (MPI: a different element count is an error on the receiver naming both
//   ranks; NCCL cannot check it). Between one pair of ranks, the sends from A to B match B's
//   receives from A in the order each side posted them (per direction; the two directions and
//   different peers are independent). count = 0: no message at all, on either side; the Work
//   completes after `after`. A peer outside [0, size) or equal to rank() throws zero::Error at
//   the call (a world of one has no peer). Sends and receives are not ordered with this
//   communicator's collectives: use the Works' events.
//
//   Deadlock rules. MPI: any order is safe. Every send and recv is posted as a nonblocking
//   MPI_Isend/MPI_Irecv (tag kP2pTag, distinct from the collectives' own messages) by the
//   communicator's worker, which never waits for it; completion is watched by one helper stream
//   per (peer, direction) that polls MPI_Test, so a receive that has not been matched yet never
//   holds back a later send, and a send's completion never holds back a recv from another
//   channel. So two neighbours may both post their sends before their receives.
//   NCCL: ncclSend/ncclRecv are blocking for the GPU stream they run on, so two ranks that each
//   post a lone send to the other before their recv would both wait forever. Calls to
//   batch_send_recv() are fused into one ncclGroupStart/End and progress together: post a
//   send and a recv that must overlap (a stage's activation out and gradient in) as ONE batch.
//   Lone send()/recv() calls (batches of one) run one after another on the communicator's
//   stream; their order must then be compatible on both ranks (e.g. the lower rank sends first).
//   A portable caller (the pipeline executor) batches every send/recv pair that must overlap.
//
// Thread-safety: calls on one Communicator must come from one thread at a time. Different
// communicators (e.g. split() results) may be used from different threads.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/stream.hpp"

namespace zero::coll {

enum class ReduceOp { sum, avg, max };
std::string_view to_string(ReduceOp op) noexcept;

// A collective in flight. Cheap to copy; all copies refer to the same completion.
class Work {
 public:
  Work() = default;  // already complete
  explicit Work(std::shared_ptr<Event> done) : done_(std::move(done)) {}

  // Blocks the calling thread until the collective completed on this rank; rethrows its error.
  void wait();
  // True once complete. Never blocks and never calls into MPI or NCCL.
  bool test();
  // Makes later work on `stream` wait for the collective, without blocking the caller.
  void chain(Stream& stream);
  // The completion event (null for a Work that was complete from the start).
  const std::shared_ptr<Event>& event() const noexcept { return done_; }

 private:
  std::shared_ptr<Event> done_;
};

// One operation of batch_send_recv(): a send of `count` elements of `buf` to `peer`, or a recv
// into `buf` from `peer`.
struct P2POp {
  enum class Kind { send, recv };
  Kind kind;
  void* buf;  // a send only reads it
  size_t count;
  DType dtype;
  int peer;

  static P2POp send(const void* buf, size_t count, DType dtype, int peer) {
    return {Kind::send, const_cast<void*>(buf), count, dtype, peer};
  }
  static P2POp recv(void* buf, size_t count, DType dtype, int peer) {
    return {Kind::recv, buf, count, dtype, peer};
  }
};

// The tag of point-to-point messages on the MPI backend (the collectives' exchange uses tag 0).
inline constexpr int kP2pTag = 17;

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // cpu: host buffers, MPI. cuda: device buffers, NCCL.
  virtual DeviceKind kind() const noexcept = 0;
  // The stream every collective of this communicator runs on.
  virtual Stream& stream() noexcept = 0;

  virtual Work all_gather(const void* send, void* recv, size_t count, DType dtype,
                          Event* after = nullptr) = 0;
  virtual Work reduce_scatter(const void* send, void* recv, size_t count, DType dtype,
                              ReduceOp op, Event* after = nullptr) = 0;
  virtual Work all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                          Event* after = nullptr) = 0;
  virtual Work broadcast(void* buf, size_t count, DType dtype, int root,
                         Event* after = nullptr) = 0;
  virtual Work barrier(Event* after = nullptr) = 0;

  // Point-to-point (see "Send and receive" above). Each is a batch of one operation.
  Work send(const void* buf, size_t count, DType dtype, int peer, Event* after = nullptr);
  Work recv(void* buf, size_t count, DType dtype, int peer, Event* after = nullptr);
  // Posts `ops` together, after `after`; returns one Work per op, in the order of `ops`. The
  // ops progress independently of each other (NCCL: one group), so a send and a recv that
  // must overlap go here together. Throws zero::Error before posting anything if an op names a
  // bad peer.
  virtual std::vector<Work> batch_send_recv(std::span<const P2POp> ops,
                                            Event* after = nullptr) = 0;

  // A sub-communicator of the ranks that pass the same `color` (>= 0), ordered by `key` then
  // by rank here; color < 0: this rank joins none and gets null. Collective over this
  // communicator; blocks until the new communicator exists (a set-up call, not for the step).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

 protected:
  Communicator(int rank, int size) : rank_(rank), size_(size) {}
  // The checks every backend makes before posting a batch: each op's peer is another rank of
  // this communicator. Throws zero::Error naming the op, this rank and the peer.
  void check_p2p(std::span<const P2POp> ops) const;

 private:
  int rank_, size_;
};

// The communicator's own scratch buffers (bounded, persistent, allocated once) come from
// `device` and are counted in its ledger as communication buffers; `device` must outlive the
// communicator.

// MPI backend over (a duplicate of) `comm`; host buffers. Collective over `comm`. On a cuda
// device its scratch is host memory (allocate_host); on a cpu device, device memory.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, Device& device);

// NCCL backend over the ranks of `comm` on the cuda `device`; device buffers. Rank 0 creates the
// ncclUniqueId and broadcasts it over `comm`. Collective over `comm`. Throws zero::Error when
// the cuda backend is not built, `device` is not a cuda device, or NCCL cannot start.
std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, Device& device);

// The backend for `device`: MPI for cpu, NCCL for cuda.
std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, Device& device);

}  // namespace zero::coll
