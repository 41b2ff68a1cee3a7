// The cpu backend's model kernels: plain pointers in, synchronous, parallel with oneTBB, matrix
// products through the CPU BLAS (OpenBLAS, row-major) and oneDNN (matmul.hpp: 16-bit products). models/cpu/cpu_ops.cpp enqueues them on a
// stream behind models/ops.hpp; the gradient checks call them directly.
//
// Every kernel is a template on F, the compute type: float or double (the reference precision
// of gradient checks). Activations, their gradients, statistics and per-row losses are F.
// Activations stored in bf16 or fp16 (computed in fp32) have their own kernels, kernels16.hpp,
// built on these: the same blocks and row code on widened blocks, one rounding per stored value.
// Parameters come as Param<F> and "+=" gradients as Grad<F>: F itself (a plain F* converts), or,
// with F = float, fp16 / bf16 storage (and fp32 gradients of 16-bit parameters).
//
// 16-bit products (docs/models.md, "Matrix products on the cpu backend"): with F = float and a bf16 parameter (fp16 only where
// oneDNN has an fp16 kernel on this CPU), the linear kernels multiply in that type with fp32
// accumulation, as PyTorch's autocast does: the weight as stored, the activation or upstream
// gradient rounded once to it; the weight gradient's product is 16-bit when the gradient is
// stored 16-bit. Everything else (fp32 and fp64 parameters, attention) multiplies in F; with
// 16-bit activations (kernels16.hpp) attention's products and the weight gradients' are 16-bit
// too.
//
// Semantics (the same as ops.hpp, which documents each op):
//   - An output named dx / out / y / probs / lse is overwritten; a parameter gradient (dw, db, dwte,
//     dwpe) is "+=": the kernel computes the whole contribution in F, then adds it to each stored
//     element in F and rounds once to the storage type.
//   - Shapes: B batch, T sequence, C channels, OC output channels, V vocabulary, N rows,
//     NH heads. Row-major, contiguous.
//   - Token ids and targets are checked before anything is written: the first bad one in memory
//     order throws zero::Error naming the op, the position and the value.
//
// Determinism: for fixed shapes the results are bitwise the same whatever the number of oneTBB
// threads. Work is cut into blocks whose bounds depend only on the shapes (constants in
// kernels.cpp), never into one block per thread; a block is one sequential computation (one BLAS
// call, or a loop); sums across blocks are added in block order by one task. That leaves the
// BLAS itself, which must run with one thread per call (OPENBLAS_NUM_THREADS=1, as tests and
// launches set it), and oneDNN, which matmul.cpp keeps to one OpenMP thread per call whatever
// OMP_NUM_THREADS says: parallelism comes from oneTBB running many calls at once.
//
// Thread-safety: a kernel may run on any thread, several at once on disjoint outputs; it uses the
// calling thread plus oneTBB's arena (so tbb::global_control limits it). It allocates scratch
// per call (never per element).
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>

#include "core/tensor.hpp"

namespace zero::models::cpu {

template <class F>
concept ComputeType = std::same_as<F, float> || std::same_as<F, double>;

// A parameter as a kernel reads it: `data` holds elements of `type` (F's own type, or fp16/bf16
// when F is float). Borrowed: the memory must outlive the call.
template <ComputeType F>
class Param {
 public:
  Param(const F* data) noexcept : data_(data), type_(scalar_type_of<F>) {}  // NOLINT: implicit
  Param(const void* data, ScalarType type);  // throws zero::Error for a type F cannot read
  // Converts elements [offset, offset + n) to F into dst.
  void load(int64_t offset, F* dst, int64_t n) const;
  // The first n elements as F: data itself when the types match, else converted into scratch.
  const F* dense(int64_t n, std::unique_ptr<F[]>& scratch) const;
  const void* data() const noexcept { return data_; }
  ScalarType type() const noexcept { return type_; }

 private:
  const void* data_;
  ScalarType type_;
};

// A "+=" gradient: `data` holds elements of `type` (F's own type, or fp32/fp16/bf16 when F is
// float). Borrowed: the memory must outlive the call.
template <ComputeType F>
class Grad {
 public:
  Grad(F* data) noexcept : data_(data), type_(scalar_type_of<F>) {}  // NOLINT: implicit
  Grad(void* data, ScalarType type);  // throws zero::Error for a type F cannot accumulate into
  // Elements [offset, offset + n) += v[0, n): added in F, rounded once to the storage type.
  void add(int64_t offset, const F* v, int64_t n) const;
  // The elements as F when they are stored as F (a plain F gradient), else null.
  F* dense_data() const noexcept {
    return type_ == scalar_type_of<F> ? static_cast<F*>(data_) : nullptr;
  }
  ScalarType type() const noexcept { return type_; }

