// The cuda backend of models/ops.hpp: cuBLAS for the matrix products, models/cuda/*.cu for the
// rest (kernels.hpp states the type rules and the determinism of each kernel).
//
// Streams: everything (kernels, cuBLAS, copies, memsets) goes to the Ops' stream; the cuBLAS
// handle is bound to it once. Nothing here synchronises except check_errors() (the one allowed
// wait, at the caller's step boundary) and the rare growth of the scratch workspace, which must
// wait for the work that may still read the old one before freeing it.
//
// Memory: a cuBLAS workspace (kBlasWorkspace, given to the handle so cuBLAS allocates nothing
// of its own), a scratch workspace that only grows (to the largest request seen, rounded up),
// and a 32-byte error record with its pinned host mirror. All through Device::allocate, so they
// are in the ledger under "other".
//
// GEMMs: cublasGemmEx / cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F (fp32 accumulation;
// fp32 inputs are never rounded to TF32) and reduced-precision split-K reductions disallowed.
// cuBLAS is column-major: a row-major [r, c] matrix is a column-major c x r one, so row-major
// Y = X W is computed as the column-major Y^T = W^T X^T (the operands swap, each comment below
// gives the row-major product). For the same shapes and the same GPU, cuBLAS gives the same bits
// on every run (its default, atomics-free mode).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "models/cuda/kernels.hpp"
#include "models/ops.hpp"
#include "core/cuda/checks.hpp"
#include "core/cuda/outside_ledger.hpp"
#include "core/cuda/stream.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace zero::models {

