// The cpu kernels on 16-bit activations (contract in kernels16.hpp), attention apart
// (attention16.cpp).
//
// Every kernel is the fp32 kernel of kernels.cpp / vocab_kernels.cpp on blocks widened into
// per-task scratch: the same fixed blocks (so the same determinism argument), the same row code
// of elementwise.hpp, and one rounding to S per stored element. Products of S operands go to
// oneDNN as stored (kernels16_common.hpp).
#include "models/cpu/kernels16.hpp"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "models/cpu/elementwise.hpp"
#include "models/cpu/kernel_common.hpp"
#include "models/cpu/kernels16_common.hpp"

namespace zero::models::cpu::k16 {
namespace {

using detail::check_ids;
using detail::for_blocks;
using detail::kRowBlock;
using detail::scratch;

// The block sizes of kernels.cpp, for the same reasons (its comments): rows per product (and, for
// 16-bit products, columns per weight slice: rows_times_weight), the
// weight-gradient tile, rows per partial of a parameter-gradient sum and columns per task when
// the partials are added, elements per element-wise task.
constexpr int64_t kGemmRows = 128;
constexpr int64_t kGemmCols = 1024;
constexpr int64_t kTile = 256;
constexpr int64_t kSumRows = 64;
constexpr int64_t kSumCols = 256;
constexpr int64_t kElemBlock = 16384;

// out[0, width) = the sum of `blocks` partials of `width` (partial + blk * width), in block
// order, column blocks in parallel.
void add_partials(const std::vector<float>& partial, int64_t blocks, int64_t width, float* out) {
  for_blocks(width, kSumCols, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      float sum = 0.0f;
      for (int64_t blk = 0; blk < blocks; ++blk) sum += partial[static_cast<size_t>(blk * width + j)];
      out[j] = sum;
    }
  });
}

// y[N,n] (S) = x[N,K] (S) @ op(w) (+ bias), w stored [K,n] (wt false) or [n,K] (wt true). Each
// block of kGemmRows rows: one product into fp32 scratch that starts as the bias, rounded once.
// S products when the weight is stored as S and oneDNN has the kernel; else fp32 on the widened
// x block and the weight read as fp32.
//
// S products are also cut into slices of kGemmCols columns, each slice's weight packed once for
// all its row blocks (PackedWeight); tasks go slice by slice, so a thread's consecutive blocks
// reuse the slice's packed weight from its cache (a whole GPT-2 head, 77 MB, was streamed from
// memory for every row block) and the fp32 tile stays in cache until it is rounded.
void rows_times_weight(ScalarType s, void* y, const void* x, int64_t N, int64_t K, int64_t n,
                       const Param<float>& w, bool wt, const float* bias) {
  const ScalarType pt = w.type() == s ? product_type(s) : ScalarType::f32;
  const int64_t ldw = wt ? K : n;
  if (pt == s) {
    const int64_t slices = (n + kGemmCols - 1) / kGemmCols;
    const int64_t blocks = (N + kGemmRows - 1) / kGemmRows;
    auto slice_of = [&](int64_t j) {
      const int64_t j0 = j * kGemmCols;
      return MatrixRef{at16(w.data(), wt ? j0 * K : j0), s, ldw, wt};
    };
    // Packed when several row blocks share a slice.
    std::vector<std::unique_ptr<PackedWeight>> packed(static_cast<size_t>(slices));
    if (blocks > 1)
      tbb::parallel_for(int64_t{0}, slices, [&](int64_t j) {
        const int64_t nj = std::min(kGemmCols, n - j * kGemmCols);
        packed[static_cast<size_t>(j)] =
            std::make_unique<PackedWeight>(kGemmRows, nj, K, slice_of(j), bias != nullptr);
      });
    tbb::parallel_for(int64_t{0}, slices * blocks, [&](int64_t t) {
      const int64_t j = t / blocks, r0 = (t % blocks) * kGemmRows;
      const int64_t j0 = j * kGemmCols, nj = std::min(kGemmCols, n - j0);
      const int64_t rows = std::min(kGemmRows, N - r0);
      const auto yb = scratch<float>(rows * nj);
      if (bias)
        for (int64_t r = 0; r < rows; ++r) std::copy_n(bias + j0, nj, yb.get() + r * nj);
      const MatrixRef xm{at16(x, r0 * K), s, K};
      if (packed[static_cast<size_t>(j)])
        packed[static_cast<size_t>(j)]->multiply(rows, xm, yb.get(), nj);
      else
        matmul(rows, nj, K, xm, slice_of(j), yb.get(), nj, bias != nullptr);
      store_rows(s, y, r0 * n + j0, n, rows, nj, yb.get());
    });
    return;
  }
  std::unique_ptr<float[]> wbuf;
  const Operand wm{w.dense(K * n, wbuf), ScalarType::f32, ldw};
  for_blocks(N, kGemmRows, [&](int64_t r0, int64_t r1) {
    const int64_t rows = r1 - r0;
    const auto yb = scratch<float>(rows * n);
    if (bias)
      for (int64_t r = 0; r < rows; ++r) std::copy_n(bias, n, yb.get() + r * n);
    std::unique_ptr<float[]> xbuf;
    const Operand xm = block(s, x, r0 * K, K, rows, K, pt, xbuf);
    product(false, wt, rows, n, K, xm, wm, bias != nullptr, yb.get(), n);
    store(s, y, r0 * n, yb.get(), rows * n);
  });
}