 private:
  void* data_;
  ScalarType type_;
};

// out[b,t,:] = wte[tokens[b,t], :] + wpe[t, :]. tokens [B,T] in [0, V); wte [V,C], wpe [>=T, C].
template <ComputeType F>
void embedding_forward(F* out, const int32_t* tokens, Param<F> wte, Param<F> wpe, int64_t B,
                       int64_t T, int64_t C, int64_t V);
// dwte[tokens[b,t], :] += dout[b,t,:] (each row's contributions summed in (b,t) order);
// dwpe[t,:] += sum over b of dout[b,t,:] (b in order).
template <ComputeType F>
void embedding_backward(Grad<F> dwte, Grad<F> dwpe, const F* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, int64_t V);

// Per row of x [N,C]: y = (x - mean) * rstd * w + b, rstd = 1 / sqrt(biased var + 1e-5); saves
// mean and rstd [N].
template <ComputeType F>
void layernorm_forward(F* y, F* mean, F* rstd, const F* x, Param<F> w, Param<F> b, int64_t N,
                       int64_t C);
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w (overwritten);
// dw += sum over rows of dy * xhat; db += sum over rows of dy.
template <ComputeType F>
void layernorm_backward(F* dx, Grad<F> dw, Grad<F> db, const F* dy, const F* x, Param<F> w,
                        const F* mean, const F* rstd, int64_t N, int64_t C);

// y[N,OC] = x[N,C] @ w[C,OC] + b[OC]; `has_bias` false ignores b.
template <ComputeType F>
void linear_forward(F* y, const F* x, Param<F> w, Param<F> b, bool has_bias, int64_t N, int64_t C,
                    int64_t OC);
// dx = dy @ w^T (overwritten; skipped when dx is null); dw += x^T @ dy; db += column sums of dy
// (skipped when has_bias is false).
template <ComputeType F>
void linear_backward(F* dx, Grad<F> dw, Grad<F> db, bool has_bias, const F* dy, const F* x,
                     Param<F> w, int64_t N, int64_t C, int64_t OC);
// Its two halves (linear_backward is exactly these in this order): dx = dy @ w^T; dw += x^T @ dy
// and db += column sums of dy.
template <ComputeType F>
void linear_backward_input(F* dx, const F* dy, Param<F> w, int64_t N, int64_t C, int64_t OC);
template <ComputeType F>
void linear_backward_weight(Grad<F> dw, Grad<F> db, bool has_bias, const F* dy, const F* x,
                            int64_t N, int64_t C, int64_t OC);

// y[N,V] = x[N,C] @ w[V,C]^T.
template <ComputeType F>
void linear_t_forward(F* y, const F* x, Param<F> w, int64_t N, int64_t C, int64_t V);
// dx = dy @ w (overwritten); dw += dy^T @ x.
template <ComputeType F>
void linear_t_backward(F* dx, Grad<F> dw, const F* dy, const F* x, Param<F> w, int64_t N,
                       int64_t C, int64_t V);
// Its halves: dx = dy @ w; dw += dy^T @ x.
template <ComputeType F>
void linear_t_backward_input(F* dx, const F* dy, Param<F> w, int64_t N, int64_t C, int64_t V);
template <ComputeType F>
void linear_t_backward_weight(Grad<F> dw, const F* dy, const F* x, int64_t N, int64_t C,
                              int64_t V);

// GPT-2's tanh GELU over n elements; backward is the exact derivative of that formula.
template <ComputeType F>
void gelu_forward(F* y, const F* x, int64_t n);
template <ComputeType F>
void gelu_backward(F* dx, const F* dy, const F* x, int64_t n);

// Causal self-attention. qkv [B,T,3C] (q, k, v side by side; head h uses channels
// [h*hs, (h+1)*hs) of each, hs = C/NH); out [B,T,C]; probs [B,NH,T,T] the masked softmax of
// q k^T / sqrt(hs), exactly 0 above the diagonal.
template <ComputeType F>
void attention_forward(F* out, F* probs, const F* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t NH);
// dqkv [B,T,3C] overwritten.
template <ComputeType F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* probs, int64_t B,
                        int64_t T, int64_t C, int64_t NH);

