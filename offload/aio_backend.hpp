// The back-ends of the asynchronous file engine (internal to offload/; users see aio_engine.hpp).
// The engine cuts requests into pieces and hands them here; a back-end performs each piece's one
// read or write and reports the result through the engine's completion callback, from a thread
// of its own (never from inside submit()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "offload/aio_options.hpp"

namespace zero::offload::detail {

struct AioRequest;

// One read or write of at most block_size bytes. Owned by its AioRequest; the back-end holds a
// pointer from submit() until it has reported the piece.
struct AioPiece {
  AioRequest* request = nullptr;
  int fd = -1;
  bool write = false;
  char* buffer = nullptr;
  size_t length = 0;    // bytes still to move
  uint64_t offset = 0;  // file offset of buffer[0]
};

// Called once per submitted piece with the bytes moved (>= 0, possibly short) or -errno.
using AioCompletion = std::function<void(AioPiece*, long)>;

class AioBackendImpl {
 public:
  virtual ~AioBackendImpl() = default;
  // Queues pieces; never blocks on I/O. Thread-safe.
  virtual void submit(const std::vector<AioPiece*>& pieces) = 0;
  virtual AioBackend kind() const noexcept = 0;
};

// io_uring: nullptr when the kernel will not set up a ring (errno-style reason in *err).
std::unique_ptr<AioBackendImpl> make_uring_backend(const AioOptions& opt, AioCompletion done,
                                                   int* err);
std::unique_ptr<AioBackendImpl> make_thread_backend(const AioOptions& opt, AioCompletion done);

}  // namespace zero::offload::detail
