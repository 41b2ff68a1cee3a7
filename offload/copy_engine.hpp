// CopyEngine: asynchronous device-to-host (D2H) and host-to-device (H2D) copies for the offload
// engine, each direction on its own stream, so gradient buckets can go down to the host optimizer
// and updated parameters come back up while compute and collectives run on theirs.
//
// A copy is ordered after an optional Event `after` (e.g. "the reduce-scatter of this bucket
// completed", "the host optimizer finished writing this shard") and returns a CopyHandle whose
// Event completes when the bytes are at the destination. Later work waits on it from the host
// (handle.wait()) or from a stream (handle.order_before(stream)); nothing here blocks the caller
// on the copy itself.
//
// Pinned or pageable host memory. Copies between the device and pinned host memory are one
// Device::copy_async on the direction's stream (cuda: cudaMemcpyAsync, a DMA; cpu: a memcpy on
// the stream's worker). A copy touching pageable host memory (after a pinning fallback, see
// host_memory.hpp) goes through two pinned staging buffers per direction, of
// staging_chunk_bytes each, allocated once at construction from the HostMemory (counted as
// comm_buffers). The copy is cut into chunks; chunk k uses buffer k % 2:
//   D2H  copy stream:   wait free[s] -> copy chunk k device->stage[s] -> record filled[s]
//        d2h-stage:     wait filled[s] -> memcpy stage[s]->host dst  -> record free[s]
//   H2D  h2d-stage:     wait free[s] -> memcpy host src->stage[s]   -> record filled[s]
//        copy stream:   wait filled[s] -> copy chunk k stage[s]->device -> record free[s]
// so the DMA of chunk k+1 runs while chunk k is being moved on the host side, and a buffer is
// refilled only once its previous contents have been moved on (the free[s] events). The host-side
// moves run on a second stream per direction (cuda: as cudaLaunchHostFunc tasks, on CUDA's
// callback thread, one chunk each). Why not pageable memory straight to cudaMemcpyAsync: the
// driver then stages through its own small buffers and a D2H call blocks the calling thread.
// When the staging buffers themselves could not be pinned (or staging_chunk_bytes is 0),
// staging is off and pageable copies go direct: still correct, slower on cuda.
//
// Counters: bytes requested per direction (a staged copy counts its bytes once), for the
// offload engine's "2 bytes per parameter each way" accounting.
//
// Ownership and lifetime: the caller owns every source and destination and must keep them alive
// and untouched (destination) / unchanged (source) until the copy's handle has completed. The
// Device and HostMemory must outlive the CopyEngine; destroying it waits for the copies in flight.
// Errors: a stream error taken over from `after` (stream.hpp's error model) makes the copy
// streams failed for their life; handles then rethrow it from wait(), and a new CopyEngine is
// needed.
// Thread-safety: all members may be called from any thread. Copies in one direction are
// submitted under that direction's lock, so concurrent callers' copies are ordered on the stream
// in the order they take it; a staged copy is never interleaved with another.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>

#include "offload/host_memory.hpp"
#include "core/device.hpp"
#include "core/stream.hpp"

namespace zero::offload {

// Whether the host side of a copy is pinned (page-locked) or ordinary pageable memory.
enum class HostPinning { pinned, pageable };

struct CopyEngineOptions {
  // Bytes per staging buffer (two per direction); 0 turns staging off.
  size_t staging_chunk_bytes = size_t{4} << 20;
};

// The completion of one copy. Move-only; a default-constructed handle stands for nothing to
// wait for. Dropping a handle does not cancel or wait for the copy.
class CopyHandle {
 public:
  CopyHandle() = default;
  CopyHandle(CopyHandle&&) noexcept = default;
  CopyHandle& operator=(CopyHandle&&) noexcept = default;

