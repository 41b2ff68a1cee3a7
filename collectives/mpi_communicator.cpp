// The MPI backend: host buffers, collectives run on a cpu stream (one worker thread) that
// drives MPI itself, so a collective progresses while the caller computes, without polling.
//
// Algorithms (chosen for exact, order-fixed arithmetic and for speed on Open MPI 4.1, whose
// MPI_Reduce_scatter_block reaches a fraction of its own all-reduce's bus bandwidth):
//   reduce_scatter  pairwise exchange in segments: rank r sends its piece of rank p's chunk to
//                   p and receives every rank's piece of chunk r (native dtype on the wire),
//                   then host_reduce adds the N pieces in rank order in fp32 and rounds once.
//                   Segment k+1's messages are posted before segment k is reduced. A segment is
//                   waited for by polling (wait_all), not MPI_Waitall, which spins.
//   all_reduce      the same reduce-scatter over N near-equal parts, then MPI_Allgatherv in
//                   place: bitwise the values reduce_scatter gives.
//   all_gather      MPI_Allgather; broadcast MPI_Bcast; barrier MPI_Barrier.
//   send / recv     MPI_Isend / MPI_Irecv with tag kP2pTag, posted by the worker in call order
//                   (so MPI's non-overtaking rule gives the per-pair order communicator.hpp
//                   promises); the worker never waits for them. Each (peer, direction) has a
//                   channel stream whose tasks poll MPI_Test for that channel's requests in
//                   order, then record the op's Work event: an unmatched recv holds back only
//                   later recvs from the same peer, never a send or another peer's traffic.
//                   Polling (not MPI_Wait, which Open MPI spins in) keeps an idle channel off
//                   the cores the ranks compute on; each poll drives MPI's progress engine.
//
// Scratch: 2 x (N-1) segments, allocated once from the Device (ledger: communication
// buffers) and pre-faulted, touched only by the worker thread.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/communicator.hpp"
#include "collectives/reduce_kernel.hpp"
#include "core/error.hpp"
#include "core/mpi_check.hpp"

namespace zero::coll {

namespace {

// Bytes per peer per segment: large enough to amortise per-message cost, small enough that
// posting the next segment early overlaps usefully and the scratch stays small.
constexpr size_t kSegmentBytes = 1 << 20;

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f16:
    case DType::bf16: return MPI_UINT16_T;  // moved as bits; arithmetic is ours
  }
  return MPI_BYTE;
}

int checked_count(size_t count, const char* what) {
  ZERO_REQUIRE(count <= static_cast<size_t>(INT_MAX),
               std::string("MPI communicator: ") + what + " of " + std::to_string(count) +
                   " elements per rank is over MPI's int count limit (2^31-1)\nHINT: use "
                   "smaller buckets (reduce_bucket_size / allgather_bucket_size)");
  return static_cast<int>(count);
}

// Polling of a p2p request: this many MPI_Test calls separated by a yield, then one every
// kPollSleep. The sleep bounds the latency a completed message can wait to be noticed (Linux
// adds its ~50 us timer slack) while costing an idle channel well under 1% of a core.
constexpr int kPollSpins = 64;
constexpr auto kPollSleep = std::chrono::microseconds(20);
// The collectives' segment exchange polls the same way but spins by time: a segment whose peer
// is ready completes within a few hundred microseconds of progress calls (shared-memory
// transfers move only while both sides poll), so the first kExchangeSpin are MPI_Testall calls
// separated by a yield; a peer still computing (milliseconds) is then waited for in kPollSleep
// naps, which leaves the core to this rank's compute thread (MPI_Waitall spun on it).
constexpr auto kExchangeSpin = std::chrono::milliseconds(1);

