// The fp32 element-wise kernels (contract in elementwise.hpp): the choice of vector path, and
// the oneTBB loops over fixed blocks around the per-ISA leaf functions of elementwise_body.hpp.
#include "models/cpu/elementwise.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "models/cpu/elementwise_simd.hpp"
#include "models/cpu/kernel_common.hpp"

namespace zero::models::cpu::elementwise {
namespace {

using detail::Table;

// Elements per task for the element-wise kernels: 64 KiB of each stream, a multiple of the 16
// lanes (so no block but the last has a tail), big enough that a task's overhead is noise.
constexpr int64_t kElemBlock = 16384;
// Rows per partial of layernorm's parameter-gradient sums (kernels.cpp's kSumRows).
constexpr int64_t kSumRows = 64;
// Columns per task when those partials are added up.
constexpr int64_t kSumCols = 256;

const Table& table_of(Simd simd) {
#if ZERO_ELEMENTWISE_X86
  if (simd == Simd::avx512) return detail::table_avx512();
  if (simd == Simd::avx2) return detail::table_avx2();
#endif
  return detail::table_generic();
}

Simd widest() {
  return supported(Simd::avx512) ? Simd::avx512
                                 : supported(Simd::avx2) ? Simd::avx2 : Simd::generic;
}

// The path in use. Chosen at the first kernel call (static initialisation order would not
// guarantee it before other files' static objects run kernels); use() replaces it.
std::atomic<Simd> g_simd{Simd::best};

const Table& table() {
  Simd s = g_simd.load(std::memory_order_relaxed);
  if (s == Simd::best) {
    s = widest();
    g_simd.store(s, std::memory_order_relaxed);  // every thread computes the same value
  }
  return table_of(s);
}

}  // namespace

const char* to_string(Simd simd) noexcept {
  switch (simd) {
    case Simd::best: return "best";
    case Simd::avx512: return "avx512";
    case Simd::avx2: return "avx2";
    case Simd::generic: return "generic";
  }
  return "?";
}

bool supported(Simd simd) noexcept {
#if ZERO_ELEMENTWISE_X86
  __builtin_cpu_init();
  if (simd == Simd::avx512) return __builtin_cpu_supports("avx512f");
  if (simd == Simd::avx2) return __builtin_cpu_supports("avx2");
  return true;
#else
  return simd == Simd::best || simd == Simd::generic;
#endif
}

Simd active() noexcept {
  table();
  return g_simd.load(std::memory_order_relaxed);
}

void use(Simd simd) {
  ZERO_REQUIRE(supported(simd), std::string("cpu element-wise kernels: this CPU cannot run the ") +
                                    to_string(simd) + " path; use best");
  g_simd.store(simd == Simd::best ? widest() : simd, std::memory_order_relaxed);
}

// ---- whole tensors -----------------------------------------------------------------------------

void gelu_forward(float* y, const float* x, int64_t n) {
  const Table& t = table();
  cpu::detail::for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
    t.gelu_forward(y + i0, x + i0, i1 - i0);
  });
}

void gelu_backward(float* dx, const float* dy, const float* x, int64_t n) {
  const Table& t = table();
  cpu::detail::for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
    t.gelu_backward(dx + i0, dy + i0, x + i0, i1 - i0);
  });
}

void add(float* out, const float* a, const float* b, int64_t n) {
  const Table& t = table();
  cpu::detail::for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
    t.add(out + i0, a + i0, b + i0, i1 - i0);
  });
}

void add_bias(float* y, const float* b, int64_t N, int64_t C) {
  const Table& t = table();
  cpu::detail::for_blocks(N, cpu::detail::kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) t.add(y + r * C, y + r * C, b, C);
  });
}

void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C) {
  const Table& t = table();
  cpu::detail::for_blocks(N, cpu::detail::kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      t.layernorm_forward_row(y + r * C, mean + r, rstd + r, x + r * C, w, b, C);
  });
}

void layernorm_backward(float* dx, float* dw_sum, float* db_sum, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N,
                        int64_t C) {
  const Table& t = table();
  // One pass over dy and x: each block of kSumRows rows writes its rows' dx and adds their dw, db
  // terms, row by row, into its own partial [dw | db]; the partials are then added in block order.
  const int64_t blocks = (N + kSumRows - 1) / kSumRows;
  std::vector<float> partial(static_cast<size_t>(blocks * 2 * C), 0.0f);
  cpu::detail::for_blocks(N, kSumRows, [&](int64_t r0, int64_t r1) {
    float* acc = partial.data() + (r0 / kSumRows) * 2 * C;
    for (int64_t r = r0; r < r1; ++r)
      t.layernorm_backward_row(dx + r * C, acc, acc + C, dy + r * C, x + r * C, w, mean[r],
                               rstd[r], C);
  });
  cpu::detail::for_blocks(2 * C, kSumCols, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      float s = 0.0f;
      for (int64_t blk = 0; blk < blocks; ++blk) s += partial[static_cast<size_t>(blk * 2 * C + j)];
      (j < C ? dw_sum[j] : db_sum[j - C]) = s;
    }
  });
}

float cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                            int64_t V) {
  const Table& t = table();
  cpu::detail::for_blocks(N, cpu::detail::kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (targets[r] < 0) {
        losses[r] = 0.0f;
        continue;
      }
      // Two reads of the row (max, then the exponentials' sum, nothing stored): the second from
      // L2, as a row of the vocabulary (32 KiB for 8192 entries) stays there.
      const float* row = logits + r * V;
      const float m = t.row_max(row, V);
      const float sum = t.exp_sum(nullptr, row, m, V);
      losses[r] = m + std::log(sum) - row[targets[r]];  // logsumexp - the target's logit
    }
  });
  return cpu::detail::mean_loss(losses, targets, N);
}

void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            int64_t N, int64_t V, float f) {
  const Table& t = table();
  cpu::detail::for_blocks(N, cpu::detail::kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* d = dlogits + r * V;
      if (targets[r] < 0) {
        std::fill_n(d, V, 0.0f);
        continue;
      }
      const float* row = logits + r * V;
      const float inv = 1.0f / t.exp_sum(d, row, t.row_max(row, V), V);
      const float p_target = d[targets[r]] * inv;
      t.scale(d, inv, f, V);  // f * (e * inv): the vocabulary-parallel backward's formula
      d[targets[r]] = f * (p_target - 1.0f);
    }
  });
}

// ---- rows --------------------------------------------------------------------------------------

float row_max(const float* x, int64_t n) { return table().row_max(x, n); }

float exp_sum(float* out, const float* x, float shift, int64_t n) {
  return table().exp_sum(out, x, shift, n);
}

void scale(float* d, float inv, float f, int64_t n) { table().scale(d, inv, f, n); }

void softmax_causal_row(float* row, int64_t n, int64_t width) {
  const Table& t = table();
  const float inv = 1.0f / t.exp_sum(row, row, t.row_max(row, n), n);
  t.scale(row, inv, 1.0f, n);
  std::fill(row + n, row + width, 0.0f);
}

void softmax_causal_backward_row(float* d, const float* p, int64_t n, int64_t width) {
  const Table& t = table();
  t.softmax_backward(d, p, t.dot(p, d, n), n);
  std::fill(d + n, d + width, 0.0f);
}

float dot(const float* a, const float* b, int64_t n) { return table().dot(a, b, n); }

void softmax_backward_row(float* d, const float* p, float dt, int64_t n) {
  table().softmax_backward(d, p, dt, n);
}

}  // namespace zero::models::cpu::elementwise
