// AioEngine: asynchronous reads and writes of byte ranges of files, into and out of the caller's
// buffers -- the base of the NVMe tier (optimizer state and parameters swapped to a drive).
//
//   AioEngine io(options);
//   AioFile f(path, AioFile::Mode::create);
//   AioHandle h = io.write(f, buffer, bytes, offset);   // returns at once
//   ... compute ...
//   io.wait(h);                                         // blocks; throws on an I/O error
//
// How: each request is cut into pieces of options.block_size bytes; at most queue_depth pieces
// are in flight over all requests. Back-end (aio_options.hpp's AioBackend): io_uring through
// liburing, or, where the kernel refuses to set up a ring, a pool of threads doing
// pread/pwrite, chosen automatically at construction and logged once per process. A short
// transfer is continued from where it stopped; a write that moves no bytes is a full drive.
//
// Alignment (aio_options.hpp): on a file opened with O_DIRECT (AioFile::direct()) the offset,
// length and buffer address of every request must be multiples of kAioAlignment (4096); a
// violation is a zero::Error at submission. Buffered files take anything.
//
// Errors: a failed piece fails its request; wait() throws zero::Error naming the path, the
// operation and what to do (aio_file.hpp's io_error_message), once every piece of the request
// has finished (so the buffer is no longer in the kernel's hands when wait() returns or throws).
//
// Ownership and lifetime: the caller owns the buffers and the AioFile; both must stay alive, and
// a write's buffer unchanged / a read's buffer untouched, until wait() on the handle returns or
// throws. Each handle is waited for at most once. Destroying the engine waits for everything in
// flight (errors of handles nobody waited for are dropped).
// Thread-safety: every member may be called from any thread; wait() blocks the calling thread
// only. Completions run on the back-end's own thread(s).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "offload/aio_file.hpp"
#include "offload/aio_options.hpp"

namespace zero::offload {

namespace detail {
class AioBackendImpl;
struct AioPiece;
struct AioRequest;
}  // namespace detail

struct AioHandle {
  uint64_t id = 0;  // 0: no request
};

class AioEngine {
 public:
  // Validates the options (zero::Error naming the "aio" setting) and starts the back-end;
  // backend io_uring that cannot be set up is an error, automatic falls back to threads.
  explicit AioEngine(const AioOptions& options = {});
  ~AioEngine();
  AioEngine(const AioEngine&) = delete;
  AioEngine& operator=(const AioEngine&) = delete;

  // Reads file bytes [offset, offset + length) into buffer.
  AioHandle read(const AioFile& file, void* buffer, size_t length, uint64_t offset);
  // Writes buffer[0, length) to file bytes [offset, offset + length).
  AioHandle write(const AioFile& file, const void* buffer, size_t length, uint64_t offset);
  // Blocks until the request has finished; throws zero::Error if any of it failed.
  void wait(AioHandle handle);
  // True once the request has finished (wait() will not block). Does not consume the handle.
  bool ready(AioHandle handle) const;

  AioBackend backend() const noexcept;  // io_uring or threads: what is actually used
  const AioOptions& options() const noexcept { return options_; }
  // Bytes moved by completed pieces since construction (for the per-step I/O metrics).
  uint64_t bytes_read() const noexcept { return bytes_read_.load(std::memory_order_relaxed); }
  uint64_t bytes_written() const noexcept { return bytes_written_.load(std::memory_order_relaxed); }
  // Reads and writes the back-end has completed: a request of n bytes is ceil(n / block_size)
  // of them (more after short transfers).
  uint64_t operations() const noexcept { return operations_.load(std::memory_order_relaxed); }

 private:
  AioHandle submit(const AioFile& file, char* buffer, size_t length, uint64_t offset, bool write);
  void complete(detail::AioPiece* piece, long result);  // on a back-end thread

  AioOptions options_;
  mutable std::mutex mu_;  // requests_ and every request's progress fields
  std::condition_variable finished_;
  std::unordered_map<uint64_t, std::unique_ptr<detail::AioRequest>> requests_;
  uint64_t next_id_ = 1;
  std::atomic<uint64_t> bytes_read_{0}, bytes_written_{0}, operations_{0};
  // Last: destroyed first, so its threads stop before the requests they point into go.
  std::unique_ptr<detail::AioBackendImpl> backend_;
};

}  // namespace zero::offload
