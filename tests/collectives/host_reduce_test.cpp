// host_reduce: the shared reduction arithmetic, against a plain loop written from the contract
// (fp32 accumulation in input order, avg divides, one rounding, NaN-propagating max). Bitwise.
#include <catch2/catch_test_macros.hpp>

#include <cmath>
#include <cstring>
#include <vector>

#include "collectives/reduce_kernel.hpp"

using namespace zero;
using coll::ReduceOp;

namespace {

float pseudo(uint64_t k) {
  k ^= k >> 31;
  k *= 0x9e3779b97f4a7c15ull;
  k ^= k >> 29;
  const float mant = static_cast<float>((k & 0x7fffff) | 0x800000);
  const float v = std::ldexp(mant, static_cast<int>((k >> 24) % 17) - 8 - 23);
  return (k >> 50) & 1 ? -v : v;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float round_to(DType dt, float x) {
  uint8_t tmp[4];
  float back;
  convert(&x, DType::f32, tmp, dt, 1);
  convert(tmp, dt, &back, DType::f32, 1);
  return back;
}

}  // namespace

TEST_CASE("host_reduce: every dtype, op, input count and length, bitwise against the contract") {
  for (DType dt : {DType::f32, DType::f16, DType::bf16})
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
      for (int n : {1, 2, 3, 4, 5, 8, 9})
        // Lengths around the 4096-element block and the 16-element vector width.
        for (size_t len : {size_t{1}, size_t{15}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{10007}}) {
          CAPTURE(to_string(dt), to_string(op), n, len);
          const size_t esz = size_of(dt);
          std::vector<std::vector<float>> x(static_cast<size_t>(n), std::vector<float>(len));
          std::vector<std::vector<uint8_t>> raw(static_cast<size_t>(n), std::vector<uint8_t>(len * esz));
          std::vector<const void*> in;
          for (int q = 0; q < n; ++q) {
            for (size_t i = 0; i < len; ++i) x[q][i] = pseudo(static_cast<uint64_t>(q) * 1000003 + i);
            convert(x[q].data(), DType::f32, raw[q].data(), dt, len);
            convert(raw[q].data(), dt, x[q].data(), DType::f32, len);  // the values as stored
            in.push_back(raw[q].data());
          }
          std::vector<uint8_t> out(len * esz);
          coll::host_reduce(dt, op, n, in.data(), n, out.data(), len);
          long bad = -1;
          for (size_t i = 0; i < len && bad < 0; ++i) {
            float acc = x[0][i];
            for (int q = 1; q < n; ++q)
              acc = op == ReduceOp::max ? ((x[q][i] > acc || x[q][i] != x[q][i]) ? x[q][i] : acc)
                                        : acc + x[q][i];
            if (op == ReduceOp::avg) acc /= static_cast<float>(n);
            float got;
            convert(out.data() + i * esz, dt, &got, DType::f32, 1);
            if (bits(got) != bits(round_to(dt, acc))) bad = static_cast<long>(i);
          }
          REQUIRE(bad == -1);
        }
}

TEST_CASE("host_reduce: the output may be one of the inputs") {
  std::vector<float> a(5000), b(5000), expect(5000);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = pseudo(i);
    b[i] = pseudo(i + 77777);
    expect[i] = a[i] + b[i];
  }
  const void* in[] = {a.data(), b.data()};
  coll::host_reduce(DType::f32, ReduceOp::sum, 2, in, 2, b.data(), b.size());  // out == input 1
  CHECK(b == expect);
}

TEST_CASE("host_reduce: max propagates NaN from any input, keeps infinities") {
  std::vector<float> a = {1, NAN, -INFINITY, 3}, b = {NAN, 2, -5, INFINITY}, out(4);
  const void* in[] = {a.data(), b.data()};
  coll::host_reduce(DType::f32, ReduceOp::max, 2, in, 2, out.data(), 4);
  CHECK(std::isnan(out[0]));
  CHECK(std::isnan(out[1]));
  CHECK(out[2] == -5);
  CHECK(out[3] == INFINITY);
}

TEST_CASE("host_reduce: bad arguments are errors") {
  float a = 1, out = 0;
  const void* in[] = {&a};
  CHECK_THROWS(coll::host_reduce(DType::f32, ReduceOp::sum, 1, in, 0, &out, 1));
  CHECK_THROWS(coll::host_reduce(DType::f32, ReduceOp::avg, 0, in, 1, &out, 1));
}
