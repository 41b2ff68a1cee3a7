// HostMemory: the host RAM that offloaded model state lives in (fp32 master weights, Adam
// moments, gradient landing buffers, stage-3 parameter shards) and the pinned staging buffers of
// the copy engine. Every byte comes from Device::allocate_host, so the device's ledger shows it
// in its host column under the category the caller names, and the device's host capacity
// (DeviceOptions::host_memory_limit) applies: past it, allocate() throws the ledger's
// OutOfMemory, whatever the pinning policy.
//
// Pinned memory is what makes host<->device copies asynchronous:
//   cuda  cudaHostAlloc (page-locked, registered with the driver for DMA);
//   cpu   an anonymous mapping locked with mlock(2). There is no DMA on the cpu backend, but the
//         lock fails the way it would on a GPU host (RLIMIT_MEMLOCK, `ulimit -l`), so the
//         fallback below runs and is tested everywhere.
// Pinning can fail (a locked-memory limit, a container without memlock, a host short of RAM).
// PinPolicy says what happens then:
//   required   allocate() throws zero::Error saying how much, on which device, and what to do;
//   preferred  (default) the first failure logs one warning with the same facts (once per
//              HostMemory), and the allocation is made in ordinary pageable memory instead.
//              Later allocations still try to pin first, so a small buffer may still be pinned;
//   off        never pins.
// The copy engine (copy_engine.hpp) moves pageable memory through pinned staging buffers, so a
// fallback costs speed, never correctness.
//
// Ownership: a HostBuffer owns its bytes and gives them back (to the device, and to this
// HostMemory's totals) when destroyed. The Device must outlive the HostMemory, and the HostMemory
// every HostBuffer it handed out. Buffers are page-aligned and not zeroed.
// Thread-safety: allocate() and the accessors may be called from any thread. A HostBuffer itself
// is not synchronised.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "core/device.hpp"

namespace zero::offload {

enum class PinPolicy { required, preferred, off };
std::string_view to_string(PinPolicy p) noexcept;
// "required", "preferred", "off" (case-sensitive); nullopt for anything else.
std::optional<PinPolicy> parse_pin_policy(std::string_view text) noexcept;

struct HostMemoryOptions {
  PinPolicy pin = PinPolicy::preferred;
  // Receives the fallback warning (one line of text, no "warning:" prefix). Empty: it is printed
  // on the rank where it happened (log::rank_info, "warning: ..."), since a locked-memory limit
  // may differ between hosts. Called at most once per HostMemory, from the allocating thread.
  std::function<void(const std::string&)> on_warning;
};

class HostMemory;

class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { reset(); }

  void* data() const noexcept { return buffer_.data(); }
  template <class T>
  T* as() const noexcept { return buffer_.as<T>(); }
  size_t bytes() const noexcept { return buffer_.bytes(); }
  MemCategory category() const noexcept { return buffer_.category(); }
  // Whether the bytes really are pinned (false after a fallback or with PinPolicy::off).
  bool pinned() const noexcept { return buffer_.pinned(); }
  const Buffer& buffer() const noexcept { return buffer_; }
  explicit operator bool() const noexcept { return static_cast<bool>(buffer_); }
  // Frees the bytes now (the HostBuffer becomes empty).
  void reset() noexcept;

 private:
  friend class HostMemory;
  Buffer buffer_;
  HostMemory* owner_ = nullptr;
};

class HostMemory {
 public:
  explicit HostMemory(Device& device, HostMemoryOptions options = {});
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;

  // `bytes` of host memory counted under `category`, pinned as the policy says. Throws
  // OutOfMemory past the device's host capacity (or when even pageable memory is refused), and
  // zero::Error when pinning fails under PinPolicy::required. Zero bytes: an empty-but-valid
  // buffer (data() == nullptr), pinned() as the policy would have it.
  HostBuffer allocate(size_t bytes, MemCategory category);

  Device& device() const noexcept { return device_; }
  PinPolicy policy() const noexcept { return policy_; }

  // Bytes currently handed out and not yet freed, pinned and pageable.
  size_t pinned_bytes() const noexcept { return pinned_.load(); }
  size_t unpinned_bytes() const noexcept { return unpinned_.load(); }
  // Allocations that wanted pinning and got pageable memory (PinPolicy::preferred), so far.
  size_t fallbacks() const noexcept { return fallbacks_.load(); }
  // One line for the start-up log:
  //   "host memory of cpu:0: 1.50 GiB pinned, 0 B pageable (pinning preferred)"
  // with ", 2 allocations fell back to pageable memory" appended after a fallback.
  std::string summary() const;

 private:
  friend class HostBuffer;
  void returned(const Buffer& b) noexcept;
  // The warning / error text for a refused pin of `bytes` of `category`.
  std::string pin_failure_message(size_t bytes, MemCategory category) const;

  Device& device_;
  const PinPolicy policy_;
  std::function<void(const std::string&)> on_warning_;
  std::atomic<size_t> pinned_{0}, unpinned_{0}, fallbacks_{0};
  std::once_flag warned_;
};

}  // namespace zero::offload
