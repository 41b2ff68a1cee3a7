// The cpu device: host memory with an optional capacity, cpu executor streams. Its device and
// host spaces are the same RAM; DeviceOptions::shared_memory_limit bounds them together.
//
// Pinned host memory here means page-aligned memory locked into RAM with mlock(2): there is no
// DMA engine to serve, but locking makes the cpu backend fail where a GPU host would (a
// locked-memory limit, RLIMIT_MEMLOCK / `ulimit -l`, counts against it unless the process has
// CAP_IPC_LOCK), so the offload engine's fallback paths run and are tested on any machine.
// Each pinned buffer is its own anonymous mapping; freeing it unlocks and unmaps it, so the
// locked total goes down again (pinned pages never linger in the malloc heap).
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/device.hpp"
#include "core/log.hpp"

namespace zero {

namespace {

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

class CpuDevice final : public Device {
 public:
  CpuDevice(int index, const DeviceOptions& o)
      : Device(DeviceKind::cpu, index, "cpu:" + std::to_string(index),
               o.memory_limit ? o.memory_limit : kUnlimited,
               o.host_memory_limit ? o.host_memory_limit : kUnlimited,
               o.shared_memory_limit ? o.shared_memory_limit : kUnlimited) {}

  std::unique_ptr<Stream> create_stream(std::string name) override {
    return make_cpu_stream(std::move(name));
  }
  std::unique_ptr<Event> create_event() override { return make_cpu_event(); }

  void copy_async(void* dst, const void* src, size_t bytes, Stream& stream) override {
    if (bytes == 0) return;
    stream.launch_host([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }
  void fill_async(void* dst, unsigned char value, size_t bytes, Stream& stream) override {
    if (bytes == 0) return;
    stream.launch_host([dst, value, bytes] { std::memset(dst, value, bytes); });
  }
  // fp32 compute with bf16 storage: the conversions are ours (dtype.hpp), always available.
  bool supports_bf16() const noexcept override { return true; }

 protected:
  // Device memory of the cpu backend is host memory, 64-byte aligned for SIMD kernels.
  void* raw_allocate(size_t bytes) override {
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void raw_free(void* p) noexcept override { std::free(p); }

  // Pinned: a private anonymous mapping locked with mlock. Null when mmap or mlock refuses
  // (mlock: the RLIMIT_MEMLOCK limit, or no memory); Device::allocate_host reports it.
  void* raw_allocate_host(size_t bytes, bool pinned) override {
    if (!pinned) return Device::raw_allocate_host(bytes, false);
    const size_t rounded = (bytes + page_size() - 1) / page_size() * page_size();
    void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    if (mlock(p, rounded) != 0) {
      munmap(p, rounded);
      return nullptr;
    }
    std::lock_guard lock(mutex_);
    locked_.emplace(p, rounded);
    return p;
  }
  void raw_free_host(void* p, bool pinned) noexcept override {
    if (!pinned) return Device::raw_free_host(p, false);
    size_t rounded = 0;
    {
      std::lock_guard lock(mutex_);
      auto it = locked_.find(p);
      if (it == locked_.end()) {
        log::error("cpu device " + name() + ": freeing a pinned host pointer it did not allocate");
        return;
      }
      rounded = it->second;
      locked_.erase(it);
    }
    if (munlock(p, rounded) != 0 || munmap(p, rounded) != 0)
      log::error("cpu device " + name() + ": munlock/munmap of a pinned host buffer failed: " +
                 std::strerror(errno));
  }

 private:
  std::mutex mutex_;
  std::unordered_map<void*, size_t> locked_;  // pinned mapping -> its length (page multiple)
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int index, const DeviceOptions& options) {
  return std::make_unique<CpuDevice>(index, options);
}

}  // namespace zero
