// The blocked causal attention on 16-bit activations (kernels16.hpp; the fp32 / fp64 kernel and
// its algorithm are attention.cpp's, whose blocks, task split and order this file keeps).
//
// Storage: q, k, v blocks are multiplied in place from the S qkv (ld 3C) when oneDNN has the S
// product (fp32 accumulation), else widened to fp32 block by block for the BLAS. Scores,
// probabilities, their gradients and the output accumulator are fp32 scratch per task; P and dS
// are rounded to S for the products they feed (P V, P^T dO, dS^T Q, dS K), as FlashAttention-2
// does on GPUs. The forward's output accumulates in fp32 scratch (not in out, which is S) and is
// rounded once at the end; backward keeps dK, dV of the current key block and dQ of the whole
// (batch, head) in fp32 and rounds each once, when it is complete. 1/sqrt(hs) multiplies the
// fp32 scores (and the finished dK, dQ sums) instead of being a product's alpha.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>

#include <tbb/parallel_for.h>

#include "models/cpu/elementwise.hpp"
#include "models/cpu/kernel_common.hpp"
#include "models/cpu/kernels16.hpp"
#include "models/cpu/kernels16_common.hpp"

namespace zero::models::cpu::k16 {
namespace {

using detail::scratch;

// attention.cpp's blocks (its comment says why these sizes).
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;
static_assert(kKeyBlock % kQueryBlock == 0, "a key block must hold whole query blocks");

inline int64_t visible(int64_t t, int64_t j0, int64_t w) { return std::min(t + 1 - j0, w); }

}  // namespace

void attention_forward_lse(ScalarType s, void* out, float* lse, const void* qkv, int64_t B,
                           int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
  const ScalarType pt = product_type(s);
  const int64_t qblocks = (T + kQueryBlock - 1) / kQueryBlock;
  tbb::parallel_for(int64_t{0}, B * NH * qblocks, [&](int64_t task) {
    const int64_t bh = task / qblocks, b = bh / NH, h = bh % NH;
    const int64_t r0 = (task % qblocks) * kQueryBlock, r1 = std::min(T, r0 + kQueryBlock);
    const int64_t rows = r1 - r0;
    const int64_t q0 = b * T * 3 * C + h * hs;  // element offsets of q, k, v in qkv
    const int64_t k0 = q0 + C, v0 = q0 + 2 * C;
    std::unique_ptr<float[]> qbuf, kbuf, vbuf;
    std::unique_ptr<uint16_t[]> pbuf;
    const Operand qm = block(s, qkv, q0 + r0 * 3 * C, 3 * C, rows, hs, pt, qbuf);
    const auto S = scratch<float>(kQueryBlock * kKeyBlock);
    const auto acc = scratch<float>(kQueryBlock * hs);
    float m[kQueryBlock], l[kQueryBlock];
    for (int64_t j0 = 0; j0 < r1; j0 += kKeyBlock) {
      const int64_t w = std::min(j0 + kKeyBlock, r1) - j0;
      const Operand km = block(s, qkv, k0 + j0 * 3 * C, 3 * C, w, hs, pt, kbuf);
      const Operand vm = block(s, qkv, v0 + j0 * 3 * C, 3 * C, w, hs, pt, vbuf);
      product(false, true, rows, w, hs, qm, km, false, S.get(), w);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t t = r0 + r, n = visible(t, j0, w);
        float* sr = S.get() + r * w;
        elementwise::scale(sr, scale, 1.0f, n);
        const float mb = elementwise::row_max(sr, n);
        if (j0 == 0) {
          m[r] = mb;
          l[r] = elementwise::exp_sum(sr, sr, mb, n);
        } else {
          const float mn = std::max(m[r], mb);
          const float alpha = detail::exp_fast(m[r] - mn);
          l[r] = l[r] * alpha + elementwise::exp_sum(sr, sr, mn, n);
          elementwise::scale(acc.get() + r * hs, alpha, 1.0f, hs);
          m[r] = mn;
        }
        std::fill(sr + n, sr + w, 0.0f);
      }
      // acc (+)= P V, P rounded to the product type; the first key block overwrites.
      const Operand pm = rounded(S.get(), rows, w, w, pt, pbuf);
      product(false, false, rows, hs, w, pm, vm, j0 != 0, acc.get(), hs);
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* ar = acc.get() + r * hs;
      elementwise::scale(ar, 1.0f / l[r], 1.0f, hs);
      store(s, out, b * T * C + h * hs + (r0 + r) * C, ar, hs);
      lse[bh * T + r0 + r] = m[r] + std::log(l[r]);
    }
  });
}

