// Tests of models/cpu/matmul.hpp: oneDNN products against an fp64 reference for every transpose,
// leading dimensions wider than the rows, "=" and "+="; the same bits from repeated, concurrent
// and differently-threaded calls; empty shapes; refused operands; PackedWeight and transpose();
// the 16-bit copies of pack16.hpp on both of their paths; the AMX tile products and bf16
// roundings of amx.hpp (skipped on CPUs without AMX).
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
#include "models/cpu/amx.hpp"
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
    // A CPU without bf16 products (AVX2 only: oneDNN 2.6 has none) leaves bf16 to the kernels'
    // fp32 path and never asks matmul for it (kernels.cpp asks matmul_supports first).
    if (!models::cpu::matmul_supports(t)) {
      WARN(to_string(t) << " products not tested: none on this CPU");
      continue;
    }
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
  // bf16 where this CPU has bf16 products, else fp32 (the same promise holds for both).
  const ScalarType t =
      models::cpu::matmul_supports(ScalarType::bf16) ? ScalarType::bf16 : ScalarType::f32;
  if (t != ScalarType::bf16) WARN("no bf16 products on this CPU: the concurrency test runs on fp32");
  const Stored A(t, M, K, 3), B(t, N, K, 4);
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
    if (!models::cpu::matmul_supports(t)) {  // as in the first test case
      WARN(to_string(t) << " packed products not tested: none on this CPU");
      continue;
    }
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

TEST_CASE("pack16: 32-bit transposes and interleaved row pairs, on both paths") {
  namespace pack16 = zero::models::cpu::pack16;
  const RestoreCopies restore;
  // Whole 16 x 16 blocks and partial ones; leading dimensions wider than the rows, and 16-bit
  // sources read as 32-bit pairs at an offset of one pair (4-byte, not 64-byte, alignment).
  const std::pair<int64_t, int64_t> shapes[] = {{64, 32}, {37, 21}, {16, 1}, {1, 16}, {130, 48}};
  for (const auto& [rows, cols] : shapes) {
    INFO(rows << " x " << cols);
    const int64_t ld = cols + 3, ldd = rows + 5, ldz = 2 * cols + 1;
    std::vector<uint32_t> src(static_cast<size_t>(rows * ld + 1));
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint32_t>(i * 2654435761u);
    std::vector<uint32_t> t[2];
    std::vector<uint32_t> z[2];
    // The same numbers as 16-bit rows: 2 * rows x (2 * ld) elements, zipped in pairs.
    std::vector<uint16_t> h(src.size() * 2);
    std::memcpy(h.data(), src.data(), src.size() * 4);
    for (const int path : {0, 1}) {
      pack16::use_vector_copies(path == 0);
      t[path].assign(static_cast<size_t>(cols * ldd), 0xdeadbeef);
      pack16::transpose32(rows, cols, src.data() + 1, ld, t[path].data(), ldd);
      z[path].assign(static_cast<size_t>(rows / 2 * ldz), 0xdeadbeef);
      pack16::zip_rows(2 * (rows / 2), 2 * cols, h.data() + 2, 2 * ld, z[path].data(), ldz);
    }
    bool transposed = true, zipped = true, untouched = true;
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < ldd; ++r) {
        const uint32_t got = t[1][size_t(c * ldd + r)];
        if (r < rows) transposed = transposed && got == src[size_t(1 + r * ld + c)];
        else untouched = untouched && got == 0xdeadbeef;
      }
    for (int64_t p = 0; p < rows / 2; ++p)
      for (int64_t c = 0; c < 2 * cols; ++c) {
        const uint32_t want = uint32_t{h[size_t(2 + 2 * p * 2 * ld + c)]} |
                              uint32_t{h[size_t(2 + (2 * p + 1) * 2 * ld + c)]} << 16;
        zipped = zipped && z[1][size_t(p * ldz + c)] == want;
      }
    CHECK(transposed);  // the scalar loops
    CHECK(zipped);
    CHECK(untouched);
    CHECK(t[0] == t[1]);  // the AVX-512 path (where the CPU has it): the same bytes
    CHECK(z[0] == z[1]);
  }
}

