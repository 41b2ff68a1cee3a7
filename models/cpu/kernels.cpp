// The cpu model kernels (contract in kernels.hpp).
//
// Partitioning, the whole of the determinism argument: every parallel loop below runs over
// blocks whose bounds depend only on the shapes and the constants here, and each block writes
// its own outputs. A sum over rows (a parameter gradient) is never split by thread: rows are cut
// into fixed blocks of kSumRows, each block sums its rows in order into its own partial, and one
// loop adds the partials in block order (sum_rows). Matrix products go to the BLAS or to oneDNN
// (matmul.hpp) one fixed block or tile per call, each call on one thread, so a call's result
// never depends on how oneTBB scheduled the blocks or on how many threads it had.
#include "models/cpu/kernels.hpp"
#include "models/cpu/elementwise.hpp"  // F = float element-wise work; the loops here serve fp64
#include "models/cpu/gemm.hpp"
#include "models/cpu/kernel_common.hpp"
#include "models/cpu/matmul.hpp"
#include "models/ops.hpp"

#include <cblas.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "core/error.hpp"

namespace zero::models::cpu {
namespace {

using namespace detail;

// Rows per BLAS call for row-partitioned products: about an eighth of the rows (8 tasks), in
// multiples of 64, between 128 and 512. Each call re-packs the whole right-hand matrix (the
// weight): with 128-row blocks and 256 x 256 gradient tiles OpenBLAS's copy routines took 12.5%
// of an fp32 step on an AVX2 EPYC (perf), 11.3% with these, so bigger products take bigger
// blocks. A function of the product's shape only, never of the thread count, so results stay
// independent of it.
constexpr int64_t kGemmRowsMin = 128;
constexpr int64_t kGemmRowsMax = 512;
constexpr int64_t kGemmTasks = 8;
int64_t gemm_rows(int64_t n) {
  const int64_t per = ((n + kGemmTasks - 1) / kGemmTasks + 63) / 64 * 64;
  return std::clamp(per, kGemmRowsMin, kGemmRowsMax);
}
// Whether fp32 products go to oneDNN instead of OpenBLAS. Measured by bench/cpu_gemm, one thread
// per call: oneDNN 0.54-2.6x OpenBLAS, no consistent win. Kept off also because
// OPENBLAS_CORETYPE makes fp32 runs reproducible across machines, while oneDNN's blocking follows
// the detected caches (docs/models.md, "Matrix products on the cpu backend").
constexpr bool kF32OnDnnl = false;
// Output tiles of the weight-gradient products g[M,Nc] += A^T B (A [K,M], B [K,Nc]): a tile
// grid of tm x tn packs A tn times and B tm times, so the grid is the one of at least kGemmTasks
// tiles (fewer when the product is small) that packs the fewest elements, tile edges in
// multiples of 64 and at least 64. Square 256 x 256 tiles packed the tied head's dy 2 and x 32
// times (64M floats for a 17 GFLOP product at V 8192); its best grid, 8 x 1, packs 24M.
// The grid also has at least area / kTileMaxElems tiles (tiles of about 4 MiB of fp32 scratch at
// most), so a wide head (GPT-2's 50257 x 768: 38 tiles of 1344 x 768) takes more tiles rather
// than tens of MiB of scratch per thread.
constexpr int64_t kTileAlign = 64;
constexpr int64_t kTileMaxElems = int64_t{1} << 20;
struct TileGrid {
  int64_t rows, cols;  // tile edges
};
TileGrid tile_grid(int64_t M, int64_t Nc) {
  const int64_t um = (M + kTileAlign - 1) / kTileAlign, un = (Nc + kTileAlign - 1) / kTileAlign;
  const int64_t want =
      std::min(um * un, std::max(kGemmTasks, (M * Nc + kTileMaxElems - 1) / kTileMaxElems));
  TileGrid best{kTileAlign * um, kTileAlign * un};
  int64_t best_cost = -1;
  for (int64_t tm = 1; tm <= um; ++tm) {
    const int64_t rows = (um + tm - 1) / tm * kTileAlign;
    for (int64_t tn = 1; tn <= un; ++tn) {
      const int64_t cols = (un + tn - 1) / tn * kTileAlign;
      const int64_t gm = (M + rows - 1) / rows, gn = (Nc + cols - 1) / cols;
      if (gm * gn < want) continue;
      const int64_t cost = gn * M + gm * Nc;
      if (best_cost < 0 || cost < best_cost) {
        best_cost = cost;
        best = {rows, cols};
      }
      break;  // more column tiles only pack A more often
    }
  }
  return best;
}
// Rows per partial in sum_rows, and columns per task when the partials are added up.
constexpr int64_t kSumRows = 64;
constexpr int64_t kSumCols = 256;
// Elements per task for elementwise kernels and conversions.
constexpr int64_t kElemBlock = 16384;

// ---- matrix products of the linear layers ----
// A product's operand as stored: `p` holds elements of `t` (F's own type, or a 16-bit type when
// F is float), `ld` of them between rows.
struct Mat {
  const void* p;
  ScalarType t;
  int64_t ld;
};

// m shifted by `elems` elements (a block's first row or a tile's first column).
Mat at(const Mat& m, int64_t elems) {
  return {static_cast<const char*>(m.p) + elems * static_cast<int64_t>(size_of(m.t)), m.t, m.ld};
}

// The operand type of products with a parameter (or a gradient) stored as t: t itself when it
// is 16-bit and oneDNN has a kernel for it on this CPU (fp32 accumulation, as PyTorch's
// autocast), else F (a 16-bit parameter then read as fp32, the fallback on CPUs without one).
template <class F>
ScalarType product_type(ScalarType t) {
  if constexpr (std::same_as<F, float>) {
    if ((t == ScalarType::bf16 || t == ScalarType::f16) && matmul_supports(t)) return t;
  }
  return scalar_type_of<F>;
}

// An activation (or its gradient) x of n elements as an operand of type t: x itself when t is
// F's type, else a copy rounded once to t (kept in buf).
template <class F>
Mat operand(const F* x, int64_t n, int64_t ld, ScalarType t, std::unique_ptr<uint16_t[]>& buf) {
  if (t == scalar_type_of<F>) return {x, t, ld};
  if constexpr (std::same_as<F, float>) {
    buf = scratch<uint16_t>(n);
    for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
      convert(x + i0, DType::f32, buf.get() + i0, *to_dtype(t), static_cast<size_t>(i1 - i0));
    });
    return {buf.get(), t, ld};
  }
  ZERO_FAIL("cpu kernels: no " + std::string(to_string(t)) + " products in " +
            std::string(to_string(scalar_type_of<F>)));
}