// g[M,Nc] += A^T B with A [K,M] and B [K,Nc] stored as S (lda, ldb): one product per fixed
// output tile into fp32 scratch (fp32 accumulation: a gradient's sum stays fp32), then one
// rounded add per element.
//
// With S products (bf16 on AVX-512), B's tile columns are first packed (PackedWeight: Nc x K
// elements in all, once for every row of tiles) and each row of tiles copies its columns of A
// transposed (kTile x K, 1 MiB at K = 2048); the tiles multiply those. oneDNN's AMX and
// AVX512-BF16 "brgemm" kernels take only a dense, row-major left operand and a dense right one;
// with A read transposed or B a strided column block oneDNN falls back to a generic kernel at
// under half their rate (measured 282 GFLOP/s per core on AMX). The copies are exact, so the
// products are the same sums either way; the tiles' bounds are unchanged. Without S products
// the tile's columns are widened to fp32 for the BLAS.
void add_at_b(ScalarType s, const Grad<float>& g, int64_t M, int64_t Nc, int64_t K, const void* A,
              int64_t lda, const void* B, int64_t ldb) {
  const ScalarType pt = product_type(s);
  const int64_t tm = (M + kTile - 1) / kTile, tn = (Nc + kTile - 1) / kTile;
  if (pt == s) {
    // B's columns of each tile packed once for every row of tiles (PackedWeight).
    std::vector<std::unique_ptr<PackedWeight>> bp(static_cast<size_t>(tn));
    tbb::parallel_for(int64_t{0}, tn, [&](int64_t tj) {
      const int64_t j0 = tj * kTile, nj = std::min(kTile, Nc - j0);
      bp[static_cast<size_t>(tj)] =
          std::make_unique<PackedWeight>(kTile, nj, K, MatrixRef{at16(B, j0), s, ldb}, false);
    });
    tbb::parallel_for(int64_t{0}, tm, [&](int64_t ti) {
      const int64_t i0 = ti * kTile, mi = std::min(kTile, M - i0);
      const auto at = scratch<uint16_t>(mi * K);
      transpose(K, mi, s, at16(A, i0), lda, at.get());
      tbb::parallel_for(int64_t{0}, tn, [&](int64_t tj) {
        const int64_t j0 = tj * kTile, nj = std::min(kTile, Nc - j0);
        const auto buf = scratch<float>(mi * nj);
        bp[static_cast<size_t>(tj)]->multiply(mi, MatrixRef{at.get(), s, K}, buf.get(), nj);
        for (int64_t r = 0; r < mi; ++r) g.add((i0 + r) * Nc + j0, buf.get() + r * nj, nj);
      });
    });
    return;
  }
  tbb::parallel_for(int64_t{0}, tm * tn, [&](int64_t tile) {
    const int64_t i0 = (tile / tn) * kTile, j0 = (tile % tn) * kTile;
    const int64_t mi = std::min(kTile, M - i0), nj = std::min(kTile, Nc - j0);
    const auto buf = scratch<float>(mi * nj);
    std::unique_ptr<float[]> abuf, bbuf;
    const Operand am = block(s, A, i0, lda, K, mi, pt, abuf);
    const Operand bm = block(s, B, j0, ldb, K, nj, pt, bbuf);
    product(true, false, mi, nj, K, am, bm, false, buf.get(), nj);
    for (int64_t r = 0; r < mi; ++r) g.add((i0 + r) * Nc + j0, buf.get() + r * nj, nj);
  });
}

