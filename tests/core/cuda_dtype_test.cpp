// core/cuda/dtype_convert.cu: the device conversions agree bit for bit with the host's
// convert() (whose correctness dtype_test.cpp establishes), NaNs included. No tolerances: both
// sides implement the same exactly specified rounding.
// Without a CUDA device every test case reports Skipped, never passed.
#include <catch2/catch_test_macros.hpp>

#include <cuda_runtime_api.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/cuda/checks.hpp"
#include "tests/cuda_support.hpp"
#include "core/cuda/dtype_convert.hpp"
#include "core/dtype.hpp"

// Not `using namespace zero`: cuda_fp16.h (through cublas_v2.h) declares a global ::half.
using zero::convert;
using zero::DType;
using zero::size_of;
using zero::to_string;

using namespace zero::test;

namespace {

// Converts `src` (n elements of type s, as raw bytes) on the device and on the host; returns
// the number of elements whose bits differ. `offset` shifts both device buffers by that many
// elements, so the unaligned (scalar) path of the kernel runs too. Guard bytes after the end of
// the device output must stay untouched.
long device_vs_host(const std::vector<uint8_t>& src, DType s, DType d, size_t n, size_t offset,
                    const TestStream& stream) {
  constexpr size_t kGuard = 16;
  const size_t in_bytes = n * size_of(s), out_bytes = n * size_of(d);
  DeviceBuffer din((n + offset) * size_of(s));
  DeviceBuffer dout((n + offset + kGuard) * size_of(d));
  uint8_t* in = din.get() + offset * size_of(s);
  uint8_t* out = dout.get() + offset * size_of(d);
  ZERO_CHECK_CUDA(cudaMemcpyAsync(in, src.data(), in_bytes, cudaMemcpyHostToDevice, stream.get()));
  ZERO_CHECK_CUDA(cudaMemsetAsync(dout.get(), 0xa5, dout.bytes(), stream.get()));
  zero::cuda::convert_async(in, s, out, d, n, stream.get());
  std::vector<uint8_t> got(out_bytes + kGuard * size_of(d));
  ZERO_CHECK_CUDA(
      cudaMemcpyAsync(got.data(), out, got.size(), cudaMemcpyDeviceToHost, stream.get()));
  stream.sync();

  std::vector<uint8_t> want(out_bytes);
  convert(src.data(), s, want.data(), d, n);
  long bad = 0;
  for (size_t i = 0; i < n; ++i)
    bad += std::memcmp(got.data() + i * size_of(d), want.data() + i * size_of(d), size_of(d)) != 0;
  for (size_t i = out_bytes; i < got.size(); ++i)
    if (got[i] != 0xa5) ++bad;  // written past the end
  return bad;
}

std::vector<uint8_t> all_16bit_patterns() {
  std::vector<uint8_t> v(65536 * 2);
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto b = uint16_t(i);
    std::memcpy(v.data() + 2 * i, &b, 2);
  }
  return v;
}

// n floats: half uniformly random bit patterns (NaN and inf included), half with exponents
// near the 16-bit formats' ranges. Fixed seed, so every run sees the same values.
std::vector<uint8_t> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> any;
  std::uniform_int_distribution<uint32_t> near_exp(127 - 28, 127 + 17);
  std::vector<uint8_t> v(n * 4);
  for (size_t i = 0; i < n; ++i) {
    uint32_t u = any(rng);
    if (i % 2) u = (u & 0x807fffffu) | (near_exp(rng) << 23);
    std::memcpy(v.data() + 4 * i, &u, 4);
  }
  return v;
}

constexpr DType kTypes[] = {DType::f32, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("cuda dtype: all 65536 patterns of fp16 and bf16, to every type") {
  if (!have_gpu()) SKIP("no CUDA device");
  TestStream stream;
  const std::vector<uint8_t> all = all_16bit_patterns();
  for (DType s : {DType::f16, DType::bf16}) {
    for (DType d : kTypes) {
      INFO(to_string(s) << " -> " << to_string(d));
      CHECK(device_vs_host(all, s, d, 65536, 0, stream) == 0);
    }
  }
}

TEST_CASE("cuda dtype: millions of random floats to fp16 and bf16") {
  if (!have_gpu()) SKIP("no CUDA device");
  TestStream stream;
  const size_t n = 4'000'000;
  const std::vector<uint8_t> src = random_floats(n, 12345);
  for (DType d : kTypes) {
    INFO("fp32 -> " << to_string(d));
    CHECK(device_vs_host(src, DType::f32, d, n, 0, stream) == 0);
  }
}

TEST_CASE("cuda dtype: all 9 pairs, odd lengths, unaligned buffers") {
  if (!have_gpu()) SKIP("no CUDA device");
  TestStream stream;
  const std::vector<uint8_t> f32 = random_floats(70000, 99);
  const std::vector<uint8_t> all16 = all_16bit_patterns();
  for (DType s : kTypes) {
    for (DType d : kTypes) {
      for (size_t n : {size_t(1), size_t(3), size_t(4), size_t(5), size_t(1023), size_t(65535)}) {
        for (size_t offset : {size_t(0), size_t(1), size_t(2), size_t(3)}) {
          INFO(to_string(s) << " -> " << to_string(d) << ", n = " << n << ", offset " << offset);
          CHECK(device_vs_host(s == DType::f32 ? f32 : all16, s, d, n, offset, stream) == 0);
        }
      }
    }
  }
}

TEST_CASE("cuda dtype: n = 0 launches nothing, even with null pointers") {
  if (!have_gpu()) SKIP("no CUDA device");
  TestStream stream;
  for (DType s : kTypes)
    for (DType d : kTypes) zero::cuda::convert_async(nullptr, s, nullptr, d, 0, stream.get());
  stream.sync();
  CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("cuda dtype: more than 2^32 elements (size_t indexing, grid-stride loop)") {
  if (!have_gpu()) SKIP("no CUDA device");
  // 2^32 + 5 fp16 -> bf16: 16 GiB of device memory. Every input is 0x4040 (fp16 2.125, exactly
  // bf16 0x4008), so spot checks around index 2^32 show whether 32-bit indices wrapped.
  const size_t n = (size_t(1) << 32) + 5;
  size_t free_bytes = 0, total_bytes = 0;
  ZERO_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < 4 * n + (size_t(1) << 30)) SKIP("needs 17 GiB of free device memory");
  TestStream stream;
  DeviceBuffer in(2 * n);
  DeviceBuffer out(2 * (n + 1));
  ZERO_CHECK_CUDA(cudaMemsetAsync(in.get(), 0x40, in.bytes(), stream.get()));
  ZERO_CHECK_CUDA(cudaMemsetAsync(out.get(), 0, out.bytes(), stream.get()));
  zero::cuda::convert_async(in.get(), DType::f16, out.get(), DType::bf16, n, stream.get());
  const uint16_t want = to_bfloat16(zero::half::from_bits(0x4040)).bits;
  REQUIRE(want == 0x4008);
  for (size_t at : {size_t(0), (size_t(1) << 32) - 2, n - 4}) {
    uint16_t got[4] = {};
    ZERO_CHECK_CUDA(cudaMemcpyAsync(got, out.get() + 2 * at, sizeof got, cudaMemcpyDeviceToHost,
                                    stream.get()));
    stream.sync();
    for (uint16_t g : got) CHECK(g == want);
  }
  uint16_t past_end = 1;
  ZERO_CHECK_CUDA(
      cudaMemcpyAsync(&past_end, out.get() + 2 * n, 2, cudaMemcpyDeviceToHost, stream.get()));
  stream.sync();
  CHECK(past_end == 0);
}