// The parameter w (n elements) as an operand of type t: as stored when its type is t (no copy),
// else read as F into buf.
template <class F>
Mat weight(const Param<F>& w, int64_t n, int64_t ld, ScalarType t, std::unique_ptr<F[]>& buf) {
  if (w.type() == t) return {w.data(), t, ld};
  return {w.dense(n, buf), scalar_type_of<F>, ld};
}

// Row-major C[M,N] = op(A) op(B) (+= C when acc). 16-bit operands, and fp32 ones when
// kF32OnDnnl, go to oneDNN (matmul.hpp: one thread per call); the rest to the BLAS.
template <class F>
void product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const Mat& A, const Mat& B,
             bool acc, F* C, int64_t ldc) {
  if constexpr (std::same_as<F, float>) {
    if (A.t != ScalarType::f32 || kF32OnDnnl) {
      matmul(M, N, K, {A.p, A.t, A.ld, ta}, {B.p, B.t, B.ld, tb}, C, ldc, acc);
      return;
    }
  }
  gemm<F>(ta, tb, M, N, K, F(1), static_cast<const F*>(A.p), A.ld, static_cast<const F*>(B.p),
          B.ld, acc ? F(1) : F(0), C, ldc);
}

// out[0, width) = sum over i in [0, rows) of the row terms add_row(i, acc) adds into acc, in a
// fixed order (the file comment): partials of kSumRows rows, then the partials in block order.
template <class F, class AddRow>
void sum_rows(int64_t rows, int64_t width, F* out, const AddRow& add_row) {
  const int64_t blocks = (rows + kSumRows - 1) / kSumRows;
  std::vector<F> partial(static_cast<size_t>(blocks * width), F(0));
  for_blocks(rows, kSumRows, [&](int64_t i0, int64_t i1) {
    F* acc = partial.data() + (i0 / kSumRows) * width;
    for (int64_t i = i0; i < i1; ++i) add_row(i, acc);
  });
  for_blocks(width, kSumCols, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) out[j] = F(0);
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const F* p = partial.data() + blk * width;
      for (int64_t j = j0; j < j1; ++j) out[j] += p[j];
    }
  });
}

