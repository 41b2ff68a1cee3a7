// The cuda backend's kernels (models/cuda/*.cu), as launchers the host side (cuda_ops.cpp) calls
// on checked input. Each launcher enqueues work on `stream` and returns at once: no launcher
// synchronises, allocates or frees; the caller keeps every buffer alive until the stream has
// passed the work. The calling thread's current device must be the stream's device.
//
// Types (the rules of the cuda backend, see also models/ops.hpp):
//   - A, the activation type, is fp32, bf16 or fp16; every activation operand of a call has it.
//   - Parameters (w, b, wte, wpe) have type A. Gradients of parameters are fp32 or A, chosen per
//     tensor. Statistics (mean, rstd), per-row losses and the loss are fp32.
//   - Arithmetic is fp32: every 16-bit value is widened exactly (dtype.hpp's to_float) and every
//     stored 16-bit result is rounded once, with dtype.hpp's from_float<T> (the host's exact
//     rounding, NaN rule included; never CUDA's own conversions).
//   - "+=" into a gradient G: the contribution is summed in fp32 first, then added to the widened
//     gradient and rounded once to G (add_f32, the finishers of the column sums).
//
// Determinism: no float atomics anywhere. Every reduction has an order fixed by the shapes:
// warp butterflies and block trees over fixed per-thread strides, column sums over fixed row
// chunks (partials in a workspace, added in chunk order), the embedding gradient through a
// stable radix sort (positions ascending within a token). Integer atomics only record errors.
//
// Errors: token ids and targets outside their range are clamped (so every access stays in
// bounds) and reported into an ErrorRecord in device memory, which the host reads at its step
// boundary (CudaOps::check_errors). The record keeps the first failing call (by the call number
// the host gives each launch; calls on one stream run in order) and in it the lowest row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.hpp"

