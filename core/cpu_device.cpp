// The cpu device: host memory with an optional capacity, cpu executor streams. Its device and
// host spaces are the same RAM; DeviceOptions::shared_memory_limit bounds them together.
//
// Pinned host memory here means page-aligned memory locked into RAM with mlock(2): there is no
// DMA engine to serve, but locking makes the cpu backend fail where a GPU host would (a
// locked-memory limit, RLIMIT_MEMLOCK / `ulimit -l`, counts against it unless the process has
// CAP_IPC_LOCK), so the offload engine's fallback paths run and are tested on any machine.
// Each pinned buffer is its own anonymous mapping; freeing it unlocks and unmaps it, so the
// locked total goes down again (pinned pages never linger in the malloc heap).
//
// Memory reuse across steps. A training step allocates and frees the same activation, gradient
// and kernel-scratch sizes every time; with glibc's defaults most of those came back as fresh
// pages each step (~47k minor faults, ~180 MiB, per step of the issue-21 GPT at batch 4): blocks
// above the mmap threshold are mapped on malloc and unmapped on free, and free memory at the top
// of a heap is trimmed back to the kernel. So the first cpu device (1) fixes glibc's mmap
// threshold at its maximum, 32 MiB, and its trim threshold at kTrimThreshold, process-wide
// (mallopt), so that kernel scratch (plain new[] below 32 MiB) is reused from the heaps; and (2)
// each cpu device keeps its own freed device blocks of kCacheMin and more in a cache, by rounded
// size, for the next allocation of that size, up to a byte cap. (glibc alone does not reuse a
// freed aligned block for an aligned request of the same size when the block is not at the top
// of the heap: memalign asks for size + alignment.) Neither is in the memory ledger: the ledger
// counts live buffers, so RSS can exceed the ledger's total by the cached blocks (at most the
// cap) plus the free memory glibc keeps (at most the trim threshold per heap).
// docs/cpu-kernels.md, "Element-wise kernels and memory reuse".
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/device.hpp"
#include "core/log.hpp"
#include "core/parallel_chunks.hpp"

namespace zero {

namespace {

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// glibc's largest mmap threshold on 64-bit hosts (HEAP_MAX_SIZE / 2): blocks from here up are
// always mapped afresh.
constexpr size_t kLargeBlock = size_t{32} << 20;
// Free memory at the top of a heap that glibc keeps instead of trimming.
constexpr size_t kTrimThreshold = size_t{512} << 20;
// Device blocks from this size on go through the cache (smaller ones are a step's noise).
constexpr size_t kCacheMin = size_t{256} << 10;
// Cached blocks are rounded up to 64 KiB, 1 MiB from kLargeBlock on (at most ~1/4 and ~1/32
// more than asked), so that sizes differing by a little share entries.
size_t cache_round(size_t bytes) {
  const size_t unit = bytes < kLargeBlock ? size_t{64} << 10 : size_t{1} << 20;
  return (bytes + unit - 1) / unit * unit;
}
// The most bytes of freed blocks one device keeps; with a memory_limit, at most an eighth of it
// (an emulated small device should not hide much outside its ledger).
constexpr size_t kCacheMax = size_t{512} << 20;

// Copies and fills of large blocks (a step's gradient buffers: hundreds of MiB at GPT-2 size)
// run in chunks of this many bytes on oneTBB's threads; one thread does not reach the memory
// bandwidth. The bytes written are the same however the chunks are spread.
constexpr size_t kParallelChunk = size_t{1} << 20;

void tune_malloc_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Setting either also switches off glibc's dynamic threshold, which otherwise raises the
    // mmap threshold only after each size has been mapped and unmapped once.
    if (mallopt(M_MMAP_THRESHOLD, static_cast<int>(kLargeBlock)) != 1 ||
        mallopt(M_TRIM_THRESHOLD, static_cast<int>(kTrimThreshold)) != 1)
      log::warn("cpu device: mallopt refused the mmap/trim thresholds; steps will fault in fresh "
                "pages (slower, same results)");
  });
}