void attention_backward_lse(ScalarType s, void* dqkv, const void* dout, const void* qkv,
                            const void* out, const float* lse, int64_t B, int64_t T, int64_t C,
                            int64_t NH) {
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
  const ScalarType pt = product_type(s);
  tbb::parallel_for(int64_t{0}, B * NH, [&](int64_t bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const int64_t q0 = b * T * 3 * C + h * hs;  // element offsets in qkv and dqkv
    const int64_t k0 = q0 + C, v0 = q0 + 2 * C;
    const int64_t o0 = b * T * C + h * hs;  // in out and dout
    const float* L = lse + bh * T;
    // D[t] = dout[t] . out[t], in fp32 on the widened rows.
    const auto D = scratch<float>(T);
    {
      const auto a = scratch<float>(hs);
      const auto c = scratch<float>(hs);
      for (int64_t t = 0; t < T; ++t) {
        load(s, dout, o0 + t * C, a.get(), hs);
        load(s, out, o0 + t * C, c.get(), hs);
        D[t] = elementwise::dot(a.get(), c.get(), hs);
      }
    }
    const auto P = scratch<float>(kQueryBlock * kKeyBlock);
    const auto dS = scratch<float>(kQueryBlock * kKeyBlock);
    const auto dK = scratch<float>(kKeyBlock * hs);
    const auto dV = scratch<float>(kKeyBlock * hs);
    const auto dQ = scratch<float>(T * hs);
    std::unique_ptr<float[]> qbuf, kbuf, vbuf, obuf;
    std::unique_ptr<uint16_t[]> pbuf, dsbuf;
    for (int64_t j0 = 0; j0 < T; j0 += kKeyBlock) {
      const int64_t w = std::min(j0 + kKeyBlock, T) - j0;
      const Operand km = block(s, qkv, k0 + j0 * 3 * C, 3 * C, w, hs, pt, kbuf);
      const Operand vm = block(s, qkv, v0 + j0 * 3 * C, 3 * C, w, hs, pt, vbuf);
      for (int64_t i0 = j0; i0 < T; i0 += kQueryBlock) {
        const int64_t rows = std::min(i0 + kQueryBlock, T) - i0;
        const Operand qm = block(s, qkv, q0 + i0 * 3 * C, 3 * C, rows, hs, pt, qbuf);
        const Operand dom = block(s, dout, o0 + i0 * C, C, rows, hs, pt, obuf);
        product(false, true, rows, w, hs, qm, km, false, P.get(), w);    // S
        product(false, true, rows, w, hs, dom, vm, false, dS.get(), w);  // dP
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t t = i0 + r, n = visible(t, j0, w);
          float* p = P.get() + r * w;
          float* d = dS.get() + r * w;
          elementwise::scale(p, scale, 1.0f, n);
          (void)elementwise::exp_sum(p, p, L[t], n);   // P = exp(S - lse)
          elementwise::softmax_backward_row(d, p, D[t], n);  // dS = P (dP - D)
          std::fill(p + n, p + w, 0.0f);
          std::fill(d + n, d + w, 0.0f);
        }
        const Operand pm = rounded(P.get(), rows, w, w, pt, pbuf);
        const Operand dsm = rounded(dS.get(), rows, w, w, pt, dsbuf);
        const bool first = i0 == j0;  // the key block's first query block overwrites
        product(true, false, w, hs, rows, pm, dom, !first, dV.get(), hs);   // dV += P^T dO
        product(true, false, w, hs, rows, dsm, qm, !first, dK.get(), hs);   // dK += dS^T Q
        product(false, false, rows, hs, w, dsm, km, j0 != 0, dQ.get() + i0 * hs, hs);  // dQ += dS K
      }
      // The key block's dK and dV are complete: scale dK, round both once.
      for (int64_t r = 0; r < w; ++r) {
        elementwise::scale(dK.get() + r * hs, scale, 1.0f, hs);
        store(s, dqkv, k0 + (j0 + r) * 3 * C, dK.get() + r * hs, hs);
        store(s, dqkv, v0 + (j0 + r) * 3 * C, dV.get() + r * hs, hs);
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      elementwise::scale(dQ.get() + t * hs, scale, 1.0f, hs);
      store(s, dqkv, q0 + t * 3 * C, dQ.get() + t * hs, hs);
    }
  });
}

}  // namespace zero::models::cpu::k16