namespace zero::models::kernels {

// The largest fp32 workspace the host side gives a chunked computation (attention scores of a
// group of heads, the fp32 contribution of a 16-bit weight gradient): bigger problems run in
// chunks of at most this many bytes, and at least one head or one column.
inline constexpr size_t kChunkBytes = size_t(64) << 20;

// Offsets inside a workspace are multiples of this (cuBLAS and vector loads like 256 bytes).
inline constexpr size_t kWorkspaceAlign = 256;
constexpr size_t align_up(size_t bytes) noexcept {
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

// Which op found bad data (ErrorRecord::op).
enum class CheckedOp : unsigned int {
  none = 0,
  embedding_forward,
  embedding_backward,
  cross_entropy_forward,
  cross_entropy_backward,
};

// Device-side error word; all zero bytes = no error (so a cudaMemsetAsync resets it).
//   seq      number of the first call that found bad data (claimed with atomicCAS from 0)
//   op, cols, limit   written once, by the thread whose claim succeeded: the op, the row length
//            used to print a position as [b, t] (0: print the flat row), the valid range [0, limit)
//   inv_key  ~((row << 32) | uint32(value)), raised with atomicMax by every offender of that call:
//            its complement is the lowest offending row and the value found there.
struct ErrorRecord {
  unsigned int seq;
  unsigned int op;
  unsigned long long inv_key;
  long long cols;
  long long limit;
};

// What a checking kernel needs to report into the record.
struct ErrorSink {
  ErrorRecord* record;
  unsigned int seq;  // this call's number, never 0
  CheckedOp op;
  long long cols;
};

// ---- embedding (embedding.cu) ------------------------------------------------------------------

// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]; wte [V,C], wpe [>= T, C], all of type a.
void embedding_forward(DType a, void* out, const int32_t* tokens, const void* wte, const void* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t V, ErrorSink err,
                       cudaStream_t stream);

// Workspace bytes embedding_backward needs for N = B * T tokens and vocabulary V. A pure
// function of (N, V), computed on the host.
size_t embedding_backward_workspace(int64_t N, int64_t V);
// dwte[tokens[b,t], :] += dout[b,t,:] (dwte of type g_wte, [V,C]);
// dwpe[t, :] += sum_b dout[b,t,:] (dwpe of type g_wpe, rows t < T). N = B * T < 2^31.
void embedding_backward(DType a, DType g_wte, DType g_wpe, void* dwte, void* dwpe, const void* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t V,
                        ErrorSink err, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream);

// The vocabulary shard [v0, v0 + Vs) of V (ops.hpp, "Vocabulary-parallel ends"): wte [Vs,C];
// tokens are checked against V; wpe / dwpe may be null (no position term).
void embedding_forward_shard(DType a, void* out, const int32_t* tokens, const void* wte,
                             const void* wpe, int64_t B, int64_t T, int64_t C, int64_t v0,
                             int64_t Vs, int64_t V, ErrorSink err, cudaStream_t stream);
// Workspace: embedding_backward_workspace(N, V).
void embedding_backward_shard(DType a, DType g_wte, DType g_wpe, void* dwte, void* dwpe,
                              const void* dout, const int32_t* tokens, int64_t B, int64_t T,
                              int64_t C, int64_t v0, int64_t Vs, int64_t V, ErrorSink err,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- layernorm (layernorm.cu) ------------------------------------------------------------------

// y = (x - mean) * rstd * w + b over rows of C; mean, rstd fp32 [rows]. y may alias x.
void layernorm_forward(DType a, void* y, float* mean, float* rstd, const void* x, const void* w,
                       const void* b, int64_t rows, int64_t C, cudaStream_t stream);

size_t layernorm_backward_workspace(int64_t rows, int64_t C);
// dx overwritten (may alias dy); dw (type g_w), db (type g_b) +=.
void layernorm_backward(DType a, DType g_w, DType g_b, void* dx, void* dw, void* db, const void* dy,
                        const void* x, const void* w, const float* mean, const float* rstd,
                        int64_t rows, int64_t C, void* workspace, size_t workspace_bytes,
                        cudaStream_t stream);

// ---- column sums and gradient accumulation (reduce.cu) ------------------------------------------

size_t column_sums_workspace(int64_t rows, int64_t cols);
// grad[c] += sum over r of x[r, c] (x [rows, cols] of type a, grad of type g).
void add_column_sums(DType a, DType g, void* grad, const void* x, int64_t rows, int64_t cols,
                     void* workspace, size_t workspace_bytes, cudaStream_t stream);

// grad[i] = round_g(grad[i] + contribution[i]) for n elements: "+=" into a gradient of type g
// from an fp32 contribution, one rounding.
void add_f32(DType g, void* grad, const float* contribution, size_t n, cudaStream_t stream);

// ---- elementwise (elementwise.cu) --------------------------------------------------------------

// y[r, c] = b[c] for r < rows (the bias a GEMM then adds to with beta = 1).
void fill_rows(DType a, void* y, const void* b, int64_t rows, int64_t cols, cudaStream_t stream);
void gelu_forward(DType a, void* y, const void* x, size_t n, cudaStream_t stream);
void gelu_backward(DType a, void* dx, const void* dy, const void* x, size_t n, cudaStream_t stream);
void add(DType a, void* out, const void* x, const void* y, size_t n, cudaStream_t stream);
void accumulate(DType a, void* acc, const void* x, size_t n, cudaStream_t stream);

// ---- attention softmax (attention.cu) ----------------------------------------------------------

// For `matrices` consecutive [T, T] score matrices (fp32, already scaled): probs = causal
// softmax of each row i over j <= i, 0 for j > i; probs of type a.
void causal_softmax_forward(DType a, void* probs, const float* scores, int64_t matrices, int64_t T,
                            cudaStream_t stream);
// dscores[i,j] = probs[i,j] * (dprobs[i,j] - dot_i) for j <= i, 0 above, with
// dot_i = sum_k probs[i,k] dprobs[i,k] / sum_k probs[i,k] (the divisor is 1 for exact
// probabilities; it removes the error of 16-bit probs not summing to 1). dscores and probs of
// type a, dprobs fp32.
void causal_softmax_backward(DType a, void* dscores, const void* probs, const float* dprobs,
                             int64_t matrices, int64_t T, cudaStream_t stream);

// ---- cross-entropy (cross_entropy.cu) ----------------------------------------------------------

// losses[r] = logsumexp(logits[r, :]) - logits[r, target] (0 where target == -1), fp32;
// loss[0] = mean of losses over the rows whose target is not -1 (0 if none), on the device.
void cross_entropy_forward(DType a, float* loss, float* losses, const void* logits,
                           const int32_t* targets, int64_t N, int64_t V, ErrorSink err,
                           cudaStream_t stream);

size_t cross_entropy_backward_workspace();
// dlogits = scale * (softmax(logits) - onehot(target)) / (rows whose target is not -1); rows
// with target -1 get 0. dlogits may alias logits.
void cross_entropy_backward(DType a, void* dlogits, const void* logits, const int32_t* targets,
                            float scale, int64_t N, int64_t V, ErrorSink err, void* workspace,
                            size_t workspace_bytes, cudaStream_t stream);

// ---- vocabulary-parallel cross-entropy (cross_entropy_shard.cu; ops.hpp documents the phases) -
// logits [N,Vs] are columns [v0, v0 + Vs) of V; rowmax [N], sums [2,N], losses [N], loss [1] fp32.

void cross_entropy_shard_max(DType a, float* rowmax, const void* logits, int64_t N, int64_t Vs,
                             cudaStream_t stream);
void cross_entropy_shard_sums(DType a, float* sums, const void* logits, const float* rowmax,
                              const int32_t* targets, int64_t N, int64_t v0, int64_t Vs, int64_t V,
                              ErrorSink err, cudaStream_t stream);
void cross_entropy_shard_loss(float* loss, float* losses, const float* rowmax, const float* sums,
                              const int32_t* targets, int64_t N, cudaStream_t stream);
// Workspace: cross_entropy_backward_workspace().
void cross_entropy_shard_backward(DType a, void* dlogits, const void* logits, const float* rowmax,
                                  const float* sums, const int32_t* targets, float scale,
                                  int64_t N, int64_t v0, int64_t Vs, int64_t V, ErrorSink err,
                                  void* workspace, size_t workspace_bytes, cudaStream_t stream);

}  // namespace zero::models::kernels
