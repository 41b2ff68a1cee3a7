#include "offload/copy_engine.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace zero::offload {

namespace {

std::byte* at(void* p, size_t offset) { return static_cast<std::byte*>(p) + offset; }
const std::byte* at(const void* p, size_t offset) {
  return static_cast<const std::byte*>(p) + offset;
}

void check_pointers(const char* call, const void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  ZERO_REQUIRE(dst != nullptr, std::string(call) + ": null destination for " +
                                   format_bytes(bytes) +
                                   "\nHINT: a zero-byte copy may use null pointers; any other "
                                   "needs both buffers allocated");
  ZERO_REQUIRE(src != nullptr, std::string(call) + ": null source for " + format_bytes(bytes) +
                                   "\nHINT: a zero-byte copy may use null pointers; any other "
                                   "needs both buffers allocated");
}

}  // namespace

Event& CopyHandle::event() const {
  ZERO_REQUIRE(event_ != nullptr, "CopyHandle::event() on an empty handle (no copy behind it)");
  return *event_;
}

void CopyHandle::wait() const {
  if (event_) event_->synchronize();
}

bool CopyHandle::done() const { return !event_ || event_->query(); }

void CopyHandle::order_before(Stream& stream) const {
  if (event_) stream.wait(*event_);
}

CopyEngine::CopyEngine(Device& device, HostMemory& host, CopyEngineOptions options)
    : device_(device), chunk_(options.staging_chunk_bytes) {
  ZERO_REQUIRE(&host.device() == &device,
               "CopyEngine on " + device.name() + " given the HostMemory of " +
                   host.device().name() + "\nHINT: use a HostMemory bound to the same Device");
  if (chunk_ > 0) {
    bool all_pinned = true;
    for (Lane* lane : {&down_, &up_})
      for (int s = 0; s < 2; ++s) {
        lane->stage[s] = host.allocate(chunk_, MemCategory::comm_buffers);
        all_pinned = all_pinned && lane->stage[s].pinned();
        lane->filled[s] = device.create_event();
        lane->free[s] = device.create_event();
      }
    // Staging through pageable buffers would only add a copy: give them back and copy direct.
    staging_ = all_pinned;
    if (!staging_)
      for (Lane* lane : {&down_, &up_})
        for (HostBuffer& b : lane->stage) b.reset();
  }
  d2h_ = device.create_stream("d2h");
  h2d_ = device.create_stream("h2d");
  d2h_stage_ = device.create_stream("d2h-stage");
  h2d_stage_ = device.create_stream("h2d-stage");
}

// The streams drain in their destructors (members declared after the lanes go first).
CopyEngine::~CopyEngine() = default;

void CopyEngine::check_range(const HostBuffer& b, size_t offset, size_t bytes, const char* what) {
  ZERO_REQUIRE(offset <= b.bytes() && bytes <= b.bytes() - offset,
               std::string(what) + ": bytes [" + std::to_string(offset) + ", " +
                   std::to_string(offset) + " + " + std::to_string(bytes) +
                   ") are outside the host buffer of " + std::to_string(b.bytes()) + " bytes");
}

CopyHandle CopyEngine::to_host(void* dst, const void* src, size_t bytes, HostPinning dst_pinning,
                               Event* after) {
  check_pointers("CopyEngine::to_host", dst, src, bytes);
  CopyHandle h;
  h.event_ = device_.create_event();
  h.bytes_ = bytes;
  Lane& lane = down_;
  std::lock_guard lock(lane.mu);
  if (after) d2h_->wait(*after);  // the source is ready (e.g. its reduce-scatter completed)
  if (bytes == 0 || dst_pinning == HostPinning::pinned || !staging_) {
    device_.copy_async(dst, src, bytes, *d2h_);
    d2h_->record(*h.event_);
  } else {
    for (size_t off = 0; off < bytes; off += chunk_) {
      const size_t len = std::min(chunk_, bytes - off);
      const int s = lane.next;
      lane.next ^= 1;
      void* stage = lane.stage[s].data();
      // stage[s] may be overwritten once the host has moved its previous chunk out.
      d2h_->wait(*lane.free[s]);
      device_.copy_async(stage, at(src, off), len, *d2h_);
      // The host may read stage[s] once this chunk's copy into it has landed.
      d2h_->record(*lane.filled[s]);
      d2h_stage_->wait(*lane.filled[s]);
      d2h_stage_->launch_host([d = at(dst, off), stage, len] { std::memcpy(d, stage, len); });
      d2h_stage_->record(*lane.free[s]);
      ++h.chunks_;
    }
    d2h_stage_->record(*h.event_);  // after the last chunk's host-side move
  }
  to_host_bytes_ += bytes;
  ++to_host_copies_;
  staged_chunks_ += h.chunks_;
  return h;
}