// g[M,Nc] += A^T B with A [K,M] and B [K,Nc] (Mat: their types and leading dimensions): one
// product per fixed output tile into fp32 scratch, then one rounded add per element.
template <class F>
void add_at_b(Grad<F> g, int64_t M, int64_t Nc, int64_t K, const Mat& A, const Mat& B) {
  if (M <= 0 || Nc <= 0) return;  // no tiles (tile_grid has no edge to give)
  const TileGrid grid = tile_grid(M, Nc);
  const int64_t tm = (M + grid.rows - 1) / grid.rows, tn = (Nc + grid.cols - 1) / grid.cols;
  tbb::parallel_for(int64_t{0}, tm * tn, [&](int64_t tile) {
    const int64_t i0 = (tile / tn) * grid.rows, j0 = (tile % tn) * grid.cols;
    const int64_t mi = std::min(grid.rows, M - i0), nj = std::min(grid.cols, Nc - j0);
    const auto buf = scratch<F>(mi * nj);
    product<F>(true, false, mi, nj, K, at(A, i0), at(B, j0), false, buf.get(), nj);
    for (int64_t r = 0; r < mi; ++r) g.add((i0 + r) * Nc + j0, buf.get() + r * nj, nj);
  });
}

template <class F>
constexpr bool can_store(ScalarType t) {
  if (t == scalar_type_of<F>) return true;
  return std::same_as<F, float> && (t == ScalarType::f16 || t == ScalarType::bf16);
}

}  // namespace

// ---- parameters and gradients in their storage types -------------------------------------------

template <ComputeType F>
Param<F>::Param(const void* data, ScalarType type) : data_(data), type_(type) {
  ZERO_REQUIRE(can_store<F>(type), "cpu kernels: a " + std::string(to_string(type)) +
                                       " parameter cannot be read in " +
                                       std::string(to_string(scalar_type_of<F>)));
}

template <ComputeType F>
void Param<F>::load(int64_t offset, F* dst, int64_t n) const {
  const auto* src = static_cast<const char*>(data_) + static_cast<size_t>(offset) * size_of(type_);
  if (type_ == scalar_type_of<F>) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(F));
  } else if constexpr (std::same_as<F, float>) {
    convert(src, *to_dtype(type_), dst, DType::f32, static_cast<size_t>(n));
  }
}

template <ComputeType F>
const F* Param<F>::dense(int64_t n, std::unique_ptr<F[]>& buf) const {
  if (type_ == scalar_type_of<F>) return static_cast<const F*>(data_);
  buf = scratch<F>(n);
  for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) { load(i0, buf.get() + i0, i1 - i0); });
  return buf.get();
}

template <ComputeType F>
Grad<F>::Grad(void* data, ScalarType type) : data_(data), type_(type) {
  ZERO_REQUIRE(can_store<F>(type), "cpu kernels: a " + std::string(to_string(type)) +
                   " gradient cannot accumulate in " + std::string(to_string(scalar_type_of<F>)));
}

template <ComputeType F>
void Grad<F>::add(int64_t offset, const F* v, int64_t n) const {
  if (type_ == scalar_type_of<F>) {
    F* p = static_cast<F*>(data_) + offset;
    for (int64_t i = 0; i < n; ++i) p[i] += v[i];
  } else if constexpr (std::same_as<F, float>) {
    // 16-bit storage: chunks widened exactly with the vectorised conversions of core/dtype.hpp,
    // added in fp32, rounded once (to nearest even) on the way back: the bits of
    // p[i] = round(float(p[i]) + v[i]) element by element, at vector speed (the per-element
    // loop ran scalar, and weight gradients add every element once per micro-batch).
    const DType d = type_ == ScalarType::bf16 ? DType::bf16 : DType::f16;
    char* p = static_cast<char*>(data_) + offset * 2;
    constexpr int64_t kChunk = 1024;
    float tmp[kChunk];
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t m = std::min(kChunk, n - i0);
      convert(p + i0 * 2, d, tmp, DType::f32, static_cast<size_t>(m));
      for (int64_t i = 0; i < m; ++i) tmp[i] += v[i0 + i];
      convert(tmp, DType::f32, p + i0 * 2, d, static_cast<size_t>(m));
    }
  }
}