namespace {

namespace k = kernels;

// cuBLAS's recommended workspace for Hopper is 32 MiB (smaller GPUs need less).
constexpr size_t kBlasWorkspace = size_t(32) << 20;

DType dtype_of(ScalarType t) {
  const std::optional<DType> d = to_dtype(t);
  ZERO_REQUIRE(d.has_value(), "cuda ops: " + std::string(to_string(t)) +
                                  " is not a float type of the cuda backend");
  return *d;
}

cudaDataType blas_type(ScalarType t) {
  switch (t) {
    case ScalarType::f32: return CUDA_R_32F;
    case ScalarType::f16: return CUDA_R_16F;
    case ScalarType::bf16: return CUDA_R_16BF;
    default: break;
  }
  ZERO_FAIL("cuda ops: no cuBLAS type for " + std::string(to_string(t)));
}

// Parameters have the activation type on cuda (no per-call conversion of the weights).
void require_param(const char* op, const char* name, const Tensor& t, ScalarType a) {
  if (t.type() != a)
    ZERO_FAIL(std::string(op) + ": " + name + " is " + t.describe() + " but the activations are " +
              std::string(to_string(a)) +
              ": the cuda backend keeps parameters in the activation type");
}
// Gradients are fp32 or the activation type.
void require_grad(const char* op, const char* name, const Tensor& t, ScalarType a) {
  if (t.type() != ScalarType::f32 && t.type() != a)
    ZERO_FAIL(std::string(op) + ": " + name + " is " + t.describe() +
              ", expected fp32 or the activation type " + std::string(to_string(a)));
}

int to_int(int64_t v, const char* op, const char* what) {
  if (v < 0 || v > INT_MAX)
    ZERO_FAIL(std::string(op) + ": " + what + " = " + std::to_string(v) +
              " does not fit cuBLAS's 32-bit sizes");
  return int(v);
}

// One operand of a GEMM: pointer, type, leading dimension and (batched) stride, in elements.
struct Operand {
  const void* p;
  ScalarType type;
  int64_t ld;
  int64_t stride = 0;
};

const void* offset(const void* p, ScalarType t, int64_t elements) {
  return static_cast<const char*>(p) + elements * int64_t(size_of(t));
}
void* offset(void* p, ScalarType t, int64_t elements) {
  return static_cast<char*>(p) + elements * int64_t(size_of(t));
}

class CudaOps final : public Ops {
 public:
  CudaOps(Device& device, Stream& stream) : Ops(device, stream), cs_(cuda::native(stream)) {
    ZERO_CHECK_CUDA(cudaSetDevice(device.index()));
    // The handle's own device memory is outside the ledger: the device's capacity shrinks by it.
    // (The GEMMs' workspace is ours, below, through the ledger.)
    cuda::count_outside_ledger(device, "cuBLAS handle",
                               [&] { ZERO_CHECK_CUBLAS(cublasCreate(&blas_)); });
    try {
      ZERO_CHECK_CUBLAS(cublasSetStream(blas_, cs_));
      // Default math: no TF32 for fp32 inputs, and 16-bit outputs keep fp32 split-K reductions.
      ZERO_CHECK_CUBLAS(cublasSetMathMode(
          blas_,
          cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
      ZERO_CHECK_CUBLAS(cublasSetPointerMode(blas_, CUBLAS_POINTER_MODE_HOST));
      blas_workspace_ = device.allocate(kBlasWorkspace, MemCategory::other);
      ZERO_CHECK_CUBLAS(cublasSetWorkspace(blas_, blas_workspace_.data(), blas_workspace_.bytes()));
      errors_ = device.allocate(sizeof(k::ErrorRecord), MemCategory::other);
      errors_host_ = device.allocate_host(sizeof(k::ErrorRecord), MemCategory::pinned_host);
      ZERO_CHECK_CUDA(cudaMemsetAsync(errors_.data(), 0, sizeof(k::ErrorRecord), cs_));
    } catch (...) {
      (void)cublasDestroy(blas_);
      throw;
    }
  }

  ~CudaOps() override {
    // The workspaces may still be in use by enqueued work; the Buffers free them after this.
    const cudaError_t rc = cudaStreamSynchronize(cs_);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      log::error(std::string("cuda ops: waiting for the stream at destruction failed: ") +
                 cudaGetErrorString(rc));
    }
    if (cublasDestroy(blas_) != CUBLAS_STATUS_SUCCESS) log::error("cuda ops: cublasDestroy failed");
  }

 private:
  // ---- helpers ------------------------------------------------------------------------------

  // The scratch workspace, at least `bytes`; valid until the next call (carve it for several
  // pieces). A growth frees the previous buffer after waiting for the stream, whose enqueued
  // work may still use it: rare, as the buffer only grows, to a power of two.
  void* scratch(size_t bytes) {
    if (bytes <= scratch_.bytes()) return scratch_.data();
    if (scratch_) {
      ZERO_CHECK_CUDA(cudaStreamSynchronize(cs_));
      scratch_.reset();
    }
    // Round up to a power of two (at least 1 MiB) so a slowly growing need regrows rarely.
    size_t grown = size_t(1) << 20;
    while (grown < bytes) grown *= 2;
    scratch_ = device().allocate(grown, MemCategory::other);
    return scratch_.data();
  }

  k::ErrorSink sink(k::CheckedOp op, int64_t cols) {
    const unsigned seq = next_seq_++;
    if (next_seq_ == 0) next_seq_ = 1;
    return k::ErrorSink{errors_.as<k::ErrorRecord>(), seq, op, cols};
  }

  // C = alpha op(A) op(B) + beta C, column-major, `batch` products with the operands' strides.
  void gemm(const char* op, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
            int64_t kk, float alpha, const Operand& A, const Operand& B, float beta, void* C,
            ScalarType c_type, int64_t ldc, int64_t stride_c = 0, int64_t batch = 1) {
    if (m == 0 || n == 0 || batch == 0) return;
    const int im = to_int(m, op, "m"), in = to_int(n, op, "n"), ik = to_int(kk, op, "k");
    const int lda = to_int(A.ld, op, "lda"), ldb = to_int(B.ld, op, "ldb"),
              ldcc = to_int(ldc, op, "ldc");
    if (batch == 1) {
      ZERO_CHECK_CUBLAS(cublasGemmEx(blas_, ta, tb, im, in, ik, &alpha, A.p, blas_type(A.type), lda,
                                     B.p, blas_type(B.type), ldb, &beta, C, blas_type(c_type), ldcc,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
      ZERO_CHECK_CUBLAS(cublasGemmStridedBatchedEx(
          blas_, ta, tb, im, in, ik, &alpha, A.p, blas_type(A.type), lda, A.stride, B.p,
          blas_type(B.type), ldb, B.stride, &beta, C, blas_type(c_type), ldcc, stride_c,
          to_int(batch, op, "batch"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }

  // grad += op(A) op(B), grad column-major m x n with leading dimension m. An fp32 gradient
  // takes the product directly (beta = 1). A 16-bit gradient gets it through an fp32 workspace
  // and add_f32 (one rounding), in chunks of columns so the workspace stays within kChunkBytes.
  void gemm_into_grad(const char* op, const Tensor& grad, cublasOperation_t ta,
                      cublasOperation_t tb, int64_t m, int64_t n, int64_t kk, const Operand& A,
                      const Operand& B) {
    if (m == 0 || n == 0) return;
    if (grad.type() == ScalarType::f32) {
      gemm(op, ta, tb, m, n, kk, 1.0f, A, B, 1.0f, grad.data(), ScalarType::f32, m);
      return;
    }
    const int64_t cols =
        std::clamp<int64_t>(int64_t(k::kChunkBytes / (size_t(m) * sizeof(float))), 1, n);
    float* contribution = static_cast<float*>(scratch(size_t(m * cols) * sizeof(float)));
    for (int64_t j0 = 0; j0 < n; j0 += cols) {
      const int64_t nc = std::min(cols, n - j0);
      // Column j of op(B) starts j * ldb elements in (no transpose) or j elements in (transpose).
      Operand Bj = B;
      Bj.p = offset(B.p, B.type, tb == CUBLAS_OP_N ? j0 * B.ld : j0);
      gemm(op, ta, tb, m, nc, kk, 1.0f, A, Bj, 0.0f, contribution, ScalarType::f32, m);
      k::add_f32(dtype_of(grad.type()), offset(grad.data(), grad.type(), j0 * m), contribution,
                 size_t(m * nc), cs_);
    }
  }

  // ---- embedding ----------------------------------------------------------------------------

  void do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                            const Tensor& wpe) override {
    const ScalarType a = out.type();
    require_param("embedding_forward", "wte", wte, a);
    require_param("embedding_forward", "wpe", wpe, a);
    const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
    const int64_t V = wte.shape()[0], C = wte.shape()[1];
    if (B * T == 0) return;
    ZERO_REQUIRE(V > 0, "embedding_forward: wte has no rows, so no token id is valid");
    k::embedding_forward(dtype_of(a), out.data(), tokens.data_as<int32_t>(), wte.data(), wpe.data(),
                         B, T, C, V, sink(k::CheckedOp::embedding_forward, T), cs_);
  }

  void do_embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                             const Tensor& tokens) override {
    const ScalarType a = dout.type();
    require_grad("embedding_backward", "dwte", dwte, a);
    require_grad("embedding_backward", "dwpe", dwpe, a);
    const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
    const int64_t V = dwte.shape()[0], C = dwte.shape()[1];
    if (B * T == 0) return;
    ZERO_REQUIRE(V > 0, "embedding_backward: dwte has no rows, so no token id is valid");
    const size_t bytes = k::embedding_backward_workspace(B * T, V);
    k::embedding_backward(dtype_of(a), dtype_of(dwte.type()), dtype_of(dwpe.type()), dwte.data(),
                          dwpe.data(), dout.data(), tokens.data_as<int32_t>(), B, T, C, V,
                          sink(k::CheckedOp::embedding_backward, T), scratch(bytes), bytes, cs_);
  }

  // ---- layernorm ----------------------------------------------------------------------------

  void do_layernorm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd,
                            const Tensor& x, const Tensor& w, const Tensor& b) override {
    const ScalarType a = x.type();
    require_param("layernorm_forward", "w", w, a);
    require_param("layernorm_forward", "b", b, a);
    k::layernorm_forward(dtype_of(a), y.data(), mean.data_as<float>(), rstd.data_as<float>(),
                         x.data(), w.data(), b.data(), x.shape().rows(), x.shape().back(), cs_);
  }

  void do_layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                             const Tensor& x, const Tensor& w, const Tensor& mean,
                             const Tensor& rstd) override {
    const ScalarType a = x.type();
    require_param("layernorm_backward", "w", w, a);
    require_grad("layernorm_backward", "dw", dw, a);
    require_grad("layernorm_backward", "db", db, a);
    const int64_t rows = x.shape().rows(), C = x.shape().back();
    const size_t bytes = k::layernorm_backward_workspace(rows, C);
    k::layernorm_backward(dtype_of(a), dtype_of(dw.type()), dtype_of(db.type()), dx.data(),
                          dw.data(), db.data(), dy.data(), x.data(), w.data(),
                          mean.data_as<float>(), rstd.data_as<float>(), rows, C, scratch(bytes),
                          bytes, cs_);
  }

  // ---- linear (Conv1D layout: w [C, OC]) ----------------------------------------------------

  void do_linear_forward(const Tensor& y, const Tensor& x, const Tensor& w,
                         const Tensor& b) override {
    const ScalarType a = x.type();
    require_param("linear_forward", "w", w, a);
    if (b) require_param("linear_forward", "b", b, a);
    const int64_t N = x.shape().rows(), C = x.shape().back(), OC = w.shape()[1];
    if (N == 0 || OC == 0) return;
    float beta = 0.0f;
    if (b) {  // y = b broadcast, then the product adds to it: y = x w + b, rounded once
      k::fill_rows(dtype_of(a), y.data(), b.data(), N, OC, cs_);
      beta = 1.0f;
    }
    // y[N, OC] = x[N, C] w[C, OC]
    gemm("linear_forward", CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, 1.0f, {w.data(), a, OC},
         {x.data(), a, C}, beta, y.data(), a, OC);
  }

  // linear_backward is these two in this order (ops.cpp), so a split backward gets its bits.
  void do_linear_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w) override {
    const ScalarType a = dx.type();
    require_param("linear_backward", "w", w, a);
    const int64_t N = dx.shape().rows(), C = dx.shape().back(), OC = w.shape()[1];
    // dx[N, C] = dy[N, OC] w[C, OC]^T
    gemm("linear_backward", CUBLAS_OP_T, CUBLAS_OP_N, C, N, OC, 1.0f, {w.data(), a, OC},
         {dy.data(), a, OC}, 0.0f, dx.data(), a, C);
  }

  void do_linear_backward_weight(const Tensor& dw, const Tensor& db, const Tensor& dy,
                                 const Tensor& x) override {
    const ScalarType a = x.type();
    require_grad("linear_backward", "dw", dw, a);
    if (db) require_grad("linear_backward", "db", db, a);
    const int64_t N = x.shape().rows(), C = x.shape().back(), OC = dw.shape()[1];
    // dw[C, OC] += x[N, C]^T dy[N, OC]
    gemm_into_grad("linear_backward", dw, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, N, {dy.data(), a, OC},
                   {x.data(), a, C});
    // db[OC] += column sums of dy
    if (db) {
      const size_t bytes = k::column_sums_workspace(N, OC);
      k::add_column_sums(dtype_of(a), dtype_of(db.type()), db.data(), dy.data(), N, OC,
                         scratch(bytes), bytes, cs_);
    }
  }

  // ---- tied LM head (w [V, C]) --------------------------------------------------------------

  void do_linear_t_forward(const Tensor& y, const Tensor& x, const Tensor& w) override {
    const ScalarType a = x.type();
    require_param("linear_t_forward", "w", w, a);
    const int64_t N = x.shape().rows(), C = x.shape().back(), V = w.shape()[0];
    // y[N, V] = x[N, C] w[V, C]^T
    gemm("linear_t_forward", CUBLAS_OP_T, CUBLAS_OP_N, V, N, C, 1.0f, {w.data(), a, C},
         {x.data(), a, C}, 0.0f, y.data(), a, V);
  }

  void do_linear_t_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w) override {
    const ScalarType a = dx.type();
    require_param("linear_t_backward", "w", w, a);
    const int64_t N = dx.shape().rows(), C = dx.shape().back(), V = w.shape()[0];
    // dx[N, C] = dy[N, V] w[V, C]
    gemm("linear_t_backward", CUBLAS_OP_N, CUBLAS_OP_N, C, N, V, 1.0f, {w.data(), a, C},
         {dy.data(), a, V}, 0.0f, dx.data(), a, C);
  }

  void do_linear_t_backward_weight(const Tensor& dw, const Tensor& dy, const Tensor& x) override {
    const ScalarType a = x.type();
    require_grad("linear_t_backward", "dw", dw, a);
    const int64_t N = x.shape().rows(), C = x.shape().back(), V = dw.shape()[0];
    // dw[V, C] += dy[N, V]^T x[N, C]
    gemm_into_grad("linear_t_backward", dw, CUBLAS_OP_N, CUBLAS_OP_T, C, V, N, {x.data(), a, C},
                   {dy.data(), a, V});
  }

  // ---- elementwise --------------------------------------------------------------------------

  void do_gelu_forward(const Tensor& y, const Tensor& x) override {
    k::gelu_forward(dtype_of(x.type()), y.data(), x.data(), size_t(x.numel()), cs_);
  }
  void do_gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) override {
    k::gelu_backward(dtype_of(x.type()), dx.data(), dy.data(), x.data(), size_t(x.numel()), cs_);
  }
  void do_add(const Tensor& out, const Tensor& a, const Tensor& b) override {
    k::add(dtype_of(a.type()), out.data(), a.data(), b.data(), size_t(a.numel()), cs_);
  }
  void do_accumulate(const Tensor& acc, const Tensor& x) override {
    k::accumulate(dtype_of(x.type()), acc.data(), x.data(), size_t(x.numel()), cs_);
  }

