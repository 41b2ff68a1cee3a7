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
//
// On bf16 with AMX (amx.hpp) the products run on tiles instead of through oneDNN, on operands
// laid out once per (batch, head): K's pairs of channels transposed (the B of Q K^T) and V's
// pairs of rows interleaved (the B of P V); backward also V's transposed pairs (dO V^T), K's
// interleaved rows (dS K), and Q^T, dO^T whole (the A of the transposed gradients dK^T += Q^T dS
// and dV^T += dO^T P, whose B are P and dS rounded straight into pairs of rows; dK and dV are
// transposed back once per key block). Same blocks, same order, same roundings of P and dS:
// only the accumulation order inside a product differs from oneDNN's.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "models/cpu/amx.hpp"
#include "models/cpu/elementwise.hpp"
#include "models/cpu/kernel_common.hpp"
#include "models/cpu/kernels16.hpp"
#include "models/cpu/kernels16_common.hpp"
#include "models/cpu/pack16.hpp"

namespace zero::models::cpu::k16 {
namespace {

using detail::scratch;

// attention.cpp's blocks (its comment says why these sizes).
constexpr int64_t kQueryBlock = 64;
constexpr int64_t kKeyBlock = 128;
static_assert(kKeyBlock % kQueryBlock == 0, "a key block must hold whole query blocks");

inline int64_t visible(int64_t t, int64_t j0, int64_t w) { return std::min(t + 1 - j0, w); }

// Whether the tile path takes an attention: bf16, AMX, and whole tiles (a head's channels and
// the sequence in multiples of 32: every block then is; other shapes take the oneDNN path).
bool tiles(ScalarType s, int64_t T, int64_t hs) {
  return s == ScalarType::bf16 && amx::available() && hs % 32 == 0 && T % 32 == 0;
}

// The tile path's scratch: one buffer per thread, kept between calls and cut into 64-byte
// aligned pieces. Fresh buffers on every call cost page faults and the allocator's trims (6% of
// the kernels' time in perf on the AMX VM). A task takes no other task while it holds the
// buffer (nothing inside it waits on oneTBB), so a thread has one user at a time. Bounded by
// the largest call: the backward's 9 T x hs / 2 words plus a few blocks (~1.4 MiB per thread
// at T 1024, hs 64).
class Arena {
 public:
  explicit Arena(int64_t bytes) {
    thread_local std::unique_ptr<char[]> buffer;
    thread_local int64_t size = 0;
    if (size < bytes + 64) {
      buffer.reset();
      buffer = std::make_unique_for_overwrite<char[]>(static_cast<size_t>(bytes + 64));
      size = bytes + 64;
    }
    next_ = buffer.get() + (64 - reinterpret_cast<uintptr_t>(buffer.get()) % 64) % 64;
  }
  template <class T>
  T* take(int64_t n) {
    T* p = reinterpret_cast<T*>(next_);
    next_ += round64(n * int64_t{sizeof(T)});
    return p;
  }
  static int64_t round64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