  // Completes when the bytes are at the destination. Requires a non-empty handle.
  Event& event() const;
  // Blocks the calling thread until then; rethrows a stream error (stream.hpp).
  void wait() const;
  // Non-blocking: true once complete (or for an empty handle).
  bool done() const;
  // Work submitted to `stream` after this call runs after the copy.
  void order_before(Stream& stream) const;

  size_t bytes() const noexcept { return bytes_; }
  // Whether the copy went through the staging buffers, and in how many chunks.
  bool staged() const noexcept { return chunks_ > 0; }
  size_t chunks() const noexcept { return chunks_; }
  explicit operator bool() const noexcept { return event_ != nullptr; }

 private:
  friend class CopyEngine;
  std::unique_ptr<Event> event_;
  size_t bytes_ = 0;
  size_t chunks_ = 0;
};

struct CopyCounters {
  size_t to_host_bytes = 0;    // D2H
  size_t to_device_bytes = 0;  // H2D
  size_t to_host_copies = 0;
  size_t to_device_copies = 0;
  size_t staged_chunks = 0;    // both directions
};

class CopyEngine {
 public:
  // Creates the four streams ("d2h", "h2d", "d2h-stage", "h2d-stage") and, when staging is on,
  // its four buffers from `host`.
  CopyEngine(Device& device, HostMemory& host, CopyEngineOptions options = {});
  ~CopyEngine();
  CopyEngine(const CopyEngine&) = delete;
  CopyEngine& operator=(const CopyEngine&) = delete;

  // Device -> host: `bytes` from device memory `src` to host memory `dst`, after `after`.
  // A null pointer with bytes > 0 throws zero::Error; bytes == 0 gives a handle that completes
  // after `after`. `after` must be of the device's kind.
  CopyHandle to_host(void* dst, const void* src, size_t bytes, HostPinning dst_pinning,
                     Event* after = nullptr);
  // Host -> device: `bytes` from host memory `src` to device memory `dst`, after `after`.
  CopyHandle to_device(void* dst, const void* src, size_t bytes, HostPinning src_pinning,
                       Event* after = nullptr);
  // The same, with the host side a range of a HostBuffer (its pinned() decides the path).
  // Throws zero::Error when [offset, offset + bytes) is not inside the buffer.
  CopyHandle to_host(const HostBuffer& dst, size_t dst_offset, const void* src, size_t bytes,
                     Event* after = nullptr);
  CopyHandle to_device(void* dst, const HostBuffer& src, size_t src_offset, size_t bytes,
                       Event* after = nullptr);

  // The copy streams, e.g. for a collective to wait on or to record on. Owned by the engine.
  Stream& d2h_stream() noexcept { return *d2h_; }
  Stream& h2d_stream() noexcept { return *h2d_; }

  // Whether pageable copies are staged (false when staging_chunk_bytes is 0 or its buffers
  // could not be pinned), and the chunk size.
  bool staging() const noexcept { return staging_; }
  size_t staging_chunk_bytes() const noexcept { return chunk_; }

  CopyCounters counters() const noexcept;
  void reset_counters() noexcept;

 private:
  // One direction's staging state, guarded by its mutex.
  struct Lane {
    std::mutex mu;
    HostBuffer stage[2];
    std::unique_ptr<Event> filled[2];  // the stage buffer holds chunk data ready to move on
    std::unique_ptr<Event> free[2];    // the stage buffer's previous chunk has been moved on
    int next = 0;                      // the stage buffer the next chunk uses
  };

  static void check_range(const HostBuffer& b, size_t offset, size_t bytes, const char* what);

  Device& device_;
  size_t chunk_;
  bool staging_ = false;
  Lane down_, up_;  // D2H, H2D
  // Declared after the lanes: destroyed (drained) before the staging buffers are freed.
  std::unique_ptr<Stream> d2h_, h2d_, d2h_stage_, h2d_stage_;
  std::atomic<size_t> to_host_bytes_{0}, to_device_bytes_{0}, to_host_copies_{0},
      to_device_copies_{0}, staged_chunks_{0};
};

}  // namespace zero::offload
