#include "offload/aio_engine.hpp"

#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"
#include "offload/aio_backend.hpp"

namespace zero::offload {

namespace detail {

// One read or write the caller submitted: its pieces and how far they have got.
struct AioRequest {
  std::string path;
  bool write = false;
  bool direct = false;
  uint64_t offset = 0;
  size_t length = 0;
  std::vector<AioPiece> pieces;
  size_t pieces_left = 0;
  std::string error;  // the first failure's message; empty: none
  bool done = false;
};

}  // namespace detail

using detail::AioPiece;
using detail::AioRequest;

const char* to_string(AioBackend b) noexcept {
  switch (b) {
    case AioBackend::automatic: return "automatic";
    case AioBackend::io_uring: return "io_uring";
    case AioBackend::threads: return "threads";
  }
  return "?";
}

void AioOptions::validate() const {
  ZERO_REQUIRE(block_size >= kAioAlignment && block_size % kAioAlignment == 0 &&
                   block_size <= (size_t{1} << 30),
               "aio.block_size is " + std::to_string(block_size) +
                   ": it must be a multiple of 4096 bytes between 4096 and 1 GiB (O_DIRECT "
                   "pieces must stay aligned); DeepSpeed's default is 1048576");
  ZERO_REQUIRE(queue_depth >= 1 && queue_depth <= 4096,
               "aio.queue_depth is " + std::to_string(queue_depth) +
                   ": it must be between 1 and 4096 (requests in flight); default 8");
  ZERO_REQUIRE(threads >= 1 && threads <= 256,
               "aio.intra_op_parallelism (thread_count) is " + std::to_string(threads) +
                   ": it must be between 1 and 256; default 1");
}

AioEngine::AioEngine(const AioOptions& options) : options_(options) {
  options_.validate();
  auto done = [this](AioPiece* p, long r) { complete(p, r); };
  if (options_.backend != AioBackend::threads) {
    int err = 0;
    backend_ = detail::make_uring_backend(options_, done, &err);
    if (!backend_) {
      const std::string why = std::string("io_uring_queue_init failed: ") + std::strerror(err);
      if (options_.backend == AioBackend::io_uring)
        ZERO_FAIL("the asynchronous file engine was asked for io_uring, but " + why +
                  ". What to do: allow io_uring (sysctl kernel.io_uring_disabled=0; a container's "
                  "seccomp profile may block io_uring_setup) or let the engine choose "
                  "(automatic) to use threads");
      // Once per process: every engine of the run meets the same kernel.
      static std::once_flag logged;
      std::call_once(logged, [&] {
        log::warn("io_uring is unavailable (" + why + "); the asynchronous file engine uses " +
                  std::to_string(options_.threads) +
                  " thread(s) doing pread/pwrite instead (aio.intra_op_parallelism sets how many)");
      });
    }
  }
  if (!backend_) backend_ = detail::make_thread_backend(options_, done);
}

AioEngine::~AioEngine() {
  std::unique_lock<std::mutex> lock(mu_);
  finished_.wait(lock, [this] {
    for (const auto& [id, r] : requests_)
      if (!r->done) return false;
    return true;
  });
  lock.unlock();
  backend_.reset();
}

AioBackend AioEngine::backend() const noexcept { return backend_->kind(); }

AioHandle AioEngine::read(const AioFile& file, void* buffer, size_t length, uint64_t offset) {
  return submit(file, static_cast<char*>(buffer), length, offset, false);
}

AioHandle AioEngine::write(const AioFile& file, const void* buffer, size_t length,
                           uint64_t offset) {
  // The back-ends take one pointer type; a write only ever reads through it.
  return submit(file, const_cast<char*>(static_cast<const char*>(buffer)), length, offset, true);
}

AioHandle AioEngine::submit(const AioFile& file, char* buffer, size_t length, uint64_t offset,
                            bool write) {
  ZERO_REQUIRE(file.is_open(), "AioEngine: " + std::string(write ? "write to" : "read from") +
                                   " a file that is not open ('" + file.path() + "')");
  if (file.direct()) {
    const auto addr = reinterpret_cast<uintptr_t>(buffer);
    ZERO_REQUIRE(offset % kAioAlignment == 0 && length % kAioAlignment == 0 &&
                     addr % kAioAlignment == 0,
                 file.path() + ": " + (write ? "write" : "read") + " of " +
                     std::to_string(length) + " bytes at offset " + std::to_string(offset) +
                     " from buffer address " + std::to_string(addr) +
                     " is not aligned: the file is open with O_DIRECT, which needs offset, "
                     "length and buffer address to be multiples of 4096. What to do: allocate "
                     "the buffer page-aligned (HostMemory) and round sizes up "
                     "(SwapStore::padded)");
  }
  auto req = std::make_unique<AioRequest>();
  req->path = file.path();
  req->write = write;
  req->direct = file.direct();
  req->offset = offset;
  req->length = length;
  const size_t bs = options_.block_size;
  const size_t n = (length + bs - 1) / bs;
  req->pieces.resize(n);
  std::vector<AioPiece*> ptrs(n);
  for (size_t i = 0; i < n; ++i) {
    AioPiece& p = req->pieces[i];
    p.request = req.get();
    p.fd = file.fd();
    p.write = write;
    p.buffer = buffer + i * bs;
    p.length = std::min(bs, length - i * bs);
    p.offset = offset + i * bs;
    ptrs[i] = &p;
  }
  req->pieces_left = n;
  req->done = n == 0;
  AioHandle h;
  {
    std::lock_guard<std::mutex> lock(mu_);
    h.id = next_id_++;
    requests_.emplace(h.id, std::move(req));
  }
  // Completions may arrive before this returns; the request is already in the map.
  if (n > 0) backend_->submit(ptrs);
  return h;
}

void AioEngine::complete(AioPiece* p, long result) {
  AioRequest* r = p->request;
  operations_.fetch_add(1, std::memory_order_relaxed);
  if (result > 0) (p->write ? bytes_written_ : bytes_read_).fetch_add(uint64_t(result));
  std::string error;
  // Built on failure only: this runs once per piece on the back-end's thread.
  auto what = [p] {
    return std::string(p->write ? "write" : "read") + " of " + std::to_string(p->length) +
           " bytes at offset " + std::to_string(p->offset);
  };
  if (result < 0) {
    error = io_error_message(r->path, what(), static_cast<int>(-result));
  } else if (static_cast<size_t>(result) < p->length) {
    const auto moved = static_cast<size_t>(result);
    const bool aligned = moved % kAioAlignment == 0;
    if (moved > 0 && (!r->direct || aligned)) {
      // A short transfer: continue from where it stopped. A write that cannot continue comes
      // back with ENOSPC or with zero bytes, below.
      p->buffer += moved;
      p->offset += moved;
      p->length -= moved;
      backend_->submit({p});
      return;
    }
    if (p->write)
      // Zero bytes written (or an unaligned tail O_DIRECT cannot continue): the drive is full.
      error = io_error_message(r->path, what() + " (only " + std::to_string(moved) + " written)",
                               ENOSPC);
    else
      error = r->path + ": " + what() + " reached the end of the file after " +
              std::to_string(moved) + " bytes. What to do: the file is shorter than the data " +
              "asked for; it was truncated or never written (read only what was written)";
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!error.empty() && r->error.empty()) r->error = std::move(error);
  if (--r->pieces_left == 0) {
    r->done = true;
    finished_.notify_all();
  }
}

void AioEngine::wait(AioHandle handle) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = requests_.find(handle.id);
  ZERO_REQUIRE(it != requests_.end(),
               "AioEngine::wait: unknown handle " + std::to_string(handle.id) +
                   " (already waited for, or not from this engine)");
  AioRequest* r = it->second.get();
  finished_.wait(lock, [r] { return r->done; });
  std::string error = std::move(r->error);
  requests_.erase(it);
  lock.unlock();
  if (!error.empty()) ZERO_FAIL(error);
}

bool AioEngine::ready(AioHandle handle) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = requests_.find(handle.id);
  ZERO_REQUIRE(it != requests_.end(),
               "AioEngine::ready: unknown handle " + std::to_string(handle.id));
  return it->second->done;
}

}  // namespace zero::offload