 private:
  char* next_;
};

// Row t of the forward's online softmax on key block j0 (w keys): the row of S becomes
// exp(S * scale - m) (zero past the causal edge), m, l and the row of acc rescaled as the
// running maximum moves.
void online_softmax_row(float* sr, int64_t t, int64_t j0, int64_t w, float scale, float& m,
                        float& l, float* acc, int64_t hs) {
  const int64_t n = visible(t, j0, w);
  elementwise::scale(sr, scale, 1.0f, n);
  const float mb = elementwise::row_max(sr, n);
  if (j0 == 0) {
    m = mb;
    l = elementwise::exp_sum(sr, sr, mb, n);
  } else {
    const float mn = std::max(m, mb);
    const float alpha = detail::exp_fast(m - mn);
    l = l * alpha + elementwise::exp_sum(sr, sr, mn, n);
    elementwise::scale(acc, alpha, 1.0f, hs);
    m = mn;
  }
  std::fill(sr + n, sr + w, 0.0f);
}

// The backward's row t on key block j0: P = exp(S * scale - lse) and dS = P (dP - D) in place
// of the rows of S and dP, both zero past the causal edge.
void softmax_grad_row(float* p, float* d, int64_t t, int64_t j0, int64_t w, float scale,
                      float lse, float D) {
  const int64_t n = visible(t, j0, w);
  elementwise::scale(p, scale, 1.0f, n);
  (void)elementwise::exp_sum(p, p, lse, n);    // P = exp(S - lse)
  elementwise::softmax_backward_row(d, p, D, n);  // dS = P (dP - D)
  std::fill(p + n, p + w, 0.0f);
  std::fill(d + n, d + w, 0.0f);
}

// The backward's D[t] = dout[t] . out[t] for the T rows of one head (hs channels from element
// o0, C between rows), in fp32 on the widened rows; both paths use it.
std::unique_ptr<float[]> row_dots(ScalarType s, const void* dout, const void* out, int64_t o0,
                                  int64_t C, int64_t T, int64_t hs) {
  auto D = scratch<float>(T);
  const auto a = scratch<float>(hs);
  const auto c = scratch<float>(hs);
  for (int64_t t = 0; t < T; ++t) {
    load(s, dout, o0 + t * C, a.get(), hs);
    load(s, out, o0 + t * C, c.get(), hs);
    D[t] = elementwise::dot(a.get(), c.get(), hs);
  }
  return D;
}

void forward_tiles(void* out, float* lse, const void* qkv_in, int64_t B, int64_t T, int64_t C,
                   int64_t NH) {
  const auto* qkv = static_cast<const uint16_t*>(qkv_in);
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
  const int64_t qblocks = (T + kQueryBlock - 1) / kQueryBlock;
  // One task per (batch, head), packing its keys and values once for all its query blocks;
  // per query block (each packing the keys it sees) only when the heads are too few to keep
  // the threads busy. Either way every block computes the same bits.
  const int64_t per =
      B * NH >= 2 * int64_t{tbb::this_task_arena::max_concurrency()} ? qblocks : 1;
  const int64_t groups = (qblocks + per - 1) / per;
  tbb::parallel_for(int64_t{0}, B * NH * groups, [&](int64_t task) {
    const int64_t bh = task / groups, b = bh / NH, h = bh % NH;
    const int64_t qb0 = (task % groups) * per, qb1 = std::min(qblocks, qb0 + per);
    const int64_t keys = std::min(T, qb1 * kQueryBlock);  // the keys these blocks see
    const int64_t q0 = b * T * 3 * C + h * hs;           // element offsets of q, k, v in qkv
    const int64_t k0 = q0 + C, v0 = q0 + 2 * C;
    // Kt: per key block j0 (w keys) at Kt + j0 * hs / 2, word (p, j) at p * w + j holding
    // channels 2p, 2p + 1 of key j0 + j; Vz[(j / 2) * hs + c]: rows j, j + 1 of value channel
    // c; Qd the query block's rows, dense. Tile rows of an operand then lie at most 512 bytes
    // apart (ld 3C in place put them 3-4.5 KiB apart, on a few of L1's sets).
    const int64_t words = hs / 2 * keys, block = kQueryBlock * kKeyBlock;
    Arena arena(2 * Arena::round64(words * 4) + Arena::round64(block * 4) +
                Arena::round64(block * 2) + 2 * Arena::round64(kQueryBlock * hs * 4));
    uint32_t* Kt = arena.take<uint32_t>(words);
    uint32_t* Vz = arena.take<uint32_t>(words);
    float* S = arena.take<float>(block);
    uint16_t* P = arena.take<uint16_t>(block);
    float* acc = arena.take<float>(kQueryBlock * hs);
    uint16_t* Qd = arena.take<uint16_t>(kQueryBlock * hs);
    for (int64_t j0 = 0; j0 < keys; j0 += kKeyBlock) {
      const int64_t w = std::min(j0 + kKeyBlock, keys) - j0;
      pack16::transpose32(w, hs / 2, qkv + k0 + j0 * 3 * C, 3 * C / 2, Kt + j0 * hs / 2, w);
    }
    pack16::zip_rows(keys, hs, qkv + v0, 3 * C, Vz, hs);
    float m[kQueryBlock], l[kQueryBlock];
    for (int64_t qb = qb0; qb < qb1; ++qb) {
      const int64_t r0 = qb * kQueryBlock, r1 = std::min(T, r0 + kQueryBlock), rows = r1 - r0;
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(Qd + r * hs, qkv + q0 + (r0 + r) * 3 * C, static_cast<size_t>(hs) * 2);
      for (int64_t j0 = 0; j0 < r1; j0 += kKeyBlock) {
        // The key block's w: whole blocks except the sequence's last (blocks end where the
        // packing's did: keys >= r1, and r1 < keys only at a multiple of kKeyBlock).
        const int64_t w = std::min(j0 + kKeyBlock, r1) - j0;
        amx::product(rows, w, hs, Qd, hs, Kt + j0 * hs / 2, std::min(j0 + kKeyBlock, keys) - j0,
                     S, w, false);
        for (int64_t r = 0; r < rows; ++r) {  // each row rounded while it is in L1
          online_softmax_row(S + r * w, r0 + r, j0, w, scale, m[r], l[r], acc + r * hs, hs);
          amx::round_rows(S + r * w, w, 1, w, P + r * w, w);
        }
        amx::product(rows, hs, w, P, w, Vz + j0 / 2 * hs, hs, acc, hs, j0 != 0);
      }
      for (int64_t r = 0; r < rows; ++r) {
        elementwise::scale(acc + r * hs, 1.0f / l[r], 1.0f, hs);
        lse[bh * T + r0 + r] = m[r] + std::log(l[r]);
      }
      amx::round_rows(acc, hs, rows, hs, static_cast<uint16_t*>(out) + b * T * C + h * hs + r0 * C,
                      C);
    }
  });
}

void backward_tiles(void* dqkv, const void* dout_in, const void* qkv_in, const void* out,
                    const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH) {
  const auto* qkv = static_cast<const uint16_t*>(qkv_in);
  const auto* dout = static_cast<const uint16_t*>(dout_in);
  const ScalarType s = ScalarType::bf16;
  const int64_t hs = C / NH;
  const float scale = 1.0f / std::sqrt(float(hs));
  tbb::parallel_for(int64_t{0}, B * NH, [&](int64_t bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const int64_t q0 = b * T * 3 * C + h * hs;  // element offsets in qkv and dqkv
    const int64_t k0 = q0 + C, v0 = q0 + 2 * C;
    const int64_t o0 = b * T * C + h * hs;  // in out and dout
    const float* L = lse + bh * T;
    const auto D = row_dots(s, dout, out, o0, C, T, hs);
    // The (batch, head)'s operands in tile layouts (see the file comment), each tile's rows at
    // most 512 bytes apart: Kt, Vt (the B of Q K^T, dO V^T) per key block j0 (w keys) at
    // j0 * hs / 2, words (p, j) at p * w + j; Kz (the B of dS K) rows j, j + 1 of K interleaved,
    // hs words a pair; Qd, dOd Q's and dO's rows, dense (the A of Q K^T, dO V^T); Qt, dOt (the
    // A of Q^T dS, dO^T P) per query block i0 (rows queries) at i0 * hs, [hs, rows] dense.
    const int64_t words = hs / 2 * T, block = kQueryBlock * kKeyBlock;
    const int64_t kv = kKeyBlock * hs;
    Arena arena(7 * Arena::round64(words * 4) + 2 * Arena::round64(block * 4) +
                3 * Arena::round64(block * 2) + 3 * Arena::round64(kv * 4) +
                Arena::round64(T * hs * 4));
    uint32_t* Kt = arena.take<uint32_t>(words);
    uint32_t* Vt = arena.take<uint32_t>(words);
    uint32_t* Kz = arena.take<uint32_t>(words);
    uint16_t* Qd = arena.take<uint16_t>(T * hs);
    uint16_t* dOd = arena.take<uint16_t>(T * hs);
    uint16_t* Qt = arena.take<uint16_t>(hs * T);
    uint16_t* dOt = arena.take<uint16_t>(hs * T);
    float* P = arena.take<float>(block);
    float* dS = arena.take<float>(block);
    uint32_t* Pz = arena.take<uint32_t>(block / 2);
    uint32_t* dSz = arena.take<uint32_t>(block / 2);
    uint16_t* dS16 = arena.take<uint16_t>(block);
    float* dKt = arena.take<float>(kv);  // dK^T, dV^T of the key block
    float* dVt = arena.take<float>(kv);
    float* dKV = arena.take<float>(kv);  // one of them transposed back
    float* dQ = arena.take<float>(T * hs);
    for (int64_t j0 = 0; j0 < T; j0 += kKeyBlock) {
      const int64_t w = std::min(j0 + kKeyBlock, T) - j0;
      pack16::transpose32(w, hs / 2, qkv + k0 + j0 * 3 * C, 3 * C / 2, Kt + j0 * hs / 2, w);
      pack16::transpose32(w, hs / 2, qkv + v0 + j0 * 3 * C, 3 * C / 2, Vt + j0 * hs / 2, w);
    }
    pack16::zip_rows(T, hs, qkv + k0, 3 * C, Kz, hs);
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(Qd + t * hs, qkv + q0 + t * 3 * C, static_cast<size_t>(hs) * 2);
      std::memcpy(dOd + t * hs, dout + o0 + t * C, static_cast<size_t>(hs) * 2);
    }
    for (int64_t i0 = 0; i0 < T; i0 += kQueryBlock) {
      const int64_t rows = std::min(i0 + kQueryBlock, T) - i0;
      pack16::transpose(rows, hs, Qd + i0 * hs, hs, Qt + i0 * hs);
      pack16::transpose(rows, hs, dOd + i0 * hs, hs, dOt + i0 * hs);
    }
    auto* dst = static_cast<uint16_t*>(dqkv);
    for (int64_t j0 = 0; j0 < T; j0 += kKeyBlock) {
      const int64_t w = std::min(j0 + kKeyBlock, T) - j0;
      for (int64_t i0 = j0; i0 < T; i0 += kQueryBlock) {
        const int64_t rows = std::min(i0 + kQueryBlock, T) - i0;
        const uint32_t* kt = Kt + j0 * hs / 2;
        const uint32_t* vt = Vt + j0 * hs / 2;
        amx::product(rows, w, hs, Qd + i0 * hs, hs, kt, w, P, w, false);   // S
        amx::product(rows, w, hs, dOd + i0 * hs, hs, vt, w, dS, w, false);  // dP
        for (int64_t r = 0; r < rows; r += 2) {  // pairs of rows rounded while in L1
          for (int64_t e = r; e < r + 2; ++e)
            softmax_grad_row(P + e * w, dS + e * w, i0 + e, j0, w, scale, L[i0 + e], D[i0 + e]);
          amx::round_pairs(P + r * w, w, 2, w, Pz + r / 2 * w, w);
          amx::round_pairs(dS + r * w, w, 2, w, dSz + r / 2 * w, w);
          amx::round_rows(dS + r * w, w, 2, w, dS16 + r * w, w);
        }
        const bool first = i0 == j0;  // the key block's first query block overwrites
        amx::product(hs, w, rows, dOt + i0 * hs, rows, Pz, w, dVt, w, !first);  // dV^T += dO^T P
        amx::product(hs, w, rows, Qt + i0 * hs, rows, dSz, w, dKt, w, !first);  // dK^T += Q^T dS
        amx::product(rows, hs, w, dS16, w, Kz + j0 / 2 * hs, hs, dQ + i0 * hs, hs,
                     j0 != 0);  // dQ += dS K
      }
      // The key block's dK and dV are complete: transpose back, scale dK, round both once.
      pack16::transpose32(hs, w, dKt, w, dKV, hs);
      elementwise::scale(dKV, scale, 1.0f, w * hs);
      amx::round_rows(dKV, hs, w, hs, dst + k0 + j0 * 3 * C, 3 * C);
      pack16::transpose32(hs, w, dVt, w, dKV, hs);
      amx::round_rows(dKV, hs, w, hs, dst + v0 + j0 * 3 * C, 3 * C);
    }
    elementwise::scale(dQ, scale, 1.0f, T * hs);
    amx::round_rows(dQ, hs, T, hs, dst + q0, 3 * C);
  });
}

}  // namespace