// out[0, n) = column sums of the [N, n] S matrix m, in kernels.cpp's sum_rows order.
void column_sums(ScalarType s, const void* m, int64_t N, int64_t n, float* out) {
  const int64_t blocks = (N + kSumRows - 1) / kSumRows;
  std::vector<float> partial(static_cast<size_t>(blocks * n), 0.0f);
  for_blocks(N, kSumRows, [&](int64_t r0, int64_t r1) {
    float* acc = partial.data() + (r0 / kSumRows) * n;
    const auto row = scratch<float>(n);
    for (int64_t r = r0; r < r1; ++r) {
      load(s, m, r * n, row.get(), n);
      for (int64_t j = 0; j < n; ++j) acc[j] += row[j];
    }
  });
  add_partials(partial, blocks, n, out);
}

}  // namespace

// ---- embedding ---------------------------------------------------------------------------------

void embedding_forward(ScalarType s, void* out, const int32_t* tokens, Param<float> wte,
                       Param<float> wpe, bool has_wpe, int64_t B, int64_t T, int64_t C,
                       int64_t v0, int64_t Vs, int64_t V, const char* op) {
  check_ids(op, "token id", tokens, B, T, V, false);
  for_blocks(B * T, kRowBlock, [&](int64_t r0, int64_t r1) {
    const auto o = scratch<float>(C);
    const auto pos = scratch<float>(C);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t local = int64_t{tokens[r]} - v0;
      if (local >= 0 && local < Vs)
        wte.load(local * C, o.get(), C);
      else
        std::fill_n(o.get(), C, 0.0f);  // another rank's token: this rank's part is 0
      if (has_wpe) {
        wpe.load((r % T) * C, pos.get(), C);
        for (int64_t c = 0; c < C; ++c) o[c] += pos[c];
      }
      store(s, out, r * C, o.get(), C);
    }
  });
}

void embedding_backward(ScalarType s, Grad<float> dwte, Grad<float> dwpe, bool has_wpe,
                        const void* dout, const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                        int64_t v0, int64_t Vs, int64_t V, const char* op) {
  check_ids(op, "token id", tokens, B, T, V, false);
  // As kernels.cpp: the shard's positions grouped by token ((b,t) order within a group), one
  // summed contribution per touched row of dwte.
  const detail::TokenGroups tg = detail::group_by_token(tokens, B * T, v0, Vs);
  const std::vector<int64_t>& order = tg.order;
  const std::vector<int64_t>& starts = tg.starts;
  for_blocks(tg.groups(), kRowBlock, [&](int64_t g0, int64_t g1) {
    const auto acc = scratch<float>(C);
    const auto d = scratch<float>(C);
    for (int64_t g = g0; g < g1; ++g) {
      std::fill_n(acc.get(), C, 0.0f);
      for (int64_t i = starts[g]; i < starts[g + 1]; ++i) {
        load(s, dout, order[i] * C, d.get(), C);
        for (int64_t c = 0; c < C; ++c) acc[c] += d[c];
      }
      dwte.add((int64_t{tokens[order[starts[g]]]} - v0) * C, acc.get(), C);
    }
  });
  if (!has_wpe) return;
  for_blocks(T, kRowBlock, [&](int64_t t0, int64_t t1) {
    const auto acc = scratch<float>(C);
    const auto d = scratch<float>(C);
    for (int64_t t = t0; t < t1; ++t) {
      std::fill_n(acc.get(), C, 0.0f);
      for (int64_t b = 0; b < B; ++b) {
        load(s, dout, (b * T + t) * C, d.get(), C);
        for (int64_t c = 0; c < C; ++c) acc[c] += d[c];
      }
      dwpe.add(t * C, acc.get(), C);
    }
  });
}