// ---- embedding ---------------------------------------------------------------------------------

template <ComputeType F>
void embedding_forward(F* out, const int32_t* tokens, Param<F> wte, Param<F> wpe, int64_t B,
                       int64_t T, int64_t C, int64_t V) {
  check_ids("embedding_forward", "token id", tokens, B, T, V, false);
  for_blocks(B * T, kRowBlock, [&](int64_t r0, int64_t r1) {
    const auto pos = scratch<F>(C);
    for (int64_t r = r0; r < r1; ++r) {
      F* o = out + r * C;
      wte.load(int64_t{tokens[r]} * C, o, C);
      wpe.load((r % T) * C, pos.get(), C);
      for (int64_t c = 0; c < C; ++c) o[c] += pos[c];
    }
  });
}

template <ComputeType F>
void embedding_backward(Grad<F> dwte, Grad<F> dwpe, const F* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, int64_t V) {
  check_ids("embedding_backward", "token id", tokens, B, T, V, false);
  // dwte: positions grouped by token (in (b,t) order within a group), one task per group range,
  // so each touched row of dwte gets one summed contribution.
  const TokenGroups tg = group_by_token(tokens, B * T, 0, V);
  const std::vector<int64_t>& order = tg.order;
  const std::vector<int64_t>& starts = tg.starts;
  for_blocks(tg.groups(), kRowBlock, [&](int64_t g0, int64_t g1) {
    const auto acc = scratch<F>(C);
    for (int64_t g = g0; g < g1; ++g) {
      std::fill_n(acc.get(), C, F(0));
      for (int64_t i = starts[g]; i < starts[g + 1]; ++i) {
        const F* d = dout + order[i] * C;
        for (int64_t c = 0; c < C; ++c) acc[c] += d[c];
      }
      dwte.add(int64_t{tokens[order[starts[g]]]} * C, acc.get(), C);
    }
  });
  // dwpe: one task per position block, batches summed in order.
  for_blocks(T, kRowBlock, [&](int64_t t0, int64_t t1) {
    const auto acc = scratch<F>(C);
    for (int64_t t = t0; t < t1; ++t) {
      std::fill_n(acc.get(), C, F(0));
      for (int64_t b = 0; b < B; ++b) {
        const F* d = dout + (b * T + t) * C;
        for (int64_t c = 0; c < C; ++c) acc[c] += d[c];
      }
      dwpe.add(t * C, acc.get(), C);
    }
  });
}

// ---- layernorm ---------------------------------------------------------------------------------

template <ComputeType F>
void layernorm_forward(F* y, F* mean, F* rstd, const F* x, Param<F> w, Param<F> b, int64_t N,
                       int64_t C) {
  std::unique_ptr<F[]> wbuf, bbuf;
  const F* wd = w.dense(C, wbuf);
  const F* bd = b.dense(C, bbuf);
  if constexpr (std::same_as<F, float>) {
    return elementwise::layernorm_forward(y, mean, rstd, x, wd, bd, N, C);
  }
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const F* xr = x + r * C;
      F sum = 0;
      for (int64_t c = 0; c < C; ++c) sum += xr[c];
      const F m = sum / F(C);
      F var = 0;  // two passes: no cancellation when |mean| >> std
      for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
      const F s = F(1) / std::sqrt(var / F(C) + F(1e-5));
      F* yr = y + r * C;
      for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - m) * s * wd[c] + bd[c];
      mean[r] = m;
      rstd[r] = s;
    }
  });
}