void attention_forward_lse(ScalarType s, void* out, float* lse, const void* qkv, int64_t B,
                           int64_t T, int64_t C, int64_t NH) {
  const int64_t hs = C / NH;
  if (tiles(s, T, hs)) return forward_tiles(out, lse, qkv, B, T, C, NH);
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
      for (int64_t r = 0; r < rows; ++r)
        online_softmax_row(S.get() + r * w, r0 + r, j0, w, scale, m[r], l[r], acc.get() + r * hs,
                           hs);
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
  if (tiles(s, T, hs)) return backward_tiles(dqkv, dout, qkv, out, lse, B, T, C, NH);
  const float scale = 1.0f / std::sqrt(float(hs));
  const ScalarType pt = product_type(s);
  tbb::parallel_for(int64_t{0}, B * NH, [&](int64_t bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const int64_t q0 = b * T * 3 * C + h * hs;  // element offsets in qkv and dqkv
    const int64_t k0 = q0 + C, v0 = q0 + 2 * C;
    const int64_t o0 = b * T * C + h * hs;  // in out and dout
    const float* L = lse + bh * T;
    const auto D = row_dots(s, dout, out, o0, C, T, hs);
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
        for (int64_t r = 0; r < rows; ++r)
          softmax_grad_row(P.get() + r * w, dS.get() + r * w, i0 + r, j0, w, scale, L[i0 + r],
                           D[i0 + r]);
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