TEST_CASE("amx: bf16 rounding into rows and pairs is to_bfloat16's, NaN and ties included") {
  namespace amx = zero::models::cpu::amx;
  if (!amx::available()) SKIP("this CPU (or kernel) offers no AMX tiles");
  // Ties both ways, the largest finite values (which round to inf), subnormals, signed zeros,
  // infinities and NaNs with payloads, then random bits: 4 rows x 37 columns (a vector tail).
  const int64_t rows = 4, cols = 37, ld = 40;
  const uint32_t special[] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xff7f8000u, 0x00000001u,
                              0x80008000u, 0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                              0x7f800001u, 0xffc00001u, 0x7fffffffu, 0x3f7fffffu, 0x007fffffu};
  std::vector<float> x(static_cast<size_t>(rows * ld));
  std::mt19937_64 gen(7);
  for (size_t i = 0; i < x.size(); ++i) {
    const uint32_t u = i < std::size(special) ? special[i] : static_cast<uint32_t>(gen());
    std::memcpy(&x[i], &u, 4);
  }
  std::vector<uint16_t> r(static_cast<size_t>(rows * cols));
  std::vector<uint32_t> p(static_cast<size_t>(rows / 2 * cols));
  amx::round_rows(x.data(), ld, rows, cols, r.data(), cols);
  amx::round_pairs(x.data(), ld, rows, cols, p.data(), cols);
  bool rows_ok = true, pairs_ok = true;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c) {
      const uint16_t want = to_bfloat16(x[size_t(i * ld + c)]).bits;
      rows_ok = rows_ok && r[size_t(i * cols + c)] == want;
      const uint32_t word = p[size_t(i / 2 * cols + c)];
      pairs_ok = pairs_ok && static_cast<uint16_t>(i % 2 ? word >> 16 : word) == want;
    }
  CHECK(rows_ok);
  CHECK(pairs_ok);
}

TEST_CASE("amx: tile products match an fp64 reference, = and +=, every block edge") {
  namespace amx = zero::models::cpu::amx;
  if (!amx::available()) SKIP("this CPU (or kernel) offers no AMX tiles");
  // M, N: one 16-row tile, one 2 x 2 block, a block plus a single tile; K: one to four steps.
  // Leading dimensions wider than the operands (their padding holds NaN: reading it would show).
  const int64_t Ms[] = {16, 32, 48, 128}, Ns[] = {16, 48, 64}, Ks[] = {32, 64, 128};
  std::mt19937_64 gen(11);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  const uint16_t nan16 = 0x7fc1;
  for (const int64_t M : Ms)
    for (const int64_t N : Ns)
      for (const int64_t K : Ks)
        for (const bool acc : {false, true}) {
          INFO("M " << M << " N " << N << " K " << K << (acc ? " +=" : " ="));
          const int64_t lda = K + 8, ldb = N + 4, ldc = N + 3;
          std::vector<uint16_t> A(static_cast<size_t>(M * lda), nan16);
          std::vector<uint32_t> Bp(static_cast<size_t>(K / 2 * ldb), uint32_t{nan16} * 0x10001u);
          std::vector<float> C(static_cast<size_t>(M * ldc), 1e30f);
          std::vector<double> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(K * N));
          for (int64_t i = 0; i < M; ++i)
            for (int64_t k = 0; k < K; ++k) {
              const bfloat16 v = to_bfloat16(dist(gen));
              A[size_t(i * lda + k)] = v.bits;
              a[size_t(i * K + k)] = to_float(v);
            }
          for (int64_t k = 0; k < K; ++k)
            for (int64_t n = 0; n < N; ++n) {
              const bfloat16 v = to_bfloat16(dist(gen));
              uint32_t& w = Bp[size_t(k / 2 * ldb + n)];
              w = k % 2 ? (w & 0xffffu) | uint32_t{v.bits} << 16 : (w & 0xffff0000u) | v.bits;
              b[size_t(k * N + n)] = to_float(v);
            }
          std::vector<float> C0(C);
          for (int64_t i = 0; i < M; ++i)
            for (int64_t n = 0; n < N; ++n) C0[size_t(i * ldc + n)] = C[size_t(i * ldc + n)] = dist(gen);
          amx::product(M, N, K, A.data(), lda, Bp.data(), ldb, C.data(), ldc, acc);
          double worst = 0;
          bool pad_kept = true;
          for (int64_t i = 0; i < M; ++i) {
            for (int64_t n = 0; n < N; ++n) {
              double exact = acc ? C0[size_t(i * ldc + n)] : 0.0, mag = std::abs(exact);
              for (int64_t k = 0; k < K; ++k) {
                exact += a[size_t(i * K + k)] * b[size_t(k * N + n)];
                mag += std::abs(a[size_t(i * K + k)] * b[size_t(k * N + n)]);
              }
              // fp32 accumulation of K / 2 pair sums (plus the start): each step within 2^-24 of
              // the running magnitude; 2 (K + 2) 2^-24 of the sum of magnitudes covers it.
              worst = std::max(worst, std::abs(C[size_t(i * ldc + n)] - exact) /
                                          (2.0 * double(K + 2) * 0x1p-24 * mag));
            }
            for (int64_t n = N; n < ldc; ++n) pad_kept = pad_kept && C[size_t(i * ldc + n)] == 1e30f;
          }
          INFO("worst error / bound " << worst);
          CHECK(worst <= 1.0);
          CHECK(pad_kept);
        }
}