template <ComputeType F>
void layernorm_backward(F* dx, Grad<F> dw, Grad<F> db, const F* dy, const F* x, Param<F> w,
                        const F* mean, const F* rstd, int64_t N, int64_t C) {
  std::unique_ptr<F[]> wbuf;
  const F* wd = w.dense(C, wbuf);
  if constexpr (std::same_as<F, float>) {
    const auto sums = scratch<F>(2 * C);  // [0, C): dw's contribution, [C, 2C): db's
    elementwise::layernorm_backward(dx, sums.get(), sums.get() + C, dy, x, wd, mean, rstd, N, C);
    dw.add(0, sums.get(), C);
    db.add(0, sums.get() + C, C);
    return;
  }
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const F* xr = x + r * C;
      const F* dyr = dy + r * C;
      const F m = mean[r], s = rstd[r];
      F sum_g = 0, sum_gx = 0;
      for (int64_t c = 0; c < C; ++c) {
        const F g = dyr[c] * wd[c];
        sum_g += g;
        sum_gx += g * (xr[c] - m) * s;
      }
      const F mg = sum_g / F(C), mgx = sum_gx / F(C);
      F* dxr = dx + r * C;
      for (int64_t c = 0; c < C; ++c)
        dxr[c] = s * (dyr[c] * wd[c] - mg - (xr[c] - m) * s * mgx);
    }
  });
  // [0, C): dw's contribution, [C, 2C): db's.
  const auto sums = scratch<F>(2 * C);
  sum_rows<F>(N, 2 * C, sums.get(), [&](int64_t r, F* acc) {
    const F* xr = x + r * C;
    const F* dyr = dy + r * C;
    const F m = mean[r], s = rstd[r];
    for (int64_t c = 0; c < C; ++c) {
      acc[c] += dyr[c] * ((xr[c] - m) * s);
      acc[C + c] += dyr[c];
    }
  });
  dw.add(0, sums.get(), C);
  db.add(0, sums.get() + C, C);
}

// ---- linear layers -----------------------------------------------------------------------------

template <ComputeType F>
void linear_forward(F* y, const F* x, Param<F> w, Param<F> b, bool has_bias, int64_t N, int64_t C,
                    int64_t OC) {
  const ScalarType pt = product_type<F>(w.type());
  std::unique_ptr<F[]> wbuf, bbuf;
  std::unique_ptr<uint16_t[]> xbuf;
  const Mat wm = weight(w, C * OC, OC, pt, wbuf);
  const Mat xm = operand(x, N * C, C, pt, xbuf);
  const F* bd = has_bias ? b.dense(OC, bbuf) : nullptr;
  for_blocks(N, gemm_rows(N), [&](int64_t r0, int64_t r1) {
    F* yb = y + r0 * OC;
    if (bd)
      for (int64_t r = r0; r < r1; ++r) std::copy_n(bd, OC, y + r * OC);
    product<F>(false, false, r1 - r0, OC, C, at(xm, r0 * C), wm, bd != nullptr, yb, OC);
  });
}

template <ComputeType F>
void linear_backward_input(F* dx, const F* dy, Param<F> w, int64_t N, int64_t C, int64_t OC) {
  const ScalarType pt = product_type<F>(w.type());
  std::unique_ptr<F[]> wbuf;
  std::unique_ptr<uint16_t[]> dybuf;
  const Mat wm = weight(w, C * OC, OC, pt, wbuf);
  const Mat dym = operand(dy, N * OC, OC, pt, dybuf);
  for_blocks(N, gemm_rows(N), [&](int64_t r0, int64_t r1) {
    product<F>(false, true, r1 - r0, C, OC, at(dym, r0 * OC), wm, false, dx + r0 * C, C);
  });
}

template <ComputeType F>
void linear_backward_weight(Grad<F> dw, Grad<F> db, bool has_bias, const F* dy, const F* x,
                            int64_t N, int64_t C, int64_t OC) {
  // The weight gradient's products are 16-bit when the gradient is (the parameter's own type, as
  // the engine hands it): it is rounded to that type anyway.
  const ScalarType pt = product_type<F>(dw.type());
  std::unique_ptr<uint16_t[]> xbuf, dybuf;
  add_at_b<F>(dw, C, OC, N, operand(x, N * C, C, pt, xbuf), operand(dy, N * OC, OC, pt, dybuf));
  if (has_bias) {
    const auto sums = scratch<F>(OC);
    sum_rows<F>(N, OC, sums.get(), [&](int64_t r, F* acc) {
      const F* d = dy + r * OC;
      for (int64_t j = 0; j < OC; ++j) acc[j] += d[j];
    });
    db.add(0, sums.get(), OC);
  }
}

template <ComputeType F>
void linear_backward(F* dx, Grad<F> dw, Grad<F> db, bool has_bias, const F* dy, const F* x,
                     Param<F> w, int64_t N, int64_t C, int64_t OC) {
  if (dx) linear_backward_input<F>(dx, dy, w, N, C, OC);
  linear_backward_weight<F>(dw, db, has_bias, dy, x, N, C, OC);
}

