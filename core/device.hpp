// Devices: where memory lives and where work runs. Two kinds:
//   cpu   host memory with an optional capacity (unlimited by default), so "a model whose states
//         exceed device memory" is testable on any machine; streams are cpu executors. Its
//         device memory and the host memory it uses are the same RAM: a shared limit bounds the
//         two together (zero-train sets it to the rank's memory budget, offload/memory_budget.hpp).
//   cuda  one GPU: cudaMalloc'd memory, CUDA streams, pinned host memory via cudaHostAlloc.
//         Capacity = the GPU memory free once the CUDA context exists (cudaMemGetInfo, not the
//         card's total: the context, other processes and earlier allocations are not ours),
//         less what libraries later take outside the ledger (take_outside_ledger: cuBLAS's
//         handle, NCCL's connection buffers), or a lower limit we set (e.g. to emulate a 32 GiB
//         card), whichever is smaller.
//
// Every allocation goes through Device::allocate / allocate_host and into the device's
// MemoryLedger; an allocation past the capacity throws OutOfMemory with the ledger table.
//
// Ownership: a Buffer owns its bytes and gives them back when destroyed. The Device must outlive
// every Buffer, Stream and Event it made. Buffers are not zeroed. Thread-safety: allocate and
// free may be called from any thread; a Buffer itself is not synchronised.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/device_kind.hpp"
#include "core/ledger.hpp"
#include "core/stream.hpp"

namespace zero {

class Device;

class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { reset(); }

  void* data() const noexcept { return data_; }
  template <class T>
  T* as() const noexcept { return static_cast<T*>(data_); }
  size_t bytes() const noexcept { return bytes_; }
  MemSpace space() const noexcept { return space_; }
  MemCategory category() const noexcept { return category_; }
  bool pinned() const noexcept { return pinned_; }
  Device* device() const noexcept { return device_; }
  explicit operator bool() const noexcept { return device_ != nullptr; }
  // Frees the bytes now (the Buffer becomes empty).
  void reset() noexcept;

 private:
  friend class Device;
  Device* device_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemSpace space_ = MemSpace::device;
  MemCategory category_ = MemCategory::other;
  bool pinned_ = false;
};

struct DeviceOptions {
  // Capacity of device memory in bytes. 0: cpu unlimited; cuda the GPU's free memory.
  // On cuda the capacity is never above what the GPU has free (see Device above).
  size_t memory_limit = 0;
  // Capacity of host memory used on the device's behalf (pinned staging, offloaded states).
  // 0: unlimited.
  size_t host_memory_limit = 0;
  // cpu only: device and host memory together (on the cpu backend both are the same RAM), on top
  // of the two limits above. 0: no such bound. The cuda device ignores it (separate memories).
  size_t shared_memory_limit = 0;
};

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  DeviceKind kind() const noexcept { return kind_; }
  int index() const noexcept { return index_; }
  // "cpu:0", "cuda:0 (NVIDIA H100 80GB HBM3)"
  const std::string& name() const noexcept { return name_; }
  size_t capacity() const { return ledger_.capacity(MemSpace::device); }
  MemoryLedger& ledger() noexcept { return ledger_; }
  const MemoryLedger& ledger() const noexcept { return ledger_; }

  // Device memory, counted under `category`. Throws OutOfMemory past the capacity.
  // A zero-byte request gives an empty-but-valid Buffer with data() == nullptr.
  Buffer allocate(size_t bytes, MemCategory category);
  // Host memory for this device, page-aligned. `pinned`: page-locked for fast asynchronous
  // copies (cuda: cudaHostAlloc; cpu: an mlock(2)ed mapping: no DMA to wait for, but a
  // locked-memory limit refuses it as on a GPU host). A refused pin throws OutOfMemory.
  Buffer allocate_host(size_t bytes, MemCategory category, bool pinned = true);

  virtual std::unique_ptr<Stream> create_stream(std::string name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;
  // Stream-ordered copy between any two buffers this device can reach (device or host).
  virtual void copy_async(void* dst, const void* src, size_t bytes, Stream& stream) = 0;
  // Stream-ordered byte fill.
  virtual void fill_async(void* dst, unsigned char value, size_t bytes, Stream& stream) = 0;
  // Whether bf16 storage and compute are supported (cuda: compute capability 8.0 and newer).
  virtual bool supports_bf16() const noexcept = 0;

  // Orders device allocations on `stream` from now on (null: back to the default). cuda: the
  // memory of allocate() comes from the stream-ordered pool (cudaMallocAsync on `stream`) and is
  // returned with cudaFreeAsync on the stream it was allocated on, so freeing a buffer the GPU
  // still uses neither waits nor synchronises the device (cudaFree does both), and freed memory
  // is reused without going back to the driver. The contract, for the caller:
  //   - another stream uses such a buffer only after waiting for an event recorded on the
  //     allocation stream after the allocation (e.g. a collective's `after` event);
  //   - a buffer is freed only after every other stream's use of it has completed or been
  //     ordered before the allocation stream's current point;
  //   - the stream outlives every buffer allocated while it was set.
  // cpu: nothing changes (allocation is immediate; the cpu ops keep their operands alive).
  virtual void set_allocation_stream(Stream* stream) { (void)stream; }

  // `bytes` of this device's memory were taken outside the ledger, after the device was opened,
  // by a library working for it (cuBLAS's handle, NCCL's communicators and their connection
  // buffers), as measured by the caller (cuda/outside_ledger.hpp). cuda: the capacity becomes
  // min(limit, free memory at opening - everything so taken), so the run's own allocations end
  // where the GPU's memory does instead of failing inside a library later. `what` names the
  // library in outside_ledger_report(). cpu: nothing is measured; the call is ignored.
  virtual void take_outside_ledger(size_t bytes, std::string_view what) {
    (void)bytes;
    (void)what;
  }
  // One line per library that took memory outside the ledger ("" when none did).
  virtual std::string outside_ledger_report() const { return {}; }

 protected:
  Device(DeviceKind kind, int index, std::string name, size_t capacity, size_t host_capacity,
         size_t shared_capacity = kUnlimited);
  void set_name(std::string name) { name_ = std::move(name); }
  // Raw allocation without accounting; null on failure. bytes > 0.
  virtual void* raw_allocate(size_t bytes) = 0;
  virtual void raw_free(void* p) noexcept = 0;
  virtual void* raw_allocate_host(size_t bytes, bool pinned);
  virtual void raw_free_host(void* p, bool pinned) noexcept;

 private:
  friend class Buffer;
  void free(Buffer& b) noexcept;
  [[noreturn]] void out_of_memory(MemSpace space, MemCategory category, size_t bytes,
                                  const char* why);

  DeviceKind kind_;
  int index_;
  std::string name_;
  MemoryLedger ledger_;
};

// Creates a device. cuda: index is the GPU ordinal; throws zero::Error when the cuda backend
// is not built or the GPU cannot be opened.
std::unique_ptr<Device> make_device(DeviceKind kind, int index = 0,
                                    const DeviceOptions& options = {});

// Number of usable GPUs: 0 when the cuda backend is not built, there is no driver or no GPU.
// Never throws.
int cuda_device_count() noexcept;

}  // namespace zero