class CpuDevice final : public Device {
 public:
  CpuDevice(int index, const DeviceOptions& o)
      : Device(DeviceKind::cpu, index, "cpu:" + std::to_string(index),
               o.memory_limit ? o.memory_limit : kUnlimited,
               o.host_memory_limit ? o.host_memory_limit : kUnlimited,
               o.shared_memory_limit ? o.shared_memory_limit : kUnlimited),
        cache_max_(o.memory_limit ? std::min(kCacheMax, o.memory_limit / 8) : kCacheMax) {
    tune_malloc_once();
  }
  ~CpuDevice() override { release_cached(); }

  std::unique_ptr<Stream> create_stream(std::string name) override {
    return make_cpu_stream(std::move(name));
  }
  std::unique_ptr<Event> create_event() override { return make_cpu_event(); }

  void copy_async(void* dst, const void* src, size_t bytes, Stream& stream) override {
    if (bytes == 0) return;
    stream.launch_host([dst, src, bytes] {
      parallel_chunks(bytes, kParallelChunk, 2, [&](size_t b0, size_t b1) {
        std::memcpy(static_cast<unsigned char*>(dst) + b0,
                    static_cast<const unsigned char*>(src) + b0, b1 - b0);
      });
    });
  }
  void fill_async(void* dst, unsigned char value, size_t bytes, Stream& stream) override {
    if (bytes == 0) return;
    stream.launch_host([dst, value, bytes] {
      parallel_chunks(bytes, kParallelChunk, 2, [&](size_t b0, size_t b1) {
        std::memset(static_cast<unsigned char*>(dst) + b0, value, b1 - b0);
      });
    });
  }
  // fp32 compute with bf16 storage: the conversions are ours (dtype.hpp), always available.
  bool supports_bf16() const noexcept override { return true; }

 protected:
  // Device memory of the cpu backend is host memory, 64-byte aligned for SIMD kernels. Blocks
  // of kCacheMin and more come from the cache when one of the same rounded size is free.
  void* raw_allocate(size_t bytes) override {
    if (bytes < kCacheMin) return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    const size_t rounded = cache_round(bytes);
    {
      std::lock_guard lock(mutex_);
      if (auto it = cached_.find(rounded); it != cached_.end()) {
        void* p = it->second;
        cached_.erase(it);
        cached_bytes_ -= rounded;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, rounded);
    if (!p) {  // the cache may be what stands in the way
      release_cached();
      p = std::aligned_alloc(64, rounded);
    }
    if (!p) return nullptr;
    std::lock_guard lock(mutex_);
    blocks_.emplace(p, rounded);
    return p;
  }
  void raw_free(void* p) noexcept override {
    {
      std::lock_guard lock(mutex_);
      auto it = blocks_.find(p);
      if (it != blocks_.end()) {
        const size_t rounded = it->second;
        if (cached_bytes_ + rounded <= cache_max_) {
          cached_.emplace(rounded, p);
          cached_bytes_ += rounded;
          return;
        }
        blocks_.erase(it);
      }
    }
    std::free(p);
  }

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
  // Frees every cached block.
  void release_cached() noexcept {
    std::multimap<size_t, void*> drop;
    {
      std::lock_guard lock(mutex_);
      drop.swap(cached_);
      cached_bytes_ = 0;
      for (const auto& [size, p] : drop) blocks_.erase(p);
    }
    for (const auto& [size, p] : drop) std::free(p);
  }

  std::mutex mutex_;  // guards locked_, blocks_, cached_, cached_bytes_
  std::unordered_map<void*, size_t> locked_;  // pinned mapping -> its length (page multiple)
  std::unordered_map<void*, size_t> blocks_;   // cacheable device block (live or cached) -> size
  std::multimap<size_t, void*> cached_;       // freed cacheable blocks by rounded size
  size_t cached_bytes_ = 0;
  const size_t cache_max_;
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int index, const DeviceOptions& options) {
  return std::make_unique<CpuDevice>(index, options);
}

}  // namespace zero