template <ComputeType F>
void linear_t_forward(F* y, const F* x, Param<F> w, int64_t N, int64_t C, int64_t V) {
  const ScalarType pt = product_type<F>(w.type());
  std::unique_ptr<F[]> wbuf;
  std::unique_ptr<uint16_t[]> xbuf;
  const Mat wm = weight(w, V * C, C, pt, wbuf);
  const Mat xm = operand(x, N * C, C, pt, xbuf);
  for_blocks(N, gemm_rows(N), [&](int64_t r0, int64_t r1) {
    product<F>(false, true, r1 - r0, V, C, at(xm, r0 * C), wm, false, y + r0 * V, V);
  });
}

template <ComputeType F>
void linear_t_backward_input(F* dx, const F* dy, Param<F> w, int64_t N, int64_t C, int64_t V) {
  const ScalarType pt = product_type<F>(w.type());
  std::unique_ptr<F[]> wbuf;
  std::unique_ptr<uint16_t[]> dybuf;
  const Mat wm = weight(w, V * C, C, pt, wbuf);
  const Mat dym = operand(dy, N * V, V, pt, dybuf);
  for_blocks(N, gemm_rows(N), [&](int64_t r0, int64_t r1) {
    product<F>(false, false, r1 - r0, C, V, at(dym, r0 * V), wm, false, dx + r0 * C, C);
  });
}

template <ComputeType F>
void linear_t_backward_weight(Grad<F> dw, const F* dy, const F* x, int64_t N, int64_t C,
                              int64_t V) {
  const ScalarType pt = product_type<F>(dw.type());  // as linear_backward_weight
  std::unique_ptr<uint16_t[]> dybuf, xbuf;
  add_at_b<F>(dw, V, C, N, operand(dy, N * V, V, pt, dybuf), operand(x, N * C, C, pt, xbuf));
}

template <ComputeType F>
void linear_t_backward(F* dx, Grad<F> dw, const F* dy, const F* x, Param<F> w, int64_t N,
                       int64_t C, int64_t V) {
  linear_t_backward_input<F>(dx, dy, w, N, C, V);
  linear_t_backward_weight<F>(dw, dy, x, N, C, V);
}

// ---- GELU --------------------------------------------------------------------------------------

namespace {
// sqrt(2 / pi) and the cubic coefficient of GPT-2's approximation.
constexpr double kGeluScale = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
}  // namespace

// 0.5 (1 + tanh(u)) is the logistic function s = 1 / (1 + e^(-2u)), so GELU is v s and its
// derivative s + 2 v s (1 - s) du/dv (as 1 - tanh^2 = 4 s (1 - s)): one exponential, no
// cancellation near u = 0, and it vectorises through exp_of.
template <ComputeType F>
void gelu_forward(F* y, const F* x, int64_t n) {
  if constexpr (std::same_as<F, float>) return elementwise::gelu_forward(y, x, n);
  for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const F v = x[i];
      const F u = F(kGeluScale) * (v + F(kGeluCubic) * v * v * v);
      y[i] = v / (F(1) + exp_of(F(-2) * u));
    }
  });
}

template <ComputeType F>
void gelu_backward(F* dx, const F* dy, const F* x, int64_t n) {
  if constexpr (std::same_as<F, float>) return elementwise::gelu_backward(dx, dy, x, n);
  for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const F v = x[i];
      const F s = F(1) / (F(1) + exp_of(F(-2) * F(kGeluScale) * (v + F(kGeluCubic) * v * v * v)));
      const F du = F(kGeluScale) * (F(1) + F(3 * kGeluCubic) * v * v);
      dx[i] = dy[i] * (s + F(2) * v * s * (F(1) - s) * du);
    }
  });
}

// ---- attention ---------------------------------------------------------------------------------
// One task per (batch, head); its q, k, v, out and dqkv slices are strided views of the [B,T,3C]
// and [B,T,C] buffers (leading dimension 3C or C). Scores are computed for the whole T x T square
// by one BLAS call and the upper triangle overwritten with 0, which makes P @ V add exact zeros
// for future positions: out at t is bitwise independent of inputs at t' > t.