// The part of a buffer each rank reduces: [offset, offset + len) in elements.
struct Part {
  size_t offset = 0, len = 0;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm owned, int rank, int size, Device& device)
      : Communicator(rank, size), comm_(owned), device_(device),
        stream_(make_cpu_stream("mpi-comm")) {
    int level = 0;
    MPI_Query_thread(&level);
    ZERO_REQUIRE(level == MPI_THREAD_MULTIPLE,
                 "the MPI communicator needs MPI_THREAD_MULTIPLE (its worker thread calls MPI)"
                 "\nHINT: initialise MPI through zero::World::init, with an MPI built with "
                 "thread support");
    if (size > 1) {
      const size_t bytes = 2 * static_cast<size_t>(size - 1) * kSegmentBytes;
      scratch_ = device.kind() == DeviceKind::cpu
                     ? device.allocate(bytes, MemCategory::comm_buffers)
                     : device.allocate_host(bytes, MemCategory::comm_buffers);
      std::memset(scratch_.data(), 0, bytes);  // fault the pages in now, not inside a step
    }
  }

  ~MpiCommunicator() override {
    stream_.reset();  // drains every queued collective before the communicator goes
    channels_.clear();  // waits for every posted send and recv to complete
    // After MPI_Finalize (a communicator kept in a static) MPI may not be called; the process
    // is ending and MPI has released the communicator with everything else.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  DeviceKind kind() const noexcept override { return DeviceKind::cpu; }
  Stream& stream() noexcept override { return *stream_; }

  Work all_gather(const void* send, void* recv, size_t count, DType dt, Event* after) override {
    const size_t bytes = count * size_of(dt);
    auto* mine = static_cast<char*>(recv) + static_cast<size_t>(rank()) * bytes;
    const bool in_place = send == mine;
    if (size() == 1 || count == 0) return copy_or_mark(mine, send, in_place ? 0 : bytes, after);
    const int n = checked_count(count, "all_gather");
    return submit(after, [=, this] {
      ZERO_CHECK_MPI(MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(dt), recv, n,
                                   mpi_type(dt), comm_));
    });
  }

  Work reduce_scatter(const void* send, void* recv, size_t count, DType dt, ReduceOp op,
                      Event* after) override {
    const size_t esz = size_of(dt);
    const auto* mine = static_cast<const char*>(send) + static_cast<size_t>(rank()) * count * esz;
    if (size() == 1 || count == 0)
      return copy_or_mark(recv, mine, recv == mine ? 0 : count * esz, after);
    checked_count(count, "reduce_scatter");
    std::vector<Part> parts(static_cast<size_t>(size()));
    for (int q = 0; q < size(); ++q) parts[static_cast<size_t>(q)] = {static_cast<size_t>(q) * count, count};
    return submit(after, [=, this, parts = std::move(parts)] {
      exchange_and_reduce(send, recv, parts, dt, op);
    });
  }

  Work all_reduce(const void* send, void* recv, size_t count, DType dt, ReduceOp op,
                  Event* after) override {
    const size_t esz = size_of(dt);
    if (size() == 1 || count == 0) return copy_or_mark(recv, send, send == recv ? 0 : count * esz, after);
    checked_count(count, "all_reduce");
    // N near-equal parts: ceil(count / N) each, the last ones shorter or empty.
    const size_t n = static_cast<size_t>(size());
    const size_t chunk = (count + n - 1) / n;
    std::vector<Part> parts(n);
    std::vector<int> counts(n), displs(n);
    for (size_t q = 0; q < n; ++q) {
      const size_t off = std::min(count, q * chunk);
      parts[q] = {off, std::min(count, off + chunk) - off};
      counts[q] = static_cast<int>(parts[q].len);
      displs[q] = static_cast<int>(off);  // off <= count <= INT_MAX
    }
    char* my_out = static_cast<char*>(recv) + parts[static_cast<size_t>(rank())].offset * esz;
    return submit(after, [=, this, parts = std::move(parts), counts = std::move(counts),
                          displs = std::move(displs)] {
      exchange_and_reduce(send, my_out, parts, dt, op);
      ZERO_CHECK_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, mpi_type(dt), recv, counts.data(),
                                    displs.data(), mpi_type(dt), comm_));
    });
  }

  Work broadcast(void* buf, size_t count, DType dt, int root, Event* after) override {
    ZERO_REQUIRE(root >= 0 && root < size(), "broadcast root " + std::to_string(root) +
                                                 " is not a rank of this communicator (size " +
                                                 std::to_string(size()) + ")");
    if (size() == 1 || count == 0) return copy_or_mark(buf, buf, 0, after);
    const int n = checked_count(count, "broadcast");
    return submit(after, [=, this] { ZERO_CHECK_MPI(MPI_Bcast(buf, n, mpi_type(dt), root, comm_)); });
  }

  Work barrier(Event* after) override {
    if (size() == 1) return copy_or_mark(nullptr, nullptr, 0, after);
    return submit(after, [this] { ZERO_CHECK_MPI(MPI_Barrier(comm_)); });
  }

  std::vector<Work> batch_send_recv(std::span<const P2POp> ops, Event* after) override {
    check_p2p(ops);
    for (const P2POp& op : ops) checked_count(op.count, "send/recv");
    // The worker fills `requests`; each channel task reads its own entry after the `posted`
    // marker has passed (the marker's record/wait is the hand-off between the two threads).
    auto requests = std::make_shared<std::vector<MPI_Request>>(ops.size(), MPI_REQUEST_NULL);
    std::vector<P2POp> list(ops.begin(), ops.end());
    const Work posted = submit(after, [this, requests, list] {
      for (size_t i = 0; i < list.size(); ++i) {
        const P2POp& op = list[i];
        if (op.count == 0) continue;  // no message (communicator.hpp)
        const int n = static_cast<int>(op.count);
        MPI_Request* req = &(*requests)[i];
        if (op.kind == P2POp::Kind::send)
          ZERO_CHECK_MPI(MPI_Isend(op.buf, n, mpi_type(op.dtype), op.peer, kP2pTag, comm_, req));
        else
          ZERO_CHECK_MPI(MPI_Irecv(op.buf, n, mpi_type(op.dtype), op.peer, kP2pTag, comm_, req));
      }
    });
    std::vector<Work> works;
    works.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const P2POp op = list[i];
      if (op.count == 0) {
        works.push_back(posted);
        continue;
      }
      Stream& ch = channel(op.peer, op.kind);
      ch.wait(*posted.event());
      ch.launch_host([this, requests, i, op] { finish(&(*requests)[i], op); });
      std::shared_ptr<Event> done = make_cpu_event();
      ch.record(*done);
      works.emplace_back(std::move(done));
    }
    return works;
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    // On the worker, so it is ordered with (and never concurrent to) this communicator's
    // collectives, as MPI requires for collective calls on one communicator.
    stream_->launch_host([&] {
      ZERO_CHECK_MPI(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
    });
    stream_->synchronize();
    if (sub == MPI_COMM_NULL) return nullptr;
    ZERO_CHECK_MPI(MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN));
    int r = 0, s = 0;
    ZERO_CHECK_MPI(MPI_Comm_rank(sub, &r));
    ZERO_CHECK_MPI(MPI_Comm_size(sub, &s));
    return std::make_unique<MpiCommunicator>(sub, r, s, device_);
  }

 private:
  // Queues `task` after `after`, and returns a Work that completes when the task has run.
  Work submit(Event* after, std::function<void()> task) {
    if (after) {
      if (after->kind() == DeviceKind::cpu) {
        stream_->wait(*after);
      } else {
        // A cuda event (e.g. a D2H copy into the host buffer): the worker waits for it.
        stream_->launch_host([after] { after->synchronize(); });
      }
    }
    if (task) stream_->launch_host(std::move(task));
    std::shared_ptr<Event> done = make_cpu_event();
    stream_->record(*done);
    return Work(std::move(done));
  }

  // The channel stream of messages to (send) or from (recv) `peer`, made on first use.
  Stream& channel(int peer, P2POp::Kind kind) {
    auto& s = channels_[{peer, kind}];
    if (!s)
      s = make_cpu_stream(std::string("mpi-") + (kind == P2POp::Kind::send ? "to" : "from") +
                          std::to_string(peer));
    return *s;
  }

  // Runs on a channel stream: polls the request until it completes; checks a recv's size.
  void finish(MPI_Request* req, const P2POp& op) {
    const bool is_send = op.kind == P2POp::Kind::send;
    auto where = [&] {
      return std::string(is_send ? "send of " : "recv of ") + std::to_string(op.count) + " " +
             std::string(to_string(op.dtype)) + " elements " + (is_send ? "to" : "from") +
             " rank " + std::to_string(op.peer) + " on rank " + std::to_string(rank());
    };
    MPI_Status status;
    int done = 0;
    for (int spins = 0;; ++spins) {
      const int rc = MPI_Test(req, &done, &status);
      if (rc != MPI_SUCCESS) {
        char text[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(rc, text, &len);
        ZERO_FAIL("MPI communicator: " + where() + " failed: " + std::string(text, size_t(len)) +
                  "\nHINT: a recv must name the same count and dtype as the matching send");
      }
      if (done) break;
      if (spins < kPollSpins) std::this_thread::yield();
      else std::this_thread::sleep_for(kPollSleep);
    }
    if (is_send) return;
    int got = 0;
    ZERO_CHECK_MPI(MPI_Get_count(&status, mpi_type(op.dtype), &got));
    ZERO_REQUIRE(got == static_cast<int>(op.count),
                 "MPI communicator: " + where() + ": the message has " +
                     (got == MPI_UNDEFINED ? std::string("a size that is no whole number of")
                                           : std::to_string(got)) +
                     " elements\nHINT: a send and its recv must agree on count and dtype, and "
                     "both ranks must post their messages between the pair in the same order");
  }

  // No communication: copy `bytes` (0: nothing to copy, just a marker in stream order).
  Work copy_or_mark(void* dst, const void* src, size_t bytes, Event* after) {
    if (bytes == 0) return submit(after, nullptr);
    return submit(after, [=] { std::memmove(dst, src, bytes); });
  }

  // MPI_Waitall without its spinning (see kExchangeSpin). Runs on the worker thread.
  static void wait_all(std::vector<MPI_Request>& reqs) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      int done = 0;
      ZERO_CHECK_MPI(
          MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE));
      if (done) return;
      if (std::chrono::steady_clock::now() - start < kExchangeSpin)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(kPollSleep);
    }
  }

  // Rank r receives every rank's piece of part r and writes their reduction to `out`; it sends
  // its own piece of part p to rank p. Runs on the worker thread.
  void exchange_and_reduce(const void* send, void* out, const std::vector<Part>& parts, DType dt,
                           ReduceOp op) {
    const int n = size(), r = rank();
    const size_t esz = size_of(dt);
    const size_t seg = kSegmentBytes / esz;
    const Part mine = parts[static_cast<size_t>(r)];
    size_t longest = 0;
    for (const Part& p : parts) longest = std::max(longest, p.len);
    const size_t nseg = (longest + seg - 1) / seg;
    auto* src = static_cast<const char*>(send);
    auto* scratch = scratch_.as<char>();
    // Scratch slot of peer q (q != r) in double buffer b.
    auto slot = [&](int b, int q) {
      const int idx = q < r ? q : q - 1;
      return scratch + (static_cast<size_t>(b) * static_cast<size_t>(n - 1) + static_cast<size_t>(idx)) * kSegmentBytes;
    };
    auto seg_len = [&](const Part& p, size_t s) {
      const size_t o = s * seg;
      return o >= p.len ? size_t{0} : std::min(seg, p.len - o);
    };

    std::vector<MPI_Request> pending[2];
    auto post = [&](size_t s) {
      auto& reqs = pending[s % 2];
      reqs.clear();
      const size_t recv_len = seg_len(mine, s);
      for (int k = 1; k < n; ++k) {
        const int to = (r + k) % n, from = (r - k + n) % n;
        MPI_Request q;
        if (recv_len > 0) {
          ZERO_CHECK_MPI(MPI_Irecv(slot(static_cast<int>(s % 2), from), static_cast<int>(recv_len),
                                   mpi_type(dt), from, 0, comm_, &q));
          reqs.push_back(q);
        }
        const Part& theirs = parts[static_cast<size_t>(to)];
        const size_t send_len = seg_len(theirs, s);
        if (send_len > 0) {
          ZERO_CHECK_MPI(MPI_Isend(src + (theirs.offset + s * seg) * esz, static_cast<int>(send_len),
                                   mpi_type(dt), to, 0, comm_, &q));
          reqs.push_back(q);
        }
      }
    };

    if (nseg == 0) return;
    post(0);
    std::vector<const void*> inputs(static_cast<size_t>(n));
    for (size_t s = 0; s < nseg; ++s) {
      auto& reqs = pending[s % 2];
      wait_all(reqs);
      if (s + 1 < nseg) post(s + 1);
      const size_t len = seg_len(mine, s);
      if (len == 0) continue;
      for (int q = 0; q < n; ++q)
        inputs[static_cast<size_t>(q)] =
            q == r ? static_cast<const void*>(src + (mine.offset + s * seg) * esz)
                   : static_cast<const void*>(slot(static_cast<int>(s % 2), q));
      host_reduce(dt, op, n, inputs.data(), n, static_cast<char*>(out) + s * seg * esz, len);
    }
  }

  MPI_Comm comm_;
  Device& device_;
  std::unique_ptr<Stream> stream_;
  Buffer scratch_;
  // Point-to-point completion, one in-order stream per (peer, direction); see the top.
  std::map<std::pair<int, P2POp::Kind>, std::unique_ptr<Stream>> channels_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, Device& device) {
  MPI_Comm dup = MPI_COMM_NULL;
  ZERO_CHECK_MPI(MPI_Comm_dup(comm, &dup));
  ZERO_CHECK_MPI(MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN));
  int r = 0, s = 0;
  ZERO_CHECK_MPI(MPI_Comm_rank(dup, &r));
  ZERO_CHECK_MPI(MPI_Comm_size(dup, &s));
  return std::make_unique<MpiCommunicator>(dup, r, s, device);
}

}  // namespace zero::coll
