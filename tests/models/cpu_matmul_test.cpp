// Tests of models/cpu/matmul.hpp: oneDNN products against an fp64 reference for every transpose,
// leading dimensions wider than the rows, "=" and "+="; the same bits from repeated, concurrent
// and differently-threaded calls; empty shapes; refused operands; PackedWeight and transpose();
// the 16-bit copies of pack16.hpp on both of their paths.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <omp.h>
#include <tbb/parallel_for.h>

#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"
#include "models/cpu/matmul.hpp"
#include "models/cpu/pack16.hpp"

using namespace zero;
using zero::models::cpu::matmul;
using zero::models::cpu::MatrixRef;

namespace {

// A rows x cols matrix stored row-major with leading dimension ld (> cols: padding that must
// not be read into the product), of `type`, with values that type holds exactly.
struct Stored {
  ScalarType type;
  int64_t rows, cols, ld;
  std::vector<double> v;          // logical values, row-major rows x cols
  std::vector<float> f32;         // storage when type is f32
  std::vector<bfloat16> b16;      // storage when type is bf16

  Stored(ScalarType t, int64_t r, int64_t c, uint64_t seed, int64_t pad = 3)
      : type(t), rows(r), cols(c), ld(c + pad) {
    std::mt19937_64 gen(seed);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    v.resize(static_cast<size_t>(r * c));
    f32.assign(static_cast<size_t>(r * ld), 1e30f);  // padding: huge, so reading it shows
    b16.assign(static_cast<size_t>(r * ld), to_bfloat16(1e30f));
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        const float x = dist(gen);
        const size_t s = static_cast<size_t>(i * ld + j);
        if (t == ScalarType::bf16) {
          b16[s] = to_bfloat16(x);
          v[static_cast<size_t>(i * c + j)] = to_float(b16[s]);
        } else {
          f32[s] = x;
          v[static_cast<size_t>(i * c + j)] = x;
        }
      }
  }
  MatrixRef ref(bool trans) const {
    return {type == ScalarType::bf16 ? static_cast<const void*>(b16.data()) : f32.data(), type,
            ld, trans};
  }
  double at(int64_t i, int64_t j) const { return v[static_cast<size_t>(i * cols + j)]; }
};

// Puts pack16's copies back on their default path when a test leaves (also on failure).
struct RestoreCopies {
  ~RestoreCopies() { zero::models::cpu::pack16::use_vector_copies(true); }
};

}  // namespace

TEST_CASE("matmul: every transpose of fp32 and bf16 agrees with fp64 within fp32 accumulation") {
  const int64_t M = 37, N = 29, K = 300;
  for (ScalarType t : {ScalarType::f32, ScalarType::bf16}) {
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (int acc = 0; acc < 2; ++acc) {
          INFO(to_string(t) << (ta ? " A^T" : "") << (tb ? " B^T" : "") << (acc ? " +=" : ""));
          // op(A) is M x K: stored K x M when transposed.
          const Stored A(t, ta ? K : M, ta ? M : K, 1), B(t, tb ? N : K, tb ? K : N, 2);
          const int64_t ldc = N + 5;
          std::vector<float> C(static_cast<size_t>(M * ldc));
          for (size_t i = 0; i < C.size(); ++i) C[i] = float(i % 7) - 3.0f;
          const std::vector<float> C0 = C;
          matmul(M, N, K, A.ref(ta), B.ref(tb), C.data(), ldc, acc == 1);
          double worst = 0;
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t j = 0; j < N; ++j) {
              double ref = acc ? double(C0[size_t(i * ldc + j)]) : 0.0, mag = std::abs(ref);
              for (int64_t k = 0; k < K; ++k) {
                const double a = ta ? A.at(k, i) : A.at(i, k), b = tb ? B.at(j, k) : B.at(k, j);
                ref += a * b;
                mag += std::abs(a * b);
              }
              // The operands are exact in their type and bf16 x bf16 products exact in fp32, so
              // only the fp32 sum rounds: at most K+1 additions of relative 2^-24 each.
              const double bound = double(K + 1) * std::ldexp(1.0, -24) * mag;
              worst = std::max(worst, std::abs(C[size_t(i * ldc + j)] - ref) / bound);
            }
            // Columns past N are C's padding: never written.
            for (int64_t j = N; j < ldc; ++j)
              CHECK(C[size_t(i * ldc + j)] == C0[size_t(i * ldc + j)]);
          }
          INFO("largest error over its bound: " << worst);
          CHECK(worst <= 1.0);
        }
  }
}