template <ComputeType F>
void attention_forward(F* out, F* probs, const F* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH) {
  const int64_t hs = C / NH;
  const F scale = F(1) / std::sqrt(F(hs));
  tbb::parallel_for(int64_t{0}, B * NH, [&](int64_t bh) {
    const int64_t b = bh / NH, h = bh % NH;
    const F* q = qkv + b * T * 3 * C + h * hs;
    F* P = probs + bh * T * T;
    gemm<F>(false, true, T, T, hs, scale, q, 3 * C, q + C, 3 * C, F(0), P, T);
    for (int64_t t = 0; t < T; ++t) {
      F* row = P + t * T;
      if constexpr (std::same_as<F, float>) {
        elementwise::softmax_causal_row(row, t + 1, T);
        continue;
      }
      const F inv = F(1) / exp_shifted(row, row, t + 1);
      for (int64_t j = 0; j <= t; ++j) row[j] *= inv;
      std::fill(row + t + 1, row + T, F(0));
    }
    gemm<F>(false, false, T, hs, T, F(1), P, T, q + 2 * C, 3 * C, F(0), out + b * T * C + h * hs,
            C);
  });
}

template <ComputeType F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* probs, int64_t B,
                        int64_t T, int64_t C, int64_t NH) {
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
    const F* P = probs + bh * T * T;
    const F* dO = dout + b * T * C + h * hs;
    const auto dS = scratch<F>(T * T);
    gemm<F>(false, true, T, T, hs, F(1), dO, C, v, 3 * C, F(0), dS.get(), T);  // dP = dO V^T
    gemm<F>(true, false, T, hs, T, F(1), P, T, dO, C, F(0), dv, 3 * C);         // dV = P^T dO
    // Softmax backward, row by row: dS = P * (dP - sum_j P dP); 0 above the diagonal.
    for (int64_t t = 0; t < T; ++t) {
      const F* p = P + t * T;
      F* d = dS.get() + t * T;
      if constexpr (std::same_as<F, float>) {
        elementwise::softmax_causal_backward_row(d, p, t + 1, T);
        continue;
      }
      F dot = 0;
      for (int64_t j = 0; j <= t; ++j) dot += p[j] * d[j];
      for (int64_t j = 0; j <= t; ++j) d[j] = p[j] * (d[j] - dot);
      std::fill(d + t + 1, d + T, F(0));
    }
    gemm<F>(false, false, T, hs, T, scale, dS.get(), T, k, 3 * C, F(0), dq, 3 * C);  // dS K
    gemm<F>(true, false, T, hs, T, scale, dS.get(), T, q, 3 * C, F(0), dk, 3 * C);   // dS^T Q
  });
}

// ---- elementwise -------------------------------------------------------------------------------

template <ComputeType F>
void add(F* out, const F* a, const F* b, int64_t n) {
  if constexpr (std::same_as<F, float>) return elementwise::add(out, a, b, n);
  for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

template <ComputeType F>
void accumulate(Grad<F> acc, const F* x, int64_t n) {
  if constexpr (std::same_as<F, float>) {
    if (float* dense = acc.dense_data()) return elementwise::add(dense, dense, x, n);
  }
  for_blocks(n, kElemBlock, [&](int64_t i0, int64_t i1) { acc.add(i0, x + i0, i1 - i0); });
}

// ---- cross-entropy -----------------------------------------------------------------------------

template <ComputeType F>
F cross_entropy_forward(F* losses, const F* logits, const int32_t* targets, int64_t N, int64_t V) {
  check_ids("cross_entropy_forward", "target", targets, 1, N, V, true);
  if constexpr (std::same_as<F, float>)
    return elementwise::cross_entropy_forward(losses, logits, targets, N, V);
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    std::vector<F> e(static_cast<size_t>(V));  // per block: the exponentials of one row
    for (int64_t r = r0; r < r1; ++r) {
      if (targets[r] < 0) {
        losses[r] = 0;
        continue;
      }
      const F* row = logits + r * V;
      const F m = row_max(row, V);
      const F sum = exp_shifted(row, e.data(), V);
      losses[r] = m + std::log(sum) - row[targets[r]];  // logsumexp - the target's logit
    }
  });
  return detail::mean_loss(losses, targets, N);
}

