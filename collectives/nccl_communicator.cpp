// The NCCL backend of the Communicator (communicator.hpp): device buffers, one CUDA stream.
//
// all_gather, broadcast and barrier are NCCL's own collectives. reduce_scatter and all_reduce are
// not NCCL's reductions: those add in ring order and round 16-bit values at every hop, and our
// contract is the fp32 rank-order sum rounded once. Instead every rank exchanges raw (native
// dtype) segments with every peer and reduces them itself with cuda_reduce_async, which adds the
// N contributions in rank order 0, 1, ..., N-1 in fp32:
//
//   reduce_scatter, rank r, for each segment k of its chunk (at most seg elements per peer):
//     grouped ncclSend of send[p*count + k*seg ...] to every peer p, and
//     grouped ncclRecv of every peer's contribution to chunk r into scratch slot s = k % 2;
//     then reduce (own chunk for q == r, scratch for the others) into recv[k*seg ...].
//   all_reduce: the same exchange over parts of the buffer (part q = [q*b, (q+1)*b), b = count/N
//     rounded down; the last part also takes the count % N leftover elements), each rank's part
//     reduced in place in recv, then gathered in place: ncclAllGather of the b-element parts plus,
//     when count % N != 0, an ncclBroadcast of the leftover from the last rank.
//
// send / recv: ncclSend / ncclRecv on the comm stream. A batch (batch_send_recv) is one
// ncclGroupStart/End, so its ops progress together and two neighbours exchanging an activation
// and a gradient cannot block each other; NCCL runs a group's ops to the same peer in order and
// matches a pair's sends and recvs in issue order. Lone calls are blocking for the stream
// (communicator.hpp, "Deadlock rules"). Every op of a batch completes with the group, so all
// get the same Work. The peers' p2p connections exist from creation (connect_every_peer).
//
// Streams and hand-offs. Collectives run on the communicator's stream (the "comm" stream, high
// priority). The reduction kernels run on a second internal stream ("reduce"), so the exchange
// of segment k + 1 proceeds while segment k is being reduced; the scratch holds two slots of
// (N - 1) x seg elements for that. Per segment k in slot s:
//   comm:   [wait reduced[s]: segment k - 2 has finished reading slot s]  send/recv into s,
//           record arrived[s]
//   reduce: wait arrived[s]: slot s holds segment k  reduce kernel  record reduced[s]
//   comm, after the last segment: wait reduced[last] (the reduce stream is in order, so that
//           covers every kernel), then the gather phase or the Work's completion event.
// The reduce stream never runs ahead of the comm stream's `after` wait, since it only starts
// behind arrived[s]; and the comm stream's completion event covers the kernels.
//
// A world of one rank creates no NCCL communicator at all: every collective is a marker on the
// stream (in place) or one device-to-device copy (out of place), as communicator.hpp asks. The
// bits pass unchanged there (a NaN keeps its payload); with more ranks a NaN result of a reduction
// is the canonical one (cuda/reduce_kernel.hpp).
//
// Connections at creation, not at first use. NCCL (2.22 and later) sets up its connections and
// their buffers lazily by default: a pair of ranks' point-to-point channels at their first
// send/recv, a collective's rings/trees at its first call. Here that first call comes after the
// first backward has grown the stream-ordered pool to its peak, so a model that fits by a few
// hundred MiB would fail inside NCCL in the middle of step 1, an error the ledger never sees.
// So creation connects everything we use, while the GPU is still empty:
//   - collectives: NCCL_RUNTIME_CONNECT=0 (set for the process before the first communicator,
//     unless the user set it) makes ncclCommInitRank connect rings and trees itself;
//   - point-to-point: NCCL connects a peer's channels at the first send/recv to it whatever the
//     size, and NCCL_RUNTIME_CONNECT does not cover them: a one-element exchange with every peer
//     at creation does (plus one barrier all-reduce);
// and the memory NCCL took over all of it (cudaMemGetInfo before and after) is charged to the
// device (cuda/outside_ledger.hpp): the ledger's capacity shrinks by it.
//
// Lifetime: destroy a communicator on every one of its ranks at the same point of the program
// (ncclCommDestroy may wait for the peers), after its work; the destructor waits for its streams.
//
// Limits: counts are size_t throughout (NCCL takes size_t counts); an all_gather's or
// reduce_scatter's N * count elements must fit in size_t bytes. Any number of ranks: past 32
// ranks the reduction runs in passes through an fp32 accumulator (see cuda/reduce_kernel.hpp).
//
// Tunables (one place): the scratch per peer and slot is ZERO_NCCL_SEGMENT_BYTES when set (a byte
// size like "1MiB", rounded down to a multiple of 256 B, at least 256 B); by default it is
// kScratchBudget / (2 (N - 1)) clamped to [kSegmentMin, kSegmentMax]. Every rank uses the
// smallest value any rank asked for, so the ranks' segments always match.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.hpp"
#include "collectives/cuda/reduce_kernel.hpp"
#include "core/cuda/checks.hpp"
#include "core/cuda/outside_ledger.hpp"
#include "core/cuda/stream.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/ledger.hpp"
#include "core/log.hpp"
#include "core/mpi_check.hpp"