CopyHandle CopyEngine::to_device(void* dst, const void* src, size_t bytes,
                                 HostPinning src_pinning, Event* after) {
  check_pointers("CopyEngine::to_device", dst, src, bytes);
  CopyHandle h;
  h.event_ = device_.create_event();
  h.bytes_ = bytes;
  Lane& lane = up_;
  std::lock_guard lock(lane.mu);
  if (bytes == 0 || src_pinning == HostPinning::pinned || !staging_) {
    if (after) h2d_->wait(*after);  // the source is ready (e.g. the host optimizer wrote it)
    device_.copy_async(dst, src, bytes, *h2d_);
    h2d_->record(*h.event_);
  } else {
    // The host-side reads of the source come first: they wait for `after`; the device writes
    // follow them through filled[s], so they are ordered after `after` too.
    if (after) h2d_stage_->wait(*after);
    for (size_t off = 0; off < bytes; off += chunk_) {
      const size_t len = std::min(chunk_, bytes - off);
      const int s = lane.next;
      lane.next ^= 1;
      void* stage = lane.stage[s].data();
      // stage[s] may be refilled once the device copy out of it (two chunks back) has finished.
      h2d_stage_->wait(*lane.free[s]);
      h2d_stage_->launch_host([stage, sp = at(src, off), len] { std::memcpy(stage, sp, len); });
      // The device copy may read stage[s] once the host has filled it.
      h2d_stage_->record(*lane.filled[s]);
      h2d_->wait(*lane.filled[s]);
      device_.copy_async(at(dst, off), stage, len, *h2d_);
      h2d_->record(*lane.free[s]);
      ++h.chunks_;
    }
    h2d_->record(*h.event_);  // after the last chunk's device copy
  }
  to_device_bytes_ += bytes;
  ++to_device_copies_;
  staged_chunks_ += h.chunks_;
  return h;
}

CopyHandle CopyEngine::to_host(const HostBuffer& dst, size_t dst_offset, const void* src,
                               size_t bytes, Event* after) {
  check_range(dst, dst_offset, bytes, "CopyEngine::to_host");
  return to_host(dst.data() ? at(dst.data(), dst_offset) : nullptr, src, bytes,
                 dst.pinned() ? HostPinning::pinned : HostPinning::pageable, after);
}

CopyHandle CopyEngine::to_device(void* dst, const HostBuffer& src, size_t src_offset, size_t bytes,
                                 Event* after) {
  check_range(src, src_offset, bytes, "CopyEngine::to_device");
  return to_device(dst, src.data() ? at(src.data(), src_offset) : nullptr, bytes,
                   src.pinned() ? HostPinning::pinned : HostPinning::pageable, after);
}

CopyCounters CopyEngine::counters() const noexcept {
  CopyCounters c;
  c.to_host_bytes = to_host_bytes_.load();
  c.to_device_bytes = to_device_bytes_.load();
  c.to_host_copies = to_host_copies_.load();
  c.to_device_copies = to_device_copies_.load();
  c.staged_chunks = staged_chunks_.load();
  return c;
}

void CopyEngine::reset_counters() noexcept {
  to_host_bytes_ = 0;
  to_device_bytes_ = 0;
  to_host_copies_ = 0;
  to_device_copies_ = 0;
  staged_chunks_ = 0;
}

}  // namespace zero::offload
