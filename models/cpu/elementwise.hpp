// The fp32 element-wise work of the cpu backend, vectorised: GELU, layernorm, bias and residual
// adds, accumulation, the causal softmax rows of attention and the cross-entropy rows. Called by
// models/cpu/kernels.cpp and vocab_kernels.cpp for F = float (the fp64 reference kernels of the
// gradient checks stay on their plain loops). Internal to models/cpu/.
//
// Vector paths: AVX-512F (16 lanes), AVX2 (two 8-lane halves) and a generic loop the compiler
// vectorises as it can, chosen once, at first use, by what the CPU supports (as host AdamW does).
// Every path computes the same bits: each kernel is written once against a 16-lane vector type
// (models/cpu/elementwise_body.hpp); every operation is an IEEE fp32 add, subtract, multiply,
// divide, square root, compare or exact conversion, rounded once (these files are compiled with
// -ffp-contract=off: no fused multiply-adds); a sum along a row keeps 16 partial sums, lane j
// taking elements j, j+16, j+32, ... in order, and adds them at the end by a fixed tree (j and
// j+8, then j and j+4, then 2, then 1); a row's last n % 16 elements are one vector padded with a
// neutral value. So results depend on the shapes only: not on the ISA, not on the thread count.
//
// exp is detail::exp_fast (kernel_common.hpp) on 16 lanes, bit for bit: Cody-Waite reduction, a
// degree-7 polynomial, inputs clamped to [-87, 88]; within 2 ulp of e^x over that range (the
// unit test measures it against libm's double exp). NaN inputs give NaN.
//
// Threads: the whole-tensor kernels run on oneTBB over blocks whose bounds depend only on the
// shapes (kernels.hpp's determinism contract); the row functions are single-threaded, for the
// callers' own loops. Outputs may alias inputs exactly (y == x) where a comment says so; no
// other overlap.
#pragma once

#include <cstdint>

namespace zero::models::cpu::elementwise {

enum class Simd { best, avx512, avx2, generic };
const char* to_string(Simd simd) noexcept;
// Whether this CPU can run `simd` (best and generic: always).
bool supported(Simd simd) noexcept;
// The path in use (never `best`).
Simd active() noexcept;
// For tests and benchmarks: switch every kernel to `simd` (best = the widest supported). Throws
// zero::Error when the CPU lacks it. Must not be called while kernels run on other threads.
void use(Simd simd);

// ---- whole tensors (oneTBB over fixed blocks) --------------------------------------------------

// GPT-2's tanh GELU, y = v / (1 + e^(-2u)), u = sqrt(2/pi) (v + 0.044715 v^3); y may be x.
void gelu_forward(float* y, const float* x, int64_t n);
// dx = dy * d/dv GELU(v) at v = x; dx may be dy.
void gelu_backward(float* dx, const float* dy, const float* x, int64_t n);
// out = a + b (out may be a or b).
void add(float* out, const float* a, const float* b, int64_t n);
// y[r, :] += b for each of the N rows of y [N, C].
void add_bias(float* y, const float* b, int64_t N, int64_t C);

// Per row of x [N, C]: mean, rstd = 1 / sqrt(biased variance + 1e-5) (variance from the
// deviations about the mean: a second pass over the row while it is in L1, no cancellation),
// y = (x - mean) * rstd * w + b.
void layernorm_forward(float* y, float* mean, float* rstd, const float* x, const float* w,
                       const float* b, int64_t N, int64_t C);
// dx (overwritten) as kernels.hpp states; dw_sum[C] and db_sum[C] are overwritten with the sums
// over rows of dy * xhat and dy, in the fixed order of kernels.cpp's sum_rows (partials of 64
// rows, then the partials in block order), computed in the same pass as dx.
void layernorm_backward(float* dx, float* dw_sum, float* db_sum, const float* dy, const float* x,
                        const float* w, const float* mean, const float* rstd, int64_t N,
                        int64_t C);

// Cross-entropy over logits [N, V] with targets already checked to be in [0, V) or -1:
// losses[r] = max + log(sum exp(row - max)) - row[target] (0 for -1); returns the mean over the
// rows with a target, summed in row order in double (0 when there are none).
float cross_entropy_forward(float* losses, const float* logits, const int32_t* targets, int64_t N,
                            int64_t V);
// dlogits = f * (softmax(row) - onehot(target)); rows with target -1 are 0. f is the caller's
// scale over the rows that count.
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            int64_t N, int64_t V, float f);

// ---- rows (single-threaded) --------------------------------------------------------------------

float row_max(const float* x, int64_t n);
// out[j] = exp(x[j] - shift) when out is not null (out may be x); returns their sum.
float exp_sum(float* out, const float* x, float shift, int64_t n);
// d[j] = f * (d[j] * inv): a softmax's normalisation (f = 1 leaves d * inv exactly).
void scale(float* d, float inv, float f, int64_t n);
// The causal softmax of attention on one row of width `width`: row[0, n) becomes its softmax,
// row[n, width) exact zeros.
void softmax_causal_row(float* row, int64_t n, int64_t width);
// Its backward on one row: d[0, n) = p * (d - sum_j p d), d[n, width) = 0.
void softmax_causal_backward_row(float* d, const float* p, int64_t n, int64_t width);
// sum_j a[j] b[j] over [0, n) (16 partial sums added by the fixed tree).
float dot(const float* a, const float* b, int64_t n);
// d[0, n) = p * (d - dt): a softmax's backward with the row's sum_j p_j dP_j given as dt (the
// blocked attention's D = rowsum(dout * out), which is that sum).
void softmax_backward_row(float* d, const float* p, float dt, int64_t n);

}  // namespace zero::models::cpu::elementwise