// ---- layernorm ---------------------------------------------------------------------------------

void layernorm_forward(ScalarType s, void* y, float* mean, float* rstd, const void* x,
                       Param<float> w, Param<float> b, int64_t N, int64_t C) {
  std::unique_ptr<float[]> wbuf, bbuf;
  const float* wd = w.dense(C, wbuf);
  const float* bd = b.dense(C, bbuf);
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    const int64_t n = (r1 - r0) * C;
    const auto xb = scratch<float>(n);
    load(s, x, r0 * C, xb.get(), n);
    elementwise::layernorm_forward(xb.get(), mean + r0, rstd + r0, xb.get(), wd, bd, r1 - r0, C);
    store(s, y, r0 * C, xb.get(), n);
  });
}

void layernorm_backward(ScalarType s, void* dx, Grad<float> dw, Grad<float> db, const void* dy,
                        const void* x, Param<float> w, const float* mean, const float* rstd,
                        int64_t N, int64_t C) {
  std::unique_ptr<float[]> wbuf;
  const float* wd = w.dense(C, wbuf);
  // Blocks of kSumRows rows, as the fp32 kernel's partials: each block's dw, db terms (its
  // rows summed in order by the row kernel) go to its own partial, added in block order.
  const int64_t blocks = (N + kSumRows - 1) / kSumRows;
  std::vector<float> partial(static_cast<size_t>(blocks * 2 * C));
  for_blocks(N, kSumRows, [&](int64_t r0, int64_t r1) {
    const int64_t n = (r1 - r0) * C;
    const auto dyb = scratch<float>(n);
    const auto xb = scratch<float>(n);
    const auto dxb = scratch<float>(n);
    load(s, dy, r0 * C, dyb.get(), n);
    load(s, x, r0 * C, xb.get(), n);
    float* acc = partial.data() + (r0 / kSumRows) * 2 * C;
    elementwise::layernorm_backward(dxb.get(), acc, acc + C, dyb.get(), xb.get(), wd, mean + r0,
                                    rstd + r0, r1 - r0, C);
    store(s, dx, r0 * C, dxb.get(), n);
  });
  const auto sums = scratch<float>(2 * C);  // [0, C): dw's contribution, [C, 2C): db's
  add_partials(partial, blocks, 2 * C, sums.get());
  dw.add(0, sums.get(), C);
  db.add(0, sums.get() + C, C);
}

// ---- linear layers -----------------------------------------------------------------------------

void linear_forward(ScalarType s, void* y, const void* x, Param<float> w, Param<float> b,
                    bool has_bias, int64_t N, int64_t C, int64_t OC) {
  std::unique_ptr<float[]> bbuf;
  const float* bd = has_bias ? b.dense(OC, bbuf) : nullptr;
  rows_times_weight(s, y, x, N, C, OC, w, false, bd);
}

void linear_backward_input(ScalarType s, void* dx, const void* dy, Param<float> w, int64_t N,
                           int64_t C, int64_t OC) {
  rows_times_weight(s, dx, dy, N, OC, C, w, true, nullptr);  // w [C,OC] read transposed
}