  // ---- attention ----------------------------------------------------------------------------
  //
  // Per batch row b and group of heads (as many as fit kChunkBytes of fp32 scores, at least
  // one), with strided-batched GEMMs over the heads of the group (head h's q, k, v are columns
  // h*hs.. of the qkv row, so consecutive heads are hs elements apart, rows 3C apart):
  //   forward   S = scale q k^T (fp32) -> probs = causal softmax(S) (type A) -> out = probs v
  //   backward  dP = dout v^T (fp32) -> dS = probs * (dP - rowsum(probs * dP)) (type A)
  //             dv = probs^T dout, dq = scale dS k, dk = scale dS^T q
  // The full T x T products are computed and the causal mask applied by the softmax (probs and
  // dS are exactly 0 above the diagonal, so the masked half adds nothing).

  struct AttentionDims {
    int64_t B, T, C, C3, NH, hs, heads_per_chunk;
    float scale;
  };

  static AttentionDims attention_dims(const Tensor& qkv, int n_head, size_t bytes_per_head) {
    AttentionDims d{};
    d.B = qkv.shape()[0];
    d.T = qkv.shape()[1];
    d.C3 = qkv.shape()[2];
    d.C = d.C3 / 3;
    d.NH = n_head;
    d.hs = d.C / n_head;
    d.scale = 1.0f / std::sqrt(float(d.hs));
    const size_t per_head = std::max<size_t>(1, bytes_per_head);
    d.heads_per_chunk = std::clamp<int64_t>(int64_t(k::kChunkBytes / per_head), 1, d.NH);
    return d;
  }

