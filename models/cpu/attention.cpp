// Causal attention without the [B, NH, T, T] probabilities (kernels.hpp: attention_forward_lse,
// attention_backward_lse; docs/cpu-kernels.md, "Attention without the T x T probabilities").
//
// Forward, FlashAttention's online softmax: a query block of kQueryBlock rows meets the keys in
// blocks of kKeyBlock columns, up to its own last row (the causal bound). Each block's scores
// S = q k^T / sqrt(hs) go to a [kQueryBlock, kKeyBlock] scratch; each row keeps its running max m
// and sum l of exp(S - m); when a block raises a row's max, the row's sum and its accumulated
// output (in `out` itself) are scaled by exp(m_old - m_new) before the block's exp(S - m_new) V
// is added. At the end out = acc / l and lse = m + log l, the only statistics kept.
//
// Backward, FlashAttention-2's recomputation: with D[t] = sum_c dout[t,c] out[t,c] (which equals
// sum_j P[t,j] dP[t,j]), each block of probabilities is rebuilt as P = exp(S - lse), and
// dP = dout V^T, dS = P (dP - D) give dV += P^T dout, dK += dS^T Q / sqrt(hs) and
// dQ += dS K / sqrt(hs). One task per (batch, head) walks the key blocks in order and, for each,
// the query blocks from the diagonal on: dK and dV of a key block are complete when its walk
// ends, and dQ of a query block sums its key blocks in increasing order, all in one task, so no
// sum depends on scheduling (the price: backward has B NH tasks, forward B NH ceil(T/64)).
//
// Block bounds depend only on T; a block's products are single BLAS calls and its row work
// (max, exponentials, the softmax backward) the element-wise row kernels (fp32: the vector
// paths, the same bits on every ISA) or plain loops (fp64). So results are bitwise independent
// of the thread count. Masked entries (key after query) are exact zeros in P and dS before the
// products, as in the materialised kernel: out at t never reads inputs at t' > t.
//
// Memory: a task's scratch is two [kQueryBlock, kKeyBlock] blocks (and backward's D, T values);
// nothing grows with T^2.
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>

#include <tbb/parallel_for.h>

#include "models/cpu/elementwise.hpp"
#include "models/cpu/gemm.hpp"
#include "models/cpu/kernel_common.hpp"
#include "models/cpu/kernels.hpp"

namespace zero::models::cpu {
namespace {

using namespace detail;

// Query rows per block, and key columns per block. Measured with bench/cpu_attention (forward +
// backward, hs = 64, T = 256, 1024, 2048; 2 threads on a loaded 2-core machine): 64 x 128 was
// the fastest or within the noise of it against 32x64, 64x64, 64x256, 128x128 and 128x256
// (64x64 lost up to 2x at T = 1024: too many small products). The key block is a multiple of
// the query block, so a query block never starts inside a key block: every row of a (query
// block, key block) pair that is computed has at least one unmasked key (a finite row max).
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;
static_assert(kKeyBlock % kQueryBlock == 0, "a key block must hold whole query blocks");

// The row operations, fp32 through the vectorised row kernels, fp64 in plain loops.
template <class F>
F max_of(const F* x, int64_t n) {
  if constexpr (std::same_as<F, float>) return elementwise::row_max(x, n);
  return row_max(x, n);
}
// out[j] = exp(x[j] - shift) (out may be x); returns their sum in F.
template <class F>
F exp_into(F* out, const F* x, F shift, int64_t n) {
  if constexpr (std::same_as<F, float>) return elementwise::exp_sum(out, x, shift, n);
  F sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    out[j] = exp_of(x[j] - shift);
    sum += out[j];
  }
  return sum;
}
// d *= s.
template <class F>
void scale_by(F* d, F s, int64_t n) {
  if constexpr (std::same_as<F, float>) return elementwise::scale(d, s, 1.0f, n);
  for (int64_t j = 0; j < n; ++j) d[j] *= s;
}
template <class F>
F dot_of(const F* a, const F* b, int64_t n) {
  if constexpr (std::same_as<F, float>) return elementwise::dot(a, b, n);
  F s = 0;
  for (int64_t j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}
// d = p (d - dt).
template <class F>
void softmax_back(F* d, const F* p, F dt, int64_t n) {
  if constexpr (std::same_as<F, float>) return elementwise::softmax_backward_row(d, p, dt, n);
  for (int64_t j = 0; j < n; ++j) d[j] = p[j] * (d[j] - dt);
}

// Unmasked keys of row t in the key block starting at j0 of width w (>= 1 by the static_assert).
inline int64_t visible(int64_t t, int64_t j0, int64_t w) { return std::min(t + 1 - j0, w); }

}  // namespace

template <ComputeType F>
void attention_forward_lse(F* out, F* lse, const F* qkv, int64_t B, int64_t T, int64_t C,
                           int64_t NH) {
  const int64_t hs = C / NH;
  const F scale = F(1) / std::sqrt(F(hs));
  const int64_t qblocks = (T + kQueryBlock - 1) / kQueryBlock;
  tbb::parallel_for(int64_t{0}, B * NH * qblocks, [&](int64_t task) {
    const int64_t bh = task / qblocks, b = bh / NH, h = bh % NH;
    const int64_t r0 = (task % qblocks) * kQueryBlock, r1 = std::min(T, r0 + kQueryBlock);
    const int64_t rows = r1 - r0;
    const F* q = qkv + b * T * 3 * C + h * hs;
    const F* k = q + C;
    const F* v = q + 2 * C;
    F* o = out + b * T * C + h * hs;
    const auto S = scratch<F>(kQueryBlock * kKeyBlock);
    F m[kQueryBlock], l[kQueryBlock];
    for (int64_t j0 = 0; j0 < r1; j0 += kKeyBlock) {
      const int64_t w = std::min(j0 + kKeyBlock, r1) - j0;
      gemm<F>(false, true, rows, w, hs, scale, q + r0 * 3 * C, 3 * C, k + j0 * 3 * C, 3 * C, F(0),
              S.get(), w);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r0 + r, n = visible(t, j0, w);
        F* s = S.get() + r * w;
        const F mb = max_of(s, n);
        if (j0 == 0) {
          m[r] = mb;
          l[r] = exp_into(s, s, mb, n);
        } else {
          // A larger max rescales what came before; exp(0) = 1 exactly when it does not move.
          const F mn = std::max(m[r], mb);
          const F alpha = exp_of(m[r] - mn);
          l[r] = l[r] * alpha + exp_into(s, s, mn, n);
          scale_by(o + t * C, alpha, hs);
          m[r] = mn;
        }
        std::fill(s + n, s + w, F(0));
      }
      // acc (+)= P V over this key block; the first block overwrites whatever out held.
      gemm<F>(false, false, rows, hs, w, F(1), S.get(), w, v + j0 * 3 * C, 3 * C,
              j0 == 0 ? F(0) : F(1), o + r0 * C, C);
    }
    F* L = lse + bh * T;
    for (int64_t r = 0; r < rows; ++r) {
      scale_by(o + (r0 + r) * C, F(1) / l[r], hs);
      L[r0 + r] = m[r] + std::log(l[r]);
    }
  });
}