namespace zero::coll {

namespace {

constexpr size_t kSegmentMax = size_t(4) << 20;      // bytes per peer and slot
constexpr size_t kSegmentMin = size_t(64) << 10;     // bytes per peer and slot
constexpr size_t kScratchBudget = size_t(64) << 20;  // both slots, all peers, before clamping
constexpr size_t kSegmentAlign = 256;                // keeps every slot 16-byte aligned and more
constexpr const char* kSegmentEnv = "ZERO_NCCL_SEGMENT_BYTES";

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
  }
  ZERO_FAIL("nccl communicator: unknown dtype " + std::to_string(int(t)));
}

// This rank's choice of segment bytes per peer and slot, before the ranks agree on the smallest.
size_t local_segment_bytes(int size) {
  if (const char* env = std::getenv(kSegmentEnv); env && *env) {
    const auto v = parse_byte_size(env);
    ZERO_REQUIRE(v && *v >= static_cast<long long>(kSegmentAlign),
                 std::string(kSegmentEnv) + "='" + env +
                     "' is not a byte size of at least 256\nHINT: e.g. " + kSegmentEnv +
                     "=1MiB, or unset it for the default (at most 4 MiB per peer)");
    return size_t(*v) / kSegmentAlign * kSegmentAlign;
  }
  const size_t per_peer = kScratchBudget / (2 * size_t(size - 1));
  return std::clamp(per_peer, kSegmentMin, kSegmentMax) / kSegmentAlign * kSegmentAlign;
}

