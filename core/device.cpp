#include "core/device.hpp"

#include <unistd.h>

#include <cstdlib>

namespace zero {

// Backends (cpu_device.cpp, cuda/device.cpp).
std::unique_ptr<Device> make_cpu_device(int index, const DeviceOptions& options);
#ifdef ZERO_HAVE_CUDA
std::unique_ptr<Device> make_cuda_device(int index, const DeviceOptions& options);
int cuda_device_count_impl() noexcept;
#endif

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = other.device_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    space_ = other.space_;
    category_ = other.category_;
    pinned_ = other.pinned_;
    other.device_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() noexcept {
  if (device_) device_->free(*this);
  device_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

Device::Device(DeviceKind kind, int index, std::string name, size_t capacity, size_t host_capacity,
               size_t shared_capacity)
    : kind_(kind), index_(index), name_(name),
      ledger_(std::move(name), capacity, host_capacity, shared_capacity) {}

void Device::out_of_memory(MemSpace space, MemCategory category, size_t bytes, const char* why) {
  const LedgerSnapshot snap = ledger_.snapshot();
  const int s = static_cast<int>(space);
  // Which bound refused it: the space's own capacity, or the one device and host share.
  const size_t both = snap.total[0].current + snap.total[1].current;
  const bool own = bytes > snap.capacity[s] || snap.total[s].current > snap.capacity[s] - bytes;
  const bool shared = !own && snap.shared_capacity != kUnlimited &&
                      (bytes > snap.shared_capacity || both > snap.shared_capacity - bytes);
  std::string msg = "out of " + std::string(to_string(space)) + " memory on " + name_ +
                    ": cannot allocate " + format_bytes(bytes) + " of " +
                    std::string(to_string(category)) + " (" + why + "; in use " +
                    (shared ? format_bytes(both) + " of the " + format_bytes(snap.shared_capacity) +
                                  " that device and host memory share"
                            : format_bytes(snap.total[s].current) + " of " +
                                  format_bytes(snap.capacity[s])) +
                    ")";
  if (space == MemSpace::device) {
    if (const std::string outside = outside_ledger_report(); !outside.empty()) msg += "\n" + outside;
  }
  if (shared)
    msg += "\nHINT: on this device, device and host memory are the same RAM, so offloading makes "
           "no room: use a higher ZeRO stage, more ranks on more nodes, a smaller model, or give "
           "the job more memory (the container's or the batch system's memory limit).";
  else
    msg += "\nHINT: raise the limit (zero_train.device_memory_limit / host_memory_limit), use a "
           "higher ZeRO stage, more ranks, or offload (offload_optimizer, offload_param).";
  throw OutOfMemory(std::move(msg), snap);
}

Buffer Device::allocate(size_t bytes, MemCategory category) {
  Buffer b;
  b.device_ = this;
  b.space_ = MemSpace::device;
  b.category_ = category;
  if (bytes == 0) return b;
  if (!ledger_.try_reserve(MemSpace::device, category, bytes))
    out_of_memory(MemSpace::device, category, bytes, "over capacity");
  void* p = nullptr;
  try {
    p = raw_allocate(bytes);
  } catch (...) {
    ledger_.release(MemSpace::device, category, bytes);
    b.device_ = nullptr;
    throw;
  }
  if (!p) {
    ledger_.release(MemSpace::device, category, bytes);
    b.device_ = nullptr;
    out_of_memory(MemSpace::device, category, bytes, "the allocator refused");
  }
  b.data_ = p;
  b.bytes_ = bytes;
  return b;
}

Buffer Device::allocate_host(size_t bytes, MemCategory category, bool pinned) {
  Buffer b;
  b.device_ = this;
  b.space_ = MemSpace::host;
  b.category_ = category;
  b.pinned_ = pinned;
  if (bytes == 0) return b;
  if (!ledger_.try_reserve(MemSpace::host, category, bytes))
    out_of_memory(MemSpace::host, category, bytes, "over capacity");
  void* p = nullptr;
  try {
    p = raw_allocate_host(bytes, pinned);
  } catch (...) {
    ledger_.release(MemSpace::host, category, bytes);
    b.device_ = nullptr;
    throw;
  }
  if (!p) {
    ledger_.release(MemSpace::host, category, bytes);
    b.device_ = nullptr;
    out_of_memory(MemSpace::host, category, bytes,
                  pinned ? "pinning host memory failed" : "the host allocator refused");
  }
  b.data_ = p;
  b.bytes_ = bytes;
  return b;
}

void Device::free(Buffer& b) noexcept {
  if (!b.data_) return;
  if (b.space_ == MemSpace::device)
    raw_free(b.data_);
  else
    raw_free_host(b.data_, b.pinned_);
  ledger_.release(b.space_, b.category_, b.bytes_);
}

void* Device::raw_allocate_host(size_t bytes, bool /*pinned*/) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t rounded = (bytes + page - 1) / page * page;
  return std::aligned_alloc(page, rounded);
}

void Device::raw_free_host(void* p, bool /*pinned*/) noexcept { std::free(p); }

std::unique_ptr<Device> make_device(DeviceKind kind, int index, const DeviceOptions& options) {
  if (kind == DeviceKind::cpu) return make_cpu_device(index, options);
#ifdef ZERO_HAVE_CUDA
  return make_cuda_device(index, options);
#else
  ZERO_FAIL("device 'cuda' requested, but this build has no cuda backend\n"
            "HINT: rebuild with nvcc on PATH (cmake -DZERO_CUDA=ON), or use device 'cpu'");
#endif
}

int cuda_device_count() noexcept {
#ifdef ZERO_HAVE_CUDA
  return cuda_device_count_impl();
#else
  return 0;
#endif
}

}  // namespace zero
