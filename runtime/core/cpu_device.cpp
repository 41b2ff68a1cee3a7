// The cpu device: host memory with an optional capacity, cpu executor streams.
#include <cstdlib>
#include <cstring>

#include "runtime/core/device.hpp"

namespace zero {

namespace {

class CpuDevice final : public Device {
 public:
  CpuDevice(int index, const DeviceOptions& o)
      : Device(DeviceKind::cpu, index, "cpu:" + std::to_string(index),
               o.memory_limit ? o.memory_limit : kUnlimited,
               o.host_memory_limit ? o.host_memory_limit : kUnlimited) {}

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
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int index, const DeviceOptions& options) {
  return std::make_unique<CpuDevice>(index, options);
}

}  // namespace zero