template <ComputeType F>
void cross_entropy_backward(F* dlogits, const F* logits, const int32_t* targets, int64_t N,
                            int64_t V, F scale) {
  check_ids("cross_entropy_backward", "target", targets, 1, N, V, true);
  const int64_t count = std::count_if(targets, targets + N, [](int32_t t) { return t >= 0; });
  const F f = count == 0 ? F(0) : scale / F(count);
  if constexpr (std::same_as<F, float>)
    return elementwise::cross_entropy_backward(dlogits, logits, targets, N, V, f);
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      F* d = dlogits + r * V;
      if (targets[r] < 0) {
        std::fill_n(d, V, F(0));
        continue;
      }
      const F inv = F(1) / exp_shifted(logits + r * V, d, V);
      const F p_target = d[targets[r]] * inv;
      for (int64_t j = 0; j < V; ++j) d[j] = f * (d[j] * inv);
      d[targets[r]] = f * (p_target - F(1));
    }
  });
}

// ---- instantiations ----------------------------------------------------------------------------

#define ZERO_CPU_KERNELS(F)                                                                      \
  template class Param<F>;                                                                       \
  template class Grad<F>;                                                                        \
  template void embedding_forward<F>(F*, const int32_t*, Param<F>, Param<F>, int64_t, int64_t,   \
                                     int64_t, int64_t);                                          \
  template void embedding_backward<F>(Grad<F>, Grad<F>, const F*, const int32_t*, int64_t,       \
                                      int64_t, int64_t, int64_t);                                \
  template void layernorm_forward<F>(F*, F*, F*, const F*, Param<F>, Param<F>, int64_t,          \
                                     int64_t);                                                   \
  template void layernorm_backward<F>(F*, Grad<F>, Grad<F>, const F*, const F*, Param<F>,        \
                                      const F*, const F*, int64_t, int64_t);                     \
  template void linear_forward<F>(F*, const F*, Param<F>, Param<F>, bool, int64_t, int64_t,      \
                                  int64_t);                                                      \
  template void linear_backward<F>(F*, Grad<F>, Grad<F>, bool, const F*, const F*, Param<F>,     \
                                   int64_t, int64_t, int64_t);                                   \
  template void linear_backward_input<F>(F*, const F*, Param<F>, int64_t, int64_t, int64_t);     \
  template void linear_backward_weight<F>(Grad<F>, Grad<F>, bool, const F*, const F*, int64_t,   \
                                          int64_t, int64_t);                                     \
  template void linear_t_forward<F>(F*, const F*, Param<F>, int64_t, int64_t, int64_t);          \
  template void linear_t_backward_input<F>(F*, const F*, Param<F>, int64_t, int64_t, int64_t);   \
  template void linear_t_backward_weight<F>(Grad<F>, const F*, const F*, int64_t, int64_t,       \
                                            int64_t);                                            \
  template void linear_t_backward<F>(F*, Grad<F>, const F*, const F*, Param<F>, int64_t,         \
                                     int64_t, int64_t);                                          \
  template void gelu_forward<F>(F*, const F*, int64_t);                                          \
  template void gelu_backward<F>(F*, const F*, const F*, int64_t);                               \
  template void attention_forward<F>(F*, F*, const F*, int64_t, int64_t, int64_t, int64_t);      \
  template void attention_backward<F>(F*, const F*, const F*, const F*, int64_t, int64_t,        \
                                      int64_t, int64_t);                                         \
  template void add<F>(F*, const F*, const F*, int64_t);                                         \
  template void accumulate<F>(Grad<F>, const F*, int64_t);                                            \
  template F cross_entropy_forward<F>(F*, const F*, const int32_t*, int64_t, int64_t);           \
  template void cross_entropy_backward<F>(F*, const F*, const int32_t*, int64_t, int64_t, F);

ZERO_CPU_KERNELS(float)
ZERO_CPU_KERNELS(double)
#undef ZERO_CPU_KERNELS

}  // namespace zero::models::cpu

namespace zero::models {

std::string cpu_blas_description() {
  // openblas_get_config(): "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ... Cooperlake MAX_THREADS=64";
  // its first two words are the library and version.
  const std::string config = openblas_get_config();
  size_t end = config.find(' ');
  if (end != std::string::npos) end = config.find(' ', end + 1);
  // oneDNN's kernel family orders the 16-bit products' sums as OpenBLAS's does the fp32 ones.
  return config.substr(0, end) + ", " + openblas_get_corename() + " kernels; bf16 products: " +
         cpu::matmul_description(ScalarType::bf16);
}

}  // namespace zero::models