// The same attention without the probabilities (attention.cpp; FlashAttention-2's blocked
// online softmax): out [B,T,C] as above and lse [B,NH,T], each row's log sum_j exp(s_j) over
// its unmasked scaled scores s. Blocks of 64 query rows by 128 keys; memory O(T), not O(T^2).
// Rounds differently from attention_forward (a running max and sum per row, the normalisation
// applied to out, not to the probabilities).
template <ComputeType F>
void attention_forward_lse(F* out, F* lse, const F* qkv, int64_t B, int64_t T, int64_t C,
                           int64_t NH);
// dqkv [B,T,3C] overwritten, from dout, qkv and what the forward left: out and lse (each block
// of probabilities recomputed as exp(s - lse)).
template <ComputeType F>
void attention_backward_lse(F* dqkv, const F* dout, const F* qkv, const F* out, const F* lse,
                            int64_t B, int64_t T, int64_t C, int64_t NH);

// Elementwise kernels (gelu, add, accumulate) allow an output to be one of the inputs.
template <ComputeType F>
void add(F* out, const F* a, const F* b, int64_t n);
// acc may be stored in a 16-bit type (Grad): each element is added in F and rounded once.
template <ComputeType F>
void accumulate(Grad<F> acc, const F* x, int64_t n);

// Per row of logits [N,V]: losses = logsumexp(row) - row[target] (0 when target is -1). Returns
// the mean over rows with a target (0 when there are none), summed in row order in double.
template <ComputeType F>
F cross_entropy_forward(F* losses, const F* logits, const int32_t* targets, int64_t N, int64_t V);
// dlogits = scale * (softmax(row) - onehot(target)) / (rows with a target); 0 rows for -1.
template <ComputeType F>
void cross_entropy_backward(F* dlogits, const F* logits, const int32_t* targets, int64_t N,
                            int64_t V, F scale);

// ---- vocabulary-parallel ends (vocab_kernels.cpp; ops.hpp documents each) ---------------------
// A shard is vocabulary entries [v0, v0 + Vs) of V: wte rows [Vs,C], logits columns [N,Vs]. Ids
// are checked against V; ids outside the shard contribute nothing.

// out[b,t,:] = (token in the shard ? wte[token - v0, :] : 0) + wpe[t, :] (wpe null: no term).
template <ComputeType F>
void embedding_forward_shard(F* out, const int32_t* tokens, Param<F> wte, Param<F> wpe,
                             bool has_wpe, int64_t B, int64_t T, int64_t C, int64_t v0,
                             int64_t Vs, int64_t V);
// dwte[token - v0, :] += dout[b,t,:] for tokens in the shard ((b,t) order per row); dwpe as
// embedding_backward unless has_wpe is false.
template <ComputeType F>
void embedding_backward_shard(Grad<F> dwte, Grad<F> dwpe, bool has_wpe, const F* dout,
                              const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t v0,
                              int64_t Vs, int64_t V);
// rowmax[r] = max over the row of logits [N,Vs].
template <ComputeType F>
void cross_entropy_shard_max(F* rowmax, const F* logits, int64_t N, int64_t Vs);
// sums[r] = sum_j exp(logits[r,j] - rowmax[r]) (index order); sums[N + r] = the target's logit
// when the target is in the shard, else 0 (and for ignored rows).
template <ComputeType F>
void cross_entropy_shard_sums(F* sums, const F* logits, const F* rowmax, const int32_t* targets,
                              int64_t N, int64_t v0, int64_t Vs, int64_t V);
// losses[r] = rowmax[r] + log(sums[r]) - sums[N + r] (0 for ignored rows); returns the mean
// over the rows that count, in double in row order (as cross_entropy_forward).
template <ComputeType F>
F cross_entropy_shard_loss(F* losses, const F* rowmax, const F* sums, const int32_t* targets,
                           int64_t N);
// dlogits = scale * (exp(logits - rowmax) / sums[r] - onehot(target - v0)) / (rows that count).
template <ComputeType F>
void cross_entropy_shard_backward(F* dlogits, const F* logits, const F* rowmax, const F* sums,
                                  const int32_t* targets, int64_t N, int64_t v0, int64_t Vs,
                                  int64_t V, F scale);

}  // namespace zero::models::cpu