TEST_CASE("matmul: repeated and concurrent calls give the same bits whatever OpenMP is told") {
  const int64_t M = 130, N = 257, K = 512;
  const Stored A(ScalarType::bf16, M, K, 3), B(ScalarType::bf16, N, K, 4);
  const auto run = [&](std::vector<float>& C) {
    C.assign(static_cast<size_t>(M * N), 0.0f);
    matmul(M, N, K, A.ref(false), B.ref(true), C.data(), N, false);
  };
  std::vector<float> first;
  run(first);
  // 16 calls at once on oneTBB's threads, each into its own output (the cached primitive is
  // shared, the scratch is per thread).
  std::vector<std::vector<float>> many(16);
  tbb::parallel_for(size_t{0}, many.size(), [&](size_t i) { run(many[i]); });
  for (const auto& c : many) CHECK(std::memcmp(c.data(), first.data(), c.size() * 4) == 0);
  // A thread whose OpenMP setting asks for more threads: matmul still runs one, same bits.
  omp_set_num_threads(4);
  std::vector<float> again;
  run(again);
  CHECK(std::memcmp(again.data(), first.data(), again.size() * 4) == 0);
  CHECK(omp_get_max_threads() == 1);  // the documented side effect on the calling thread
}

TEST_CASE("matmul: empty shapes and refused operands") {
  const Stored A(ScalarType::f32, 3, 4, 5);
  std::vector<float> C(3 * 2, 7.0f);
  // K = 0: "=" gives zeros, "+=" leaves C.
  matmul(3, 2, 0, A.ref(false), A.ref(false), C.data(), 2, true);
  CHECK(C == std::vector<float>(6, 7.0f));
  matmul(3, 2, 0, A.ref(false), A.ref(false), C.data(), 2, false);
  CHECK(C == std::vector<float>(6, 0.0f));
  matmul(0, 2, 4, A.ref(false), A.ref(false), nullptr, 2, false);  // nothing to do
  const Stored Bb(ScalarType::bf16, 4, 2, 6);
  REQUIRE_THROWS_WITH(matmul(3, 2, 4, A.ref(false), Bb.ref(false), C.data(), 2, false),
                      Catch::Matchers::ContainsSubstring("operands of types fp32 and bf16"));
  CHECK(models::cpu::matmul_supports(ScalarType::f32));
  CHECK(models::cpu::matmul_description(ScalarType::f32).starts_with("oneDNN "));
  // fp16: an optimised kernel only on CPUs with AVX512-FP16; without one, the description says so
  // and the kernels keep fp16 parameters on their fp32 path.
  if (!models::cpu::matmul_supports(ScalarType::f16))
    CHECK(models::cpu::matmul_description(ScalarType::f16) == "unsupported");
}

TEST_CASE("PackedWeight: products on the packed weight agree with fp64 and repeat bit for bit") {
  using zero::models::cpu::PackedWeight;
  // rows = 128 as the kernels use it; N not a multiple of the 64-column block, K odd (a padded
  // pair of rows in the VNNI layout), B with padding columns (1e30) that must not be read.
  const int64_t rows = 128, N = 200, K = 301;
  for (ScalarType t : {ScalarType::f32, ScalarType::bf16}) {
    for (int tb = 0; tb < 2; ++tb)
      for (int acc = 0; acc < 2; ++acc) {
        INFO(to_string(t) << (tb ? " B^T" : "") << (acc ? " +=" : ""));
        const Stored B(t, tb ? N : K, tb ? K : N, 7);
        const PackedWeight pw(rows, N, K, B.ref(tb), acc == 1);
        // The packed shape with A dense (the product the packing was made for), the same with a
        // padded A, and a shorter block.
        for (const auto& [M, pad] : {std::pair<int64_t, int64_t>{rows, 0}, {rows, 3}, {37, 0}}) {
          INFO("M " << M << ", A padded by " << pad);
          const Stored A(t, M, K, 8, pad);
          std::vector<float> C(static_cast<size_t>(M * N));
          for (size_t i = 0; i < C.size(); ++i) C[i] = float(i % 5) - 2.0f;
          const std::vector<float> C0 = C;
          pw.multiply(M, A.ref(false), C.data(), N);
          double worst = 0;
          for (int64_t i = 0; i < M; ++i)
            for (int64_t j = 0; j < N; ++j) {
              double ref = acc ? double(C0[size_t(i * N + j)]) : 0.0, mag = std::abs(ref);
              for (int64_t k = 0; k < K; ++k) {
                const double p = A.at(i, k) * (tb ? B.at(j, k) : B.at(k, j));
                ref += p;
                mag += std::abs(p);
              }
              // As the first test: exact products, K + 1 fp32 additions.
              const double bound = double(K + 1) * std::ldexp(1.0, -24) * mag;
              worst = std::max(worst, std::abs(C[size_t(i * N + j)] - ref) / bound);
            }
          INFO("largest error over its bound: " << worst);
          CHECK(worst <= 1.0);
          // The same call again, and on another thread: the same bits.
          std::vector<float> again = C0, other = C0;
          pw.multiply(M, A.ref(false), again.data(), N);
          std::thread([&] { pw.multiply(M, A.ref(false), other.data(), N); }).join();
          CHECK(std::memcmp(again.data(), C.data(), C.size() * 4) == 0);
          CHECK(std::memcmp(other.data(), C.data(), C.size() * 4) == 0);
        }
      }
  }
}

