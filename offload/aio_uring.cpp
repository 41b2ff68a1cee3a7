// The io_uring back-end of the file engine: one ring, queue_depth pieces in flight, a reaper
// thread that waits for completions, reports them and refills the ring.
//
// Threads and the ring: liburing lets one thread work the submission side while another works
// the completion side. Submission (io_uring_get_sqe, io_uring_prep_*, io_uring_submit) happens
// under mu_, from submit() on the caller's thread or from the reaper after a completion; the
// completion side (io_uring_wait_cqe, io_uring_cqe_seen) is the reaper's alone. The reaper is
// woken for shutdown by a no-op whose user data is null.
#include <liburing.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "offload/aio_backend.hpp"

namespace zero::offload::detail {

namespace {

[[noreturn]] void ring_broken(const char* what, int err) {
  // Submission and waiting fail only on a misused or broken ring (EBADF, EFAULT, ...), never
  // for an I/O error (those arrive as completions), so there is nothing left to recover.
  std::fprintf(stderr, "fatal: io_uring %s failed: %s\n", what, std::strerror(err));
  std::abort();
}

class UringBackend final : public AioBackendImpl {
 public:
  UringBackend(const AioOptions& opt, AioCompletion done) : opt_(opt), done_(std::move(done)) {}

  // Returns 0 or the negative errno of io_uring_queue_init; on success starts the reaper.
  int init() {
    // One extra entry for the shutdown no-op; in flight never exceeds queue_depth, so neither
    // the submission queue nor the (twice as large) completion queue can overflow.
    const int rc = io_uring_queue_init(static_cast<unsigned>(opt_.queue_depth) + 1, &ring_, 0);
    if (rc < 0) return rc;
    ready_ = true;
    reaper_ = std::thread([this] { reap(); });
    return 0;
  }

  ~UringBackend() override {
    if (!ready_) return;
    {
      // The engine has waited for every piece, so the ring is idle: room for the no-op.
      std::lock_guard<std::mutex> lock(mu_);
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) ring_broken("get_sqe at shutdown", EBUSY);
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);
      submit_locked();
    }
    reaper_.join();
    io_uring_queue_exit(&ring_);
  }

  void submit(const std::vector<AioPiece*>& pieces) override {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.insert(pending_.end(), pieces.begin(), pieces.end());
    pump_locked();
  }

  AioBackend kind() const noexcept override { return AioBackend::io_uring; }

 private:
  // Moves pending pieces into the ring while there is room. Lock-step mode (overlap_events
  // false) starts a new batch only once the previous one has fully completed.
  void pump_locked() {
    if (!opt_.overlap_events && in_flight_ > 0) return;
    int prepared = 0;
    while (in_flight_ < opt_.queue_depth && !pending_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (!sqe) break;  // cannot happen (see init), but never overwrite a queued entry
      AioPiece* p = pending_.front();
      pending_.pop_front();
      const auto len = static_cast<unsigned>(p->length);
      if (p->write)
        io_uring_prep_write(sqe, p->fd, p->buffer, len, p->offset);
      else
        io_uring_prep_read(sqe, p->fd, p->buffer, len, p->offset);
      io_uring_sqe_set_data(sqe, p);
      ++in_flight_;
      ++prepared;
      if (opt_.single_submit) submit_locked();
    }
    if (!opt_.single_submit && prepared > 0) submit_locked();
  }

  void submit_locked() {
    for (;;) {
      const int rc = io_uring_submit(&ring_);
      if (rc >= 0) return;
      if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) {
        std::this_thread::yield();
        continue;
      }
      ring_broken("submit", -rc);
    }
  }

  // Waits for at least one completion, then takes every completion already there before
  // refilling the ring once: fewer lock round trips and io_uring_submit calls when pieces finish
  // together (a loaded machine wakes the reaper late).
  void reap() {
    io_uring_cqe* batch[64];
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) ring_broken("wait_cqe", -rc);
      const unsigned n = io_uring_peek_batch_cqe(&ring_, batch, 64);
      bool stop = false;
      int finished = 0;
      for (unsigned i = 0; i < n; ++i) {
        auto* piece = static_cast<AioPiece*>(io_uring_cqe_get_data(batch[i]));
        const long res = batch[i]->res;
        io_uring_cqe_seen(&ring_, batch[i]);
        if (!piece) {  // the shutdown no-op
          stop = true;
          continue;
        }
        // Outside mu_: the engine may resubmit the rest of a short transfer from inside done_.
        done_(piece, res);
        ++finished;
      }
      if (stop) return;
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_ -= finished;
      pump_locked();
    }
  }

  AioOptions opt_;
  AioCompletion done_;
  io_uring ring_{};
  bool ready_ = false;
  std::mutex mu_;                 // the submission side of the ring, pending_, in_flight_
  std::deque<AioPiece*> pending_;  // submitted to us, not yet in the ring
  int in_flight_ = 0;             // in the ring, not yet reaped
  std::thread reaper_;
};

}  // namespace

std::unique_ptr<AioBackendImpl> make_uring_backend(const AioOptions& opt, AioCompletion done,
                                                   int* err) {
  auto b = std::make_unique<UringBackend>(opt, std::move(done));
  const int rc = b->init();
  if (rc < 0) {
    *err = -rc;
    return nullptr;
  }
  *err = 0;
  return b;
}

}  // namespace zero::offload::detail