void linear_backward_weight(ScalarType s, Grad<float> dw, Grad<float> db, bool has_bias,
                            const void* dy, const void* x, int64_t N, int64_t C, int64_t OC) {
  add_at_b(s, dw, C, OC, N, x, C, dy, OC);
  if (!has_bias) return;
  const auto sums = scratch<float>(OC);
  column_sums(s, dy, N, OC, sums.get());
  db.add(0, sums.get(), OC);
}

void linear_t_forward(ScalarType s, void* y, const void* x, Param<float> w, int64_t N, int64_t C,
                      int64_t V) {
  rows_times_weight(s, y, x, N, C, V, w, true, nullptr);  // w [V,C] read transposed
}

void linear_t_backward_input(ScalarType s, void* dx, const void* dy, Param<float> w, int64_t N,
                             int64_t C, int64_t V) {
  rows_times_weight(s, dx, dy, N, V, C, w, false, nullptr);
}

void linear_t_backward_weight(ScalarType s, Grad<float> dw, const void* dy, const void* x,
                              int64_t N, int64_t C, int64_t V) {
  add_at_b(s, dw, V, C, N, dy, V, x, C);
}

// ---- element-wise ------------------------------------------------------------------------------
// Blocks of kElemBlock elements widened into scratch, the fp32 kernel on the block (one block:
// it runs inline), rounded once on store. Every block is read before it is written, so an output
// may be one of the inputs.

void gelu_forward(ScalarType s, void* y, const void* x, int64_t n) {
  for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
    const auto xb = scratch<float>(i1 - i0);
    load(s, x, i0, xb.get(), i1 - i0);
    elementwise::gelu_forward(xb.get(), xb.get(), i1 - i0);
    store(s, y, i0, xb.get(), i1 - i0);
  });
}

namespace {
// out = f(a, b) on blocks: both inputs widened, the fp32 kernel f(out, a, b, count) writing into
// a's scratch, one rounding on store.
template <class F>
void binary_blocks(ScalarType s, void* out, const void* a, const void* b, int64_t n, F f) {
  for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
    const auto ab = scratch<float>(i1 - i0);
    const auto bb = scratch<float>(i1 - i0);
    load(s, a, i0, ab.get(), i1 - i0);
    load(s, b, i0, bb.get(), i1 - i0);
    f(ab.get(), ab.get(), bb.get(), i1 - i0);
    store(s, out, i0, ab.get(), i1 - i0);
  });
}
}  // namespace

void gelu_backward(ScalarType s, void* dx, const void* dy, const void* x, int64_t n) {
  binary_blocks(s, dx, dy, x, n, [](float* o, const float* g, const float* xv, int64_t m) {
    elementwise::gelu_backward(o, g, xv, m);
  });
}

void add(ScalarType s, void* out, const void* a, const void* b, int64_t n) {
  binary_blocks(s, out, a, b, n, [](float* o, const float* x, const float* y, int64_t m) {
    elementwise::add(o, x, y, m);
  });
}

void accumulate(ScalarType s, Grad<float> acc, const void* x, int64_t n) {
  for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
    const auto xb = scratch<float>(i1 - i0);
    load(s, x, i0, xb.get(), i1 - i0);
    acc.add(i0, xb.get(), i1 - i0);
  });
}

// ---- cross-entropy -----------------------------------------------------------------------------
// Row by row, each row widened once into scratch (a vocabulary row of 8192 is 32 KiB), then the
// fp32 kernel's row code.

float cross_entropy_forward(ScalarType s, float* losses, const void* logits,
                            const int32_t* targets, int64_t N, int64_t V) {
  check_ids("cross_entropy_forward", "target", targets, 1, N, V, true);
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    const auto row = scratch<float>(V);
    for (int64_t r = r0; r < r1; ++r) {
      if (targets[r] < 0) {
        losses[r] = 0.0f;
        continue;
      }
      load(s, logits, r * V, row.get(), V);
      const float m = elementwise::row_max(row.get(), V);
      const float sum = elementwise::exp_sum(nullptr, row.get(), m, V);
      losses[r] = m + std::log(sum) - row[targets[r]];
    }
  });
  return detail::mean_loss(losses, targets, N);
}

