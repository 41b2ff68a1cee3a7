// Helpers shared by the GPU tests: whether a GPU is present, and RAII device memory and streams
// for the length of one test case. Test-only; cuda builds only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/cuda/checks.hpp"

namespace zero::test {

// Without a driver cudaGetDeviceCount fails and may leave n untouched: any error means no GPU.
inline bool have_gpu() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) (void)cudaGetLastError();
  return rc == cudaSuccess && n > 0;
}

// Device memory for the length of one test.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) { ZERO_CHECK_CUDA(cudaMalloc(&p_, bytes)); }
  ~DeviceBuffer() { (void)cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

// A non-blocking stream for the length of one test.
class TestStream {
 public:
  TestStream() { ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~TestStream() { (void)cudaStreamDestroy(s_); }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { ZERO_CHECK_CUDA(cudaStreamSynchronize(s_)); }

 private:
  cudaStream_t s_ = nullptr;
};

inline void upload(void* dst, const void* src, size_t bytes, const TestStream& s) {
  ZERO_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s.get()));
}
inline void download(void* dst, const void* src, size_t bytes, const TestStream& s) {
  ZERO_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s.get()));
}

}  // namespace zero::test