template <ComputeType F>
void attention_backward_lse(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse,
                            int64_t B, int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const F scale = F(1) / std::sqrt(F(hs));
  tbb::parallel_for(int64_t{0}, B * NH, [&](int64_t bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const F* q = qkv + b * T * 3 * C + h * hs;
    const F* k = q + C;
    const F* v = q + 2 * C;
    F* dq = dqkv + b * T * 3 * C + h * hs;
    F* dk = dq + C;
    F* dv = dq + 2 * C;
    const F* dO = dout + b * T * C + h * hs;
    const F* O = out + b * T * C + h * hs;
    const F* L = lse + bh * T;
    const auto D = scratch<F>(T);
    for (int64_t t = 0; t < T; ++t) D[t] = dot_of(dO + t * C, O + t * C, hs);
    const auto P = scratch<F>(kQueryBlock * kKeyBlock);
    const auto dS = scratch<F>(kQueryBlock * kKeyBlock);
    for (int64_t j0 = 0; j0 < T; j0 += kKeyBlock) {
      const int64_t w = std::min(j0 + kKeyBlock, T) - j0;
      // Query blocks from the one starting at j0 (the diagonal) to the end.
      for (int64_t i0 = j0; i0 < T; i0 += kQueryBlock) {
        const int64_t rows = std::min(i0 + kQueryBlock, T) - i0;
        gemm<F>(false, true, rows, w, hs, scale, q + i0 * 3 * C, 3 * C, k + j0 * 3 * C, 3 * C,
                F(0), P.get(), w);                                                   // S
        gemm<F>(false, true, rows, w, hs, F(1), dO + i0 * C, C, v + j0 * 3 * C, 3 * C, F(0),
                dS.get(), w);                                                        // dP
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = i0 + r, n = visible(t, j0, w);
          F* p = P.get() + r * w;
          F* d = dS.get() + r * w;
          (void)exp_into(p, p, L[t], n);  // P = exp(S - lse)
          softmax_back(d, p, D[t], n);    // dS = P (dP - D)
          std::fill(p + n, p + w, F(0));
          std::fill(d + n, d + w, F(0));
        }
        const F first = i0 == j0 ? F(0) : F(1);  // the key block's first query block overwrites
        gemm<F>(true, false, w, hs, rows, F(1), P.get(), w, dO + i0 * C, C, first,
                dv + j0 * 3 * C, 3 * C);                                             // dV += P^T dO
        gemm<F>(true, false, w, hs, rows, scale, dS.get(), w, q + i0 * 3 * C, 3 * C, first,
                dk + j0 * 3 * C, 3 * C);                                             // dK += dS^T Q
        gemm<F>(false, false, rows, hs, w, scale, dS.get(), w, k + j0 * 3 * C, 3 * C,
                j0 == 0 ? F(0) : F(1), dq + i0 * 3 * C, 3 * C);                      // dQ += dS K
      }
    }
  });
}

#define ZERO_CPU_ATTENTION(F)                                                                  \
  template void attention_forward_lse<F>(F*, F*, const F*, int64_t, int64_t, int64_t, int64_t); \
  template void attention_backward_lse<F>(F*, const F*, const F*, const F*, const F*, int64_t,  \
                                          int64_t, int64_t, int64_t);

ZERO_CPU_ATTENTION(float)
ZERO_CPU_ATTENTION(double)
#undef ZERO_CPU_ATTENTION

}  // namespace zero::models::cpu