namespace {
// Rows [r0, r1) of dlogits = f * (exp(logits - rowmax) / sum - onehot(target - v0)); with
// `whole` the max and sum are the row's own (cross_entropy_backward), else rowmax and sums[r]
// (the shard's phases).
void cross_entropy_rows(ScalarType s, void* dlogits, const void* logits, const float* rowmax,
                        const float* sums, const int32_t* targets, int64_t r0, int64_t r1,
                        int64_t v0, int64_t Vs, float f) {
  const auto row = scratch<float>(Vs);
  const auto d = scratch<float>(Vs);
  for (int64_t r = r0; r < r1; ++r) {
    if (targets[r] < 0) {
      std::fill_n(d.get(), Vs, 0.0f);
      store(s, dlogits, r * Vs, d.get(), Vs);
      continue;
    }
    load(s, logits, r * Vs, row.get(), Vs);
    float inv;
    if (rowmax) {
      elementwise::exp_sum(d.get(), row.get(), rowmax[r], Vs);
      inv = 1.0f / sums[r];
    } else {
      inv = 1.0f / elementwise::exp_sum(d.get(), row.get(), elementwise::row_max(row.get(), Vs), Vs);
    }
    const int64_t local = int64_t{targets[r]} - v0;
    const bool here = local >= 0 && local < Vs;
    const float p_target = here ? d[local] * inv : 0.0f;
    elementwise::scale(d.get(), inv, f, Vs);
    if (here) d[local] = f * (p_target - 1.0f);
    store(s, dlogits, r * Vs, d.get(), Vs);
  }
}

float scale_over_rows(const int32_t* targets, int64_t N, float scale) {
  const int64_t count = std::count_if(targets, targets + N, [](int32_t t) { return t >= 0; });
  return count == 0 ? 0.0f : scale / float(count);
}
}  // namespace

void cross_entropy_backward(ScalarType s, void* dlogits, const void* logits,
                            const int32_t* targets, int64_t N, int64_t V, float scale) {
  check_ids("cross_entropy_backward", "target", targets, 1, N, V, true);
  const float f = scale_over_rows(targets, N, scale);
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    cross_entropy_rows(s, dlogits, logits, nullptr, nullptr, targets, r0, r1, 0, V, f);
  });
}

void cross_entropy_shard_max(ScalarType s, float* rowmax, const void* logits, int64_t N,
                             int64_t Vs) {
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    const auto row = scratch<float>(Vs);
    for (int64_t r = r0; r < r1; ++r) {
      load(s, logits, r * Vs, row.get(), Vs);
      rowmax[r] = elementwise::row_max(row.get(), Vs);
    }
  });
}

void cross_entropy_shard_sums(ScalarType s, float* sums, const void* logits, const float* rowmax,
                              const int32_t* targets, int64_t N, int64_t v0, int64_t Vs,
                              int64_t V) {
  check_ids("cross_entropy_shard_sums", "target", targets, 1, N, V, true);
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    const auto row = scratch<float>(Vs);
    for (int64_t r = r0; r < r1; ++r) {
      load(s, logits, r * Vs, row.get(), Vs);
      sums[r] = elementwise::exp_sum(nullptr, row.get(), rowmax[r], Vs);
      const int64_t local = int64_t{targets[r]} - v0;
      sums[N + r] = targets[r] >= 0 && local >= 0 && local < Vs ? row[local] : 0.0f;
    }
  });
}

void cross_entropy_shard_backward(ScalarType s, void* dlogits, const void* logits,
                                  const float* rowmax, const float* sums, const int32_t* targets,
                                  int64_t N, int64_t v0, int64_t Vs, int64_t V, float scale) {
  check_ids("cross_entropy_shard_backward", "target", targets, 1, N, V, true);
  const float f = scale_over_rows(targets, N, scale);
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    cross_entropy_rows(s, dlogits, logits, rowmax, sums, targets, r0, r1, v0, Vs, f);
  });
}

}  // namespace zero::models::cpu::k16