TEST_CASE("transpose: 16-bit matrices of every edge shape are copied exactly") {
  namespace pack16 = zero::models::cpu::pack16;
  const RestoreCopies restore;
  // Whole 32 x 64 blocks, partial ones in each direction, odd sizes, a leading dimension wider
  // than the columns, and one row / one column; on the AVX-512 path (where the CPU has it) and on
  // the scalar loops.
  const std::pair<int64_t, int64_t> shapes[] = {{64, 128}, {70, 130}, {33, 65}, {1, 100}, {100, 1},
                                                {31, 63}};
  for (const bool vector : {true, false}) {
    pack16::use_vector_copies(vector);
    INFO((pack16::vector_copies() ? "AVX-512 path" : "scalar path"));
    for (const auto& [rows, cols] : shapes) {
      INFO(rows << " x " << cols);
      const int64_t ld = cols + 5;
      std::vector<uint16_t> src(static_cast<size_t>(rows * ld));
      for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
      std::vector<uint16_t> dst(static_cast<size_t>(rows * cols), 0xdead);
      zero::models::cpu::transpose(rows, cols, ScalarType::bf16, src.data(), ld, dst.data());
      bool same = true;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          same = same && dst[size_t(c * rows + r)] == src[size_t(r * ld + c)];
      CHECK(same);
    }
  }
}

TEST_CASE("pack16: VNNI blocks hold each element where the layout says, on both paths") {
  namespace pack16 = zero::models::cpu::pack16;
  const RestoreCopies restore;
  // oneDNN's AMX layout on the development machine (16 pairs of rows x 64 columns per block), K
  // and N not multiples of a block (padding must be zero), B stored plain and transposed with a
  // wider leading dimension. Blocks laid N-block-major, as oneDNN's weights descriptor puts them.
  const int64_t K = 301, N = 200, kb = 16, nb = 64;
  const int64_t Kp = (K + 2 * kb - 1) / (2 * kb) * (2 * kb), Np = (N + nb - 1) / nb * nb;
  const pack16::VnniLayout v{kb, nb, 2 * kb * nb, Kp * nb, Kp, Np};
  for (const bool trans : {false, true}) {
    INFO((trans ? "B stored transposed" : "B stored plain"));
    const int64_t rows = trans ? N : K, cols = trans ? K : N, ld = cols + 7;
    std::vector<uint16_t> src(static_cast<size_t>(rows * ld));
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint16_t>(i * 40503u + 17);
    std::vector<uint16_t> packed[2];
    for (const int path : {0, 1}) {
      pack16::use_vector_copies(path == 0);
      packed[path].assign(static_cast<size_t>(Kp * Np), 0xdead);
      for (int64_t j = 0; j < Np / nb; ++j)
        pack16::pack_vnni_block(v, src.data(), ld, trans, K, N, j, packed[path].data());
    }
    // Each element at its place: block (k / 2kb, n / nb), pair row (k % 2kb) / 2, column n % nb,
    // half k % 2; zeros outside K x N.
    bool placed = true;
    for (int64_t k = 0; k < Kp; ++k)
      for (int64_t n = 0; n < Np; ++n) {
        const int64_t at = (k / (2 * kb)) * v.sk + (n / nb) * v.sn +
                           (((k % (2 * kb)) / 2) * nb + n % nb) * 2 + k % 2;
        const uint16_t want = k < K && n < N ? src[size_t(trans ? n * ld + k : k * ld + n)] : 0;
        placed = placed && packed[1][size_t(at)] == want;
      }
    CHECK(placed);  // the scalar loops
    CHECK(packed[0] == packed[1]);  // the AVX-512 path (where the CPU has it): the same bytes
  }
}
