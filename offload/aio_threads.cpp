// The thread back-end of the file engine: `threads` workers take pieces from one queue and do a
// blocking pread/pwrite each. Used where io_uring is unavailable (a seccomp profile that blocks
// io_uring_setup, kernel.io_uring_disabled, an old kernel) or when asked for.
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "offload/aio_backend.hpp"

namespace zero::offload::detail {

namespace {

class ThreadBackend final : public AioBackendImpl {
 public:
  ThreadBackend(const AioOptions& opt, AioCompletion done) : done_(std::move(done)) {
    for (int i = 0; i < opt.threads; ++i) workers_.emplace_back([this] { work(); });
  }

  ~ThreadBackend() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void submit(const std::vector<AioPiece*>& pieces) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.insert(queue_.end(), pieces.begin(), pieces.end());
    }
    cv_.notify_all();
  }

  AioBackend kind() const noexcept override { return AioBackend::threads; }

 private:
  void work() {
    for (;;) {
      AioPiece* p = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and nothing left
        p = queue_.front();
        queue_.pop_front();
      }
      const auto off = static_cast<off_t>(p->offset);
      ssize_t rc = p->write ? ::pwrite(p->fd, p->buffer, p->length, off)
                            : ::pread(p->fd, p->buffer, p->length, off);
      done_(p, rc < 0 ? -static_cast<long>(errno) : static_cast<long>(rc));
    }
  }

  AioCompletion done_;
  std::mutex mu_;  // queue_, stop_
  std::condition_variable cv_;
  std::deque<AioPiece*> queue_;
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<AioBackendImpl> make_thread_backend(const AioOptions& opt, AioCompletion done) {
  return std::make_unique<ThreadBackend>(opt, std::move(done));
}

}  // namespace zero::offload::detail
