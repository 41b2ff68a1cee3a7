// AioOptions: the settings of the asynchronous file engine (aio_engine.hpp), the offload-level
// twin of DeepSpeed's "aio" block (runtime/config's Aio). offload/ sits below runtime/, so the
// engine takes this struct and config::to_aio_options (runtime/config/to_offload.hpp) copies the
// config's fields across:
//   aio.block_size            -> block_size
//   aio.queue_depth           -> queue_depth
//   aio.intra_op_parallelism  -> threads       (old name: thread_count)
//   aio.single_submit         -> single_submit
//   aio.overlap_events        -> overlap_events
// (aio.use_gds has no counterpart: GPUDirect Storage is not built.)
//
// The alignment rule. A file opened with O_DIRECT moves bytes between the drive and the caller's
// buffer by DMA, so the kernel requires the file offset, the length and the buffer address to be
// multiples of the device's logical block size (512 B or 4 KiB on today's drives). The engine
// asks for kAioAlignment = 4096, which covers both: on a direct file every request's offset,
// length and buffer address must be multiples of 4096 (HostMemory's buffers are page-aligned;
// SwapStore::padded rounds sizes up). A buffered file (the fallback when the file system refuses
// O_DIRECT) takes any offset, length and address.
#pragma once

#include <cstddef>
#include <string>

namespace zero::offload {

inline constexpr size_t kAioAlignment = 4096;

enum class AioBackend {
  automatic,  // io_uring if the kernel lets us set up a ring, else threads (logged once)
  io_uring,   // io_uring through liburing; an error if unavailable
  threads,    // a pool of threads doing pread/pwrite
};

const char* to_string(AioBackend b) noexcept;

struct AioOptions {
  // A request is cut into pieces of block_size bytes (the last may be shorter); each piece is
  // one read or write in flight. A multiple of kAioAlignment so pieces of an aligned request
  // stay aligned.
  size_t block_size = size_t{1} << 20;
  // Pieces in flight at once, over all requests (io_uring: ring entries in use; threads: pieces
  // queued to the pool beyond those being served wait in the engine).
  int queue_depth = 8;
  // Threads of the thread back-end. io_uring keeps queue_depth pieces in flight from one ring
  // without threads, so it uses one ring whatever this says.
  int threads = 1;
  // io_uring: true submits each piece by its own io_uring_submit; false prepares as many pieces
  // as the queue has room for and submits them with one call.
  bool single_submit = false;
  // io_uring: true refills the queue as each piece completes; false submits a batch of up to
  // queue_depth pieces and waits for the whole batch before the next (DeepSpeed's lock-step mode).
  // The thread back-end always overlaps.
  bool overlap_events = true;
  AioBackend backend = AioBackend::automatic;

  // Throws zero::Error naming the setting (as the "aio" block spells it) and what to do.
  void validate() const;
};

}  // namespace zero::offload