// Makes `device` current for the calling thread and restores the previous one on exit, so a
// collective called from a thread working on another GPU leaves that thread as it was.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    ZERO_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) ZERO_CHECK_CUDA(cudaSetDevice(device));
    changed_ = previous_ != device;
  }
  ~DeviceScope() {
    if (changed_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// An owned MPI communicator, freed on destruction unless MPI has been finalised by then.
class MpiComm {
 public:
  explicit MpiComm(MPI_Comm c = MPI_COMM_NULL) : c_(c) {}
  MpiComm(MpiComm&& o) noexcept : c_(std::exchange(o.c_, MPI_COMM_NULL)) {}
  MpiComm& operator=(MpiComm&&) = delete;
  ~MpiComm() {
    if (c_ == MPI_COMM_NULL) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && MPI_Comm_free(&c_) != MPI_SUCCESS)
      log::error("MPI_Comm_free failed for an NCCL communicator's bootstrap communicator");
  }
  MPI_Comm get() const noexcept { return c_; }

 private:
  MPI_Comm c_;
};

// ncclGroupStart ... ncclGroupEnd. end() reports NCCL's error; if an exception leaves the scope
// first, the group is still closed, so this thread's NCCL group depth stays balanced.
class NcclGroup {
 public:
  explicit NcclGroup(ncclComm_t comm) : comm_(comm) { ZERO_CHECK_NCCL(ncclGroupStart()); }
  ~NcclGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  void end() {
    open_ = false;
    ZERO_CHECK_NCCL_COMM(ncclGroupEnd(), comm_);
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

 private:
  ncclComm_t comm_;
  bool open_ = true;
};

const std::byte* bytes_at(const void* p, size_t offset) {
  return static_cast<const std::byte*>(p) + offset;
}
std::byte* bytes_at(void* p, size_t offset) { return static_cast<std::byte*>(p) + offset; }

// communicator.hpp: outside the in-place layouts, send and recv must not overlap.
void require_disjoint(const void* send, size_t send_bytes, const void* recv, size_t recv_bytes,
                      const char* op, const char* in_place_rule) {
  const auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  const bool overlap = send_bytes && recv_bytes && s < r + recv_bytes && r < s + send_bytes;
  ZERO_REQUIRE(!overlap, std::string("nccl ") + op +
                             ": send and recv overlap without being the in-place layout (" +
                             in_place_rule +
                             ")\nHINT: use that exact layout for an in-place call, or buffers "
                             "that do not overlap");
}

// The parts a reduction exchange works on: part q (the elements rank q reduces) starts at element
// q * stride of every rank's send buffer and has `stride` elements, the last part `extra` more.
struct Parts {
  size_t stride;
  size_t extra;
  size_t length(int q, int n) const { return stride + (q == n - 1 ? extra : 0); }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MpiComm mpi, Device& device, int rank, int size)
      : Communicator(rank, size), mpi_(std::move(mpi)), device_(device), dev_(device.index()) {
    DeviceScope scope(dev_);
    stream_ = cuda::make_stream(dev_, "nccl", /*high_priority=*/true);
    if (size == 1) return;  // a world of one communicates with nobody: no NCCL, no scratch

    reduce_stream_ = cuda::make_stream(dev_, "nccl-reduce", /*high_priority=*/true);
    for (int s = 0; s < 2; ++s) {
      arrived_[s] = cuda::make_event(dev_);
      reduced_[s] = cuda::make_event(dev_);
    }

    // Every rank must cut the same segments, so all take the smallest request.
    unsigned long long seg = local_segment_bytes(size);
    ZERO_CHECK_MPI(
        MPI_Allreduce(MPI_IN_PLACE, &seg, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, mpi_.get()));
    segment_bytes_ = size_t(seg);
    scratch_ = device.allocate(2 * size_t(size - 1) * segment_bytes_, MemCategory::comm_buffers);
    if (size > kCudaReduceInputsPerPass) {
      // fp32 accumulator for one segment; 16-bit segments have the most elements.
      accumulator_ = device.allocate(segment_bytes_ / 2 * sizeof(float), MemCategory::comm_buffers);
    }
    barrier_ = device.allocate(sizeof(float), MemCategory::comm_buffers);
    // With an allocation stream set (device.hpp), these buffers come from cudaMallocAsync on that
    // stream, and this communicator's streams may use them only once it has reached the
    // allocations. zero-train builds its grid's communicators after setting one. A set-up call:
    // wait for the device.
    ZERO_CHECK_CUDA(cudaDeviceSynchronize());
    // Zero, and stays zero: the barrier sums zeros.
    ZERO_CHECK_CUDA(cudaMemsetAsync(barrier_.data(), 0, sizeof(float), comm_stream()));

    // Rank 0 creates the id and broadcasts it together with whether that worked, so a failure
    // there is an error on every rank instead of a hang in the others.
    struct {
      int ok;
      ncclUniqueId id;
    } boot{};
    std::exception_ptr boot_error;
    if (rank == 0) {
      try {
        ZERO_CHECK_NCCL(ncclGetUniqueId(&boot.id));
        boot.ok = 1;
      } catch (...) {
        boot_error = std::current_exception();
      }
    }
    ZERO_CHECK_MPI(MPI_Bcast(&boot, int(sizeof boot), MPI_BYTE, 0, mpi_.get()));
    if (boot_error) std::rethrow_exception(boot_error);
    ZERO_REQUIRE(boot.ok, "rank 0 could not create the NCCL unique id (its error says why)");
    // The memset above must be done before the warm-up's barrier; it is on the same stream.
    cuda::count_outside_ledger(device, "NCCL communicator", [&] {
      ZERO_CHECK_NCCL(ncclCommInitRank(&nccl_, size, boot.id, rank));
      try {
        connect_every_peer();
      } catch (...) {
        // The destructor does not run for a constructor that throws: drop the communicator here
        // (abort, not destroy: the peers may never arrive).
        (void)ncclCommAbort(nccl_);
        nccl_ = nullptr;
        throw;
      }
    });
  }

  ~NcclCommunicator() override {
    // Let submitted work finish (it uses the scratch and the NCCL communicator), then free.
    // Destructors never throw: failures are logged.
    for (Stream* s : {stream_.get(), reduce_stream_.get()}) {
      if (!s) continue;
      try {
        s->synchronize();
      } catch (const std::exception& e) {
        log::error("nccl communicator: stream '" + s->name() +
                   "' failed before destruction: " + e.what());
      }
    }
    if (nccl_) {
      const ncclResult_t rc = ncclCommDestroy(nccl_);
      if (rc != ncclSuccess)
        log::error(std::string("nccl communicator: ncclCommDestroy failed: ") +
                   ncclGetErrorString(rc));
    }
  }

  DeviceKind kind() const noexcept override { return DeviceKind::cuda; }
  Stream& stream() noexcept override { return *stream_; }

  Work all_gather(const void* send, void* recv, size_t count, DType dtype, Event* after) override {
    const size_t bytes = count * size_of(dtype);
    const bool in_place = send == bytes_at(recv, size_t(rank()) * bytes);
    if (!in_place)
      require_disjoint(send, bytes, recv, size_t(size()) * bytes, "all_gather",
                       "send == recv + rank * count");
    DeviceScope scope(dev_);
    begin(after);
    if (count > 0) {
      if (size() == 1) {
        if (!in_place) copy(recv, send, bytes);
      } else {
        // NCCL's in-place convention is ours: sendbuff == recvbuff + rank * sendcount.
        ZERO_CHECK_NCCL_COMM(
            ncclAllGather(send, recv, count, nccl_type(dtype), nccl_, comm_stream()), nccl_);
      }
    }
    return complete();
  }

  Work reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                      Event* after) override {
    const size_t bytes = count * size_of(dtype);
    const bool in_place = recv == bytes_at(send, size_t(rank()) * bytes);
    if (!in_place)
      require_disjoint(send, size_t(size()) * bytes, recv, bytes, "reduce_scatter",
                       "recv == send + rank * count");
    DeviceScope scope(dev_);
    begin(after);
    if (count > 0) {
      if (size() == 1) {
        if (!in_place) copy(recv, send, bytes);  // avg divides by 1: the values themselves
      } else {
        exchange_and_reduce(send, Parts{count, 0}, recv, dtype, op);
      }
    }
    return complete();
  }

  Work all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                  Event* after) override {
    const size_t es = size_of(dtype);
    const bool in_place = send == recv;
    if (!in_place)
      require_disjoint(send, count * es, recv, count * es, "all_reduce", "send == recv");
    DeviceScope scope(dev_);
    begin(after);
    if (count > 0) {
      if (size() == 1) {
        if (!in_place) copy(recv, send, count * es);
      } else {
        const int n = size();
        const Parts parts{count / size_t(n), count % size_t(n)};
        // This rank's part, reduced into its place in recv (in place: where it already is).
        exchange_and_reduce(send, parts, bytes_at(recv, size_t(rank()) * parts.stride * es), dtype,
                            op);
        // Gather the reduced parts in place: equal b-element parts first, then the leftover
        // count % N elements that the last rank reduced after its own b.
        const ncclDataType_t type = nccl_type(dtype);
        NcclGroup group(nccl_);
        if (parts.stride > 0) {
          ZERO_CHECK_NCCL_COMM(ncclAllGather(bytes_at(recv, size_t(rank()) * parts.stride * es),
                                             recv, parts.stride, type, nccl_, comm_stream()),
                               nccl_);
        }
        if (parts.extra > 0) {
          void* tail = bytes_at(recv, size_t(n) * parts.stride * es);
          ZERO_CHECK_NCCL_COMM(
              ncclBroadcast(tail, tail, parts.extra, type, n - 1, nccl_, comm_stream()), nccl_);
        }
        group.end();
      }
    }
    return complete();
  }

  Work broadcast(void* buf, size_t count, DType dtype, int root, Event* after) override {
    ZERO_REQUIRE(root >= 0 && root < size(), "nccl broadcast: root " + std::to_string(root) +
                                                 " is not a rank of this communicator (size " +
                                                 std::to_string(size()) + ")");
    DeviceScope scope(dev_);
    begin(after);
    if (count > 0 && size() > 1) {
      ZERO_CHECK_NCCL_COMM(
          ncclBroadcast(buf, buf, count, nccl_type(dtype), root, nccl_, comm_stream()), nccl_);
    }
    return complete();
  }

  Work barrier(Event* after) override {
    DeviceScope scope(dev_);
    begin(after);
    if (size() > 1) {
      ZERO_CHECK_NCCL_COMM(ncclAllReduce(barrier_.data(), barrier_.data(), 1, ncclFloat32, ncclSum,
                                         nccl_, comm_stream()),
                           nccl_);
    }
    return complete();
  }

  std::vector<Work> batch_send_recv(std::span<const P2POp> ops, Event* after) override {
    check_p2p(ops);  // with one rank every op is rejected here, so nccl_ exists below
    DeviceScope scope(dev_);
    begin(after);
    bool any = false;
    for (const P2POp& op : ops) any = any || op.count > 0;
    if (any) {
      NcclGroup group(nccl_);
      for (const P2POp& op : ops) {
        if (op.count == 0) continue;  // no message (communicator.hpp)
        if (op.kind == P2POp::Kind::send) {
          ZERO_CHECK_NCCL_COMM(
              ncclSend(op.buf, op.count, nccl_type(op.dtype), op.peer, nccl_, comm_stream()),
              nccl_);
        } else {
          ZERO_CHECK_NCCL_COMM(
              ncclRecv(op.buf, op.count, nccl_type(op.dtype), op.peer, nccl_, comm_stream()),
              nccl_);
        }
      }
      group.end();
    }
    return std::vector<Work>(ops.size(), complete());
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    // A set-up call: let this communicator's queued work drain first, so no kernel of ours is
    // waiting on peers while they create the new communicator.
    {
      DeviceScope scope(dev_);
      stream_->synchronize();
    }
    MPI_Comm sub = MPI_COMM_NULL;
    ZERO_CHECK_MPI(MPI_Comm_split(mpi_.get(), color < 0 ? MPI_UNDEFINED : color, key, &sub));
    if (sub == MPI_COMM_NULL) return nullptr;
    MpiComm owned(sub);  // make_nccl_communicator keeps a duplicate
    return make_nccl_communicator(sub, device_);
  }

 private:
  cudaStream_t comm_stream() { return cuda::native(*stream_); }

  // Later work on the comm stream waits for `after` (recorded by the input's producer).
  void begin(Event* after) {
    if (after) stream_->wait(*after);
  }

  // The Work of everything enqueued so far on the comm stream: a fresh event recorded there.
  Work complete() {
    std::shared_ptr<Event> done = cuda::make_event(dev_);
    stream_->record(*done);
    return Work(std::move(done));
  }

  void copy(void* dst, const void* src, size_t bytes) {
    ZERO_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, comm_stream()));
  }

  // The warm-up exchange of the constructor (see the top of the file): one float from the barrier
  // word (zero) to every peer and one from each into its scratch slot, then one barrier. Waits
  // for it, so NCCL's connections and buffers exist when the constructor returns.
  void connect_every_peer() {
    {
      NcclGroup group(nccl_);
      for (int p = 0; p < size(); ++p) {
        if (p == rank()) continue;
        ZERO_CHECK_NCCL_COMM(ncclSend(barrier_.data(), 1, ncclFloat32, p, nccl_, comm_stream()),
                             nccl_);
        ZERO_CHECK_NCCL_COMM(ncclRecv(slot(0, p), 1, ncclFloat32, p, nccl_, comm_stream()), nccl_);
      }
      group.end();
    }
    ZERO_CHECK_NCCL_COMM(ncclAllReduce(barrier_.data(), barrier_.data(), 1, ncclFloat32, ncclSum,
                                       nccl_, comm_stream()),
                         nccl_);
    stream_->synchronize();
  }

  // Scratch slot of peer p (every rank but this one, in rank order) in slot s.
  std::byte* slot(int s, int peer) {
    const int index = peer < rank() ? peer : peer - 1;
    return scratch_.as<std::byte>() +
           (size_t(s) * size_t(size() - 1) + size_t(index)) * segment_bytes_;
  }

  // The pairwise exchange and rank-order reduction of `parts` (see the top of the file): rank r
  // ends with op over q of send_q[part r] in out[0, parts.length(r)).
  void exchange_and_reduce(const void* send, const Parts& parts, void* out, DType dtype,
                           ReduceOp op) {
    const int n = size(), me = rank();
    const size_t es = size_of(dtype);
    const size_t seg = segment_bytes_ / es;  // elements per peer and segment
    const ncclDataType_t type = nccl_type(dtype);
    const size_t longest = parts.stride + parts.extra;  // the last part's; same on every rank
    const size_t segments = (longest + seg - 1) / seg;
    const size_t my_length = parts.length(me, n);
    auto segment_length = [&](size_t part_length, size_t offset) {
      return offset < part_length ? std::min(seg, part_length - offset) : size_t(0);
    };

    std::vector<const void*> inputs(size_t(n), nullptr);
    int last_slot = -1;  // slot of the last segment reduced here
    for (size_t k = 0; k < segments; ++k) {
      const size_t offset = k * seg;
      const int s = int(k % 2);
      const size_t mine = segment_length(my_length, offset);

      // Slot s was last read by segment k - 2's reduction (or an earlier collective's, which the
      // comm stream already waited for); new data may land only after it.
      if (k >= 2) stream_->wait(*reduced_[s]);
      {
        NcclGroup group(nccl_);
        for (int p = 0; p < n; ++p) {
          if (p == me) continue;
          const size_t theirs = segment_length(parts.length(p, n), offset);
          if (theirs > 0) {
            const void* src = bytes_at(send, (size_t(p) * parts.stride + offset) * es);
            ZERO_CHECK_NCCL_COMM(ncclSend(src, theirs, type, p, nccl_, comm_stream()), nccl_);
          }
          if (mine > 0)
            ZERO_CHECK_NCCL_COMM(ncclRecv(slot(s, p), mine, type, p, nccl_, comm_stream()), nccl_);
        }
        group.end();
      }
      if (mine == 0) continue;  // this rank's part is shorter than the longest: nothing arrived

      // Hand-off: slot s holds every peer's segment k once `arrived[s]` has passed.
      stream_->record(*arrived_[s]);
      reduce_stream_->wait(*arrived_[s]);
      for (int q = 0; q < n; ++q) {
        inputs[size_t(q)] = q == me ? bytes_at(send, (size_t(me) * parts.stride + offset) * es)
                                    : static_cast<const void*>(slot(s, q));
      }
      cuda_reduce_async(dtype, op, n, inputs.data(), n, bytes_at(out, offset * es), mine,
                        cuda::native(*reduce_stream_), accumulator_.as<float>());
      // Hand-off back: slot s may be refilled once `reduced[s]` has passed.
      reduce_stream_->record(*reduced_[s]);
      last_slot = s;
    }
    // The comm stream (and so the Work, and the next collective) continues after every kernel.
    if (last_slot >= 0) stream_->wait(*reduced_[last_slot]);
  }

  MpiComm mpi_;  // duplicate of the bootstrap communicator, for split()
  Device& device_;
  const int dev_;
  ncclComm_t nccl_ = nullptr;  // null in a world of one
  size_t segment_bytes_ = 0;   // per peer and slot
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Stream> reduce_stream_;
  std::unique_ptr<Event> arrived_[2];  // comm -> reduce: slot s holds segment k
  std::unique_ptr<Event> reduced_[2];  // reduce -> comm: slot s has been read
  Buffer scratch_;                     // 2 slots x (N - 1) peers x segment_bytes_
  Buffer accumulator_;                 // fp32 partial sums, only past 32 ranks
  Buffer barrier_;                     // one float, always zero
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, Device& device) {
  ZERO_REQUIRE(device.kind() == DeviceKind::cuda,
               "make_nccl_communicator needs a cuda device, got " + device.name() +
                   "\nHINT: cpu devices use make_mpi_communicator (make_communicator picks the "
                   "backend from the device)");
  // NCCL reads its parameters once per process, at the first communicator: set before it (see
  // the top of the file). A value the user set wins (NCCL_RUNTIME_CONNECT=1: lazy, NCCL's default).
  static std::once_flag eager;
  std::call_once(eager, [] { ::setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0); });
  MPI_Comm dup = MPI_COMM_NULL;
  ZERO_CHECK_MPI(MPI_Comm_dup(comm, &dup));
  MpiComm owned(dup);
  ZERO_CHECK_MPI(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
  int rank = 0, size = 1;
  ZERO_CHECK_MPI(MPI_Comm_rank(dup, &rank));
  ZERO_CHECK_MPI(MPI_Comm_size(dup, &size));
  return std::make_unique<NcclCommunicator>(std::move(owned), device, rank, size);
}

}  // namespace zero::coll