  void do_attention_forward(const Tensor& out, const Tensor& probs, const Tensor& qkv,
                            int n_head) override {
    const ScalarType a = qkv.type();
    const char* op = "attention_forward";
    const size_t tt = size_t(qkv.shape()[1]) * size_t(qkv.shape()[1]);
    const AttentionDims d = attention_dims(qkv, n_head, tt * sizeof(float));
    if (d.B * d.T == 0) return;
    const int64_t TT = d.T * d.T;
    float* scores = static_cast<float*>(scratch(size_t(d.heads_per_chunk) * tt * sizeof(float)));
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t h0 = 0; h0 < d.NH; h0 += d.heads_per_chunk) {
        const int64_t nh = std::min(d.heads_per_chunk, d.NH - h0);
        const void* q = offset(qkv.data(), a, b * d.T * d.C3 + h0 * d.hs);
        const void* kp = offset(q, a, d.C);
        const void* v = offset(q, a, 2 * d.C);
        void* p = offset(probs.data(), a, (b * d.NH + h0) * TT);
        // S[i, j] = scale q_i . k_j, one [T, T] fp32 matrix per head
        gemm(op, CUBLAS_OP_T, CUBLAS_OP_N, d.T, d.T, d.hs, d.scale, {kp, a, d.C3, d.hs},
             {q, a, d.C3, d.hs}, 0.0f, scores, ScalarType::f32, d.T, TT, nh);
        k::causal_softmax_forward(dtype_of(a), p, scores, nh, d.T, cs_);
        // out[i, h*hs + e] = sum_j probs[i, j] v_j[e]
        gemm(op, CUBLAS_OP_N, CUBLAS_OP_N, d.hs, d.T, d.T, 1.0f, {v, a, d.C3, d.hs},
             {p, a, d.T, TT}, 0.0f, offset(out.data(), a, b * d.T * d.C + h0 * d.hs), a, d.C, d.hs,
             nh);
      }
    }
  }

  void do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                             const Tensor& probs, int n_head) override {
    const ScalarType a = qkv.type();
    const char* op = "attention_backward";
    const size_t tt = size_t(qkv.shape()[1]) * size_t(qkv.shape()[1]);
    // Per head: dP in fp32 and dS in type A, each carved at an aligned offset.
    const AttentionDims d = attention_dims(qkv, n_head, tt * (sizeof(float) + size_of(a)));
    if (d.B * d.T == 0) return;
    const int64_t TT = d.T * d.T;
    const size_t dp_bytes = k::align_up(size_t(d.heads_per_chunk) * tt * sizeof(float));
    const size_t ds_bytes = k::align_up(size_t(d.heads_per_chunk) * tt * size_of(a));
    char* base = static_cast<char*>(scratch(dp_bytes + ds_bytes));
    float* dp = reinterpret_cast<float*>(base);
    void* ds = base + dp_bytes;
    for (int64_t b = 0; b < d.B; ++b) {
      for (int64_t h0 = 0; h0 < d.NH; h0 += d.heads_per_chunk) {
        const int64_t nh = std::min(d.heads_per_chunk, d.NH - h0);
        const int64_t qkv_off = b * d.T * d.C3 + h0 * d.hs;
        const void* q = offset(qkv.data(), a, qkv_off);
        const void* kp = offset(q, a, d.C);
        const void* v = offset(q, a, 2 * d.C);
        void* dq = offset(dqkv.data(), a, qkv_off);
        void* dk = offset(dq, a, d.C);
        void* dv = offset(dq, a, 2 * d.C);
        const void* dO = offset(dout.data(), a, b * d.T * d.C + h0 * d.hs);
        const void* p = offset(probs.data(), a, (b * d.NH + h0) * TT);
        // dP[i, j] = dout_i . v_j
        gemm(op, CUBLAS_OP_T, CUBLAS_OP_N, d.T, d.T, d.hs, 1.0f, {v, a, d.C3, d.hs},
             {dO, a, d.C, d.hs}, 0.0f, dp, ScalarType::f32, d.T, TT, nh);
        k::causal_softmax_backward(dtype_of(a), ds, p, dp, nh, d.T, cs_);
        // dv_j = sum_i probs[i, j] dout_i
        gemm(op, CUBLAS_OP_N, CUBLAS_OP_T, d.hs, d.T, d.T, 1.0f, {dO, a, d.C, d.hs},
             {p, a, d.T, TT}, 0.0f, dv, a, d.C3, d.hs, nh);
        // dq_i = scale sum_j dS[i, j] k_j
        gemm(op, CUBLAS_OP_N, CUBLAS_OP_N, d.hs, d.T, d.T, d.scale, {kp, a, d.C3, d.hs},
             {ds, a, d.T, TT}, 0.0f, dq, a, d.C3, d.hs, nh);
        // dk_j = scale sum_i dS[i, j] q_i
        gemm(op, CUBLAS_OP_N, CUBLAS_OP_T, d.hs, d.T, d.T, d.scale, {q, a, d.C3, d.hs},
             {ds, a, d.T, TT}, 0.0f, dk, a, d.C3, d.hs, nh);
      }
    }
  }

  // ---- cross-entropy ------------------------------------------------------------------------

  static void check_rows(const char* op, int64_t N, int64_t V) {
    // The device counts the rows that count in fp32, exact up to 2^24.
    ZERO_REQUIRE(N <= (int64_t(1) << 24),
                 std::string(op) + ": " + std::to_string(N) +
                     " rows in one call; the cuda kernels take at most 2^24");
    ZERO_REQUIRE(N == 0 || V > 0,
                 std::string(op) + ": logits have no columns, so no target is valid");
  }

  void do_cross_entropy_forward(const Tensor& loss, const Tensor& losses, const Tensor& logits,
                                const Tensor& targets) override {
    const int64_t N = logits.shape().rows(), V = logits.shape().back();
    check_rows("cross_entropy_forward", N, V);
    k::cross_entropy_forward(dtype_of(logits.type()), loss.data_as<float>(),
                             losses.data_as<float>(), logits.data(), targets.data_as<int32_t>(), N,
                             V, sink(k::CheckedOp::cross_entropy_forward, 0), cs_);
  }

  void do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                                 float scale) override {
    const int64_t N = logits.shape().rows(), V = logits.shape().back();
    check_rows("cross_entropy_backward", N, V);
    if (N == 0) return;
    const size_t bytes = k::cross_entropy_backward_workspace();
    k::cross_entropy_backward(
        dtype_of(logits.type()), dlogits.data(), logits.data(), targets.data_as<int32_t>(), scale,
        N, V, sink(k::CheckedOp::cross_entropy_backward, 0), scratch(bytes), bytes, cs_);
  }

  // ---- vocabulary-parallel ends --------------------------------------------------------------
  // Bad ids are reported under the whole ops' names (embedding_forward, cross_entropy_forward,
  // ...): the same check against the whole vocabulary.

  void do_embedding_forward_shard(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                  const Tensor& wpe, int64_t v0, int64_t V) override {
    const ScalarType a = out.type();
    require_param("embedding_forward_shard", "wte", wte, a);
    if (wpe) require_param("embedding_forward_shard", "wpe", wpe, a);
    const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
    k::embedding_forward_shard(dtype_of(a), out.data(), tokens.data_as<int32_t>(), wte.data(),
                               wpe ? wpe.data() : nullptr, B, T, wte.shape()[1], v0, wte.shape()[0], V,
                               sink(k::CheckedOp::embedding_forward, T), cs_);
  }

  void do_embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                   const Tensor& tokens, int64_t v0, int64_t V) override {
    const ScalarType a = dout.type();
    require_grad("embedding_backward_shard", "dwte", dwte, a);
    if (dwpe) require_grad("embedding_backward_shard", "dwpe", dwpe, a);
    const int64_t B = tokens.shape()[0], T = tokens.shape()[1];
    if (B * T == 0) return;
    const size_t bytes = k::embedding_backward_workspace(B * T, V);
    k::embedding_backward_shard(dtype_of(a), dtype_of(dwte.type()),
                                dwpe ? dtype_of(dwpe.type()) : DType::f32, dwte.data(),
                                dwpe ? dwpe.data() : nullptr, dout.data(), tokens.data_as<int32_t>(),
                                B, T, dwte.shape()[1], v0, dwte.shape()[0], V,
                                sink(k::CheckedOp::embedding_backward, T), scratch(bytes), bytes, cs_);
  }

  void do_cross_entropy_shard_max(const Tensor& rowmax, const Tensor& logits) override {
    k::cross_entropy_shard_max(dtype_of(logits.type()), rowmax.data_as<float>(), logits.data(),
                               logits.shape().rows(), logits.shape().back(), cs_);
  }

  void do_cross_entropy_shard_sums(const Tensor& sums, const Tensor& logits, const Tensor& rowmax,
                                   const Tensor& targets, int64_t v0, int64_t V) override {
    const int64_t N = logits.shape().rows(), Vs = logits.shape().back();
    check_rows("cross_entropy_shard_sums", N, Vs);
    k::cross_entropy_shard_sums(dtype_of(logits.type()), sums.data_as<float>(), logits.data(),
                                rowmax.data_as<float>(), targets.data_as<int32_t>(), N, v0, Vs, V,
                                sink(k::CheckedOp::cross_entropy_forward, 0), cs_);
  }

  void do_cross_entropy_shard_loss(const Tensor& loss, const Tensor& losses, const Tensor& rowmax,
                                   const Tensor& sums, const Tensor& targets) override {
    const int64_t N = targets.numel();
    check_rows("cross_entropy_shard_loss", N, 1);
    k::cross_entropy_shard_loss(loss.data_as<float>(), losses.data_as<float>(), rowmax.data_as<float>(),
                                sums.data_as<float>(), targets.data_as<int32_t>(), N, cs_);
  }

  void do_cross_entropy_shard_backward(const Tensor& dlogits, const Tensor& logits,
                                       const Tensor& rowmax, const Tensor& sums,
                                       const Tensor& targets, int64_t v0, int64_t V,
                                       float scale) override {
    const int64_t N = logits.shape().rows(), Vs = logits.shape().back();
    check_rows("cross_entropy_shard_backward", N, Vs);
    if (N == 0) return;
    const size_t bytes = k::cross_entropy_backward_workspace();
    k::cross_entropy_shard_backward(dtype_of(logits.type()), dlogits.data(), logits.data(),
                                    rowmax.data_as<float>(), sums.data_as<float>(),
                                    targets.data_as<int32_t>(), scale, N, v0, Vs, V,
                                    sink(k::CheckedOp::cross_entropy_backward, 0), scratch(bytes),
                                    bytes, cs_);
  }

  // ---- the rest -----------------------------------------------------------------------------

  void do_zero(const Tensor& t) override {
    if (t.bytes() == 0) return;
    ZERO_CHECK_CUDA(cudaMemsetAsync(t.data(), 0, t.bytes(), cs_));
  }

  void do_check_errors() override {
    ZERO_CHECK_CUDA(cudaMemcpyAsync(errors_host_.data(), errors_.data(), sizeof(k::ErrorRecord),
                                    cudaMemcpyDeviceToHost, cs_));
    stream().synchronize();  // the one wait of this backend, at the caller's step boundary
    const k::ErrorRecord r = *errors_host_.as<k::ErrorRecord>();
    next_seq_ = 1;  // the stream is idle: no launch still carries an old number
    if (r.seq == 0) return;
    ZERO_CHECK_CUDA(cudaMemsetAsync(errors_.data(), 0, sizeof(k::ErrorRecord), cs_));
    ZERO_FAIL(describe(r));
  }

  static std::string describe(const k::ErrorRecord& r) {
    const unsigned long long key = ~r.inv_key;
    const int64_t row = int64_t(key >> 32);
    const int32_t value = int32_t(uint32_t(key & 0xffffffffu));
    const std::string at = r.cols > 0 ? "[b=" + std::to_string(row / r.cols) +
                                            ", t=" + std::to_string(row % r.cols) + "]"
                                      : "row " + std::to_string(row);
    const std::string range = "[0, " + std::to_string(r.limit) + ")";
    switch (k::CheckedOp(r.op)) {
      case k::CheckedOp::embedding_forward:
      case k::CheckedOp::embedding_backward:
        return std::string(k::CheckedOp(r.op) == k::CheckedOp::embedding_forward
                               ? "embedding_forward"
                               : "embedding_backward") +
               ": token id " + std::to_string(value) + " at " + at + " is outside the vocabulary " +
               range + " (it was clamped into range: check the data and the vocabulary size)";
      case k::CheckedOp::cross_entropy_forward:
      case k::CheckedOp::cross_entropy_backward:
        return std::string(k::CheckedOp(r.op) == k::CheckedOp::cross_entropy_forward
                               ? "cross_entropy_forward"
                               : "cross_entropy_backward") +
               ": target " + std::to_string(value) + " at " + at + " is outside the vocabulary " +
               range +
               " (-1 marks a row to ignore; it was clamped into range: check the data "
               "and the vocabulary size)";
      case k::CheckedOp::none: break;
    }
    return "cuda ops: an op found bad data (unknown op code " + std::to_string(r.op) + ")";
  }

  cudaStream_t cs_;
  cublasHandle_t blas_ = nullptr;
  Buffer blas_workspace_;
  Buffer scratch_;
  Buffer errors_;       // k::ErrorRecord on the device
  Buffer errors_host_;  // its pinned mirror, read after the stream has passed the copy
  unsigned next_seq_ = 1;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(Device& device, Stream& stream) {
  ZERO_REQUIRE(device.kind() == DeviceKind::cuda,
               "make_cuda_ops: " + device.name() + " is not a cuda device");
  return std::make_unique<CudaOps>(device, stream);
}

}  // namespace zero::models
