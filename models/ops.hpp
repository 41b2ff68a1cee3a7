// The kernels a model's Units are written with, one interface for both backends, so a model
// is composed once and runs on cpu (oneTBB + the CPU BLAS) or cuda (cuBLAS + our kernels).
//
// Every op is enqueued on the Ops object's stream and returns without waiting: cpu runs it on
// the stream's worker thread (the op keeps its operand Tensors alive by holding copies until it
// has run); cuda launches kernels on the stream (the caller keeps operands alive; freeing device
// memory is ordered by the allocator). No op synchronises the device or the host.
//
// The public methods check shapes and types once, for both backends, and throw zero::Error
// naming the op and the operand; the backends implement the do_ methods on checked input.
//
// Types. "A" is the activation type of the call (the type of x / y / dy / dx):
//   cpu:  fp32, bf16 or fp16 (compute and accumulation in fp32; 16-bit A: the kernels of
//         models/cpu/kernels16.hpp, docs/cpu-kernels.md "16-bit activations"), or fp64 (the
//         reference precision of gradient checks). The probabilities attention pair is fp32 /
//         fp64 only on cpu (its models use the lse pair).
//   cuda: fp32, bf16 or fp16 (compute and accumulation in fp32).
// Parameters (w, b, wte, wpe) have their storage type: A itself, or on cpu with A other than
// fp64 any of fp32, bf16, fp16 (read as fp32; the linear layers' products are 16-bit when the
// weight is stored 16-bit, kernels.hpp). Gradient tensors (dw, db, dwte, dwpe) are fp32 or the
// parameter's type (cpu also takes any 16-bit type); "+=" means: the op computes its whole
// contribution in the compute type, adds it to the stored gradient in the compute type and
// rounds once to the gradient's type. Statistics (mean, rstd, lse, the shards' rowmax and sums)
// and per-row losses are fp32, or fp64 when A is fp64. Token ids and targets are int32; target
// -1 is ignored.
//
// Aliasing: the elementwise ops may run in place (gelu_forward y == x, gelu_backward dx == dy,
// add out == a or b); no other output may overlap an input. After an op reports bad data (a
// token or target out of range) its outputs are unspecified.
//
// Determinism: for fixed shapes every op gives bitwise the same result on every run,
// whatever the number of threads (cpu: fixed partitions, reductions in a fixed order; BLAS
// with one thread per rank, as tests and launches set it).
#pragma once

#include <memory>
#include <string>

#include "core/device.hpp"
#include "core/tensor.hpp"

namespace zero::models {

class Ops {
 public:
  virtual ~Ops() = default;
  Ops(const Ops&) = delete;
  Ops& operator=(const Ops&) = delete;

  Device& device() const noexcept { return device_; }
  Stream& stream() const noexcept { return stream_; }

  // out[B,T,C] = wte[tokens[b,t], :] + wpe[t, :]. tokens int32 [B,T], each in [0, V) (checked:
  // cpu throws on the stream, cuda clamps and raises an error flag read by check_errors());
  // wte [V,C], wpe [Tmax,C] with T <= Tmax.
  void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                         const Tensor& wpe);
  // dwte[tokens[b,t], :] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:].
  void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                          const Tensor& tokens);

  // Over the last dimension C of x [..., C]: y = (x - mean) * rstd * w + b with
  // rstd = 1 / sqrt(var + 1e-5) (biased variance, as PyTorch's LayerNorm); saves mean, rstd
  // [rows]. w, b [C].
  void layernorm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                         const Tensor& w, const Tensor& b);
  // dx = (overwritten); dw, db +=.
  void layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                          const Tensor& x, const Tensor& w, const Tensor& mean,
                          const Tensor& rstd);

  // y[N,OC] = x[N,C] @ w[C,OC] + b[OC], the Hugging Face Conv1D layout (x may be [..., C]; N is
  // its rows). b may be empty (no bias).
  void linear_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b);
  // dx = dy @ w^T (overwritten; may be empty when not needed); dw += x^T @ dy; db += column sums
  // of dy (db empty when there is no bias). Exactly linear_backward_input then
  // linear_backward_weight: the same calls, so the same bits.
  void linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                       const Tensor& x, const Tensor& w);
  // The two halves of linear_backward, for a split backward (B, then W later): dx = dy @ w^T
  // (overwritten), and dw += x^T @ dy, db += column sums of dy (db may be empty).
  void linear_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w);
  void linear_backward_weight(const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x);

  // y[N,V] = x[N,C] @ w[V,C]^T: the LM head tied to the token embedding [V,C].
  void linear_t_forward(const Tensor& y, const Tensor& x, const Tensor& w);
  // dx = dy @ w (overwritten); dw += dy^T @ x. Exactly linear_t_backward_input then
  // linear_t_backward_weight.
  void linear_t_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                         const Tensor& w);
  void linear_t_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w);
  void linear_t_backward_weight(const Tensor& dw, const Tensor& dy, const Tensor& x);

  // GPT-2's GELU, the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  void gelu_forward(const Tensor& y, const Tensor& x);
  void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);  // dx overwritten

  // Causal multi-head self-attention. qkv [B,T,3C] holds q, k, v side by side (each [C], heads
  // of C/n_head consecutive channels, as Hugging Face's c_attn output); out [B,T,C] with heads
  // concatenated; probs [B,n_head,T,T] keeps softmax(q k^T / sqrt(C/n_head)) with the causal
  // mask (entries above the diagonal are 0) for backward. probs has type A.
  void attention_forward(const Tensor& out, const Tensor& probs, const Tensor& qkv, int n_head);
  // dqkv [B,T,3C] overwritten.
  void attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                          const Tensor& probs, int n_head);

  // The same attention without the [B,n_head,T,T] probabilities (FlashAttention-2's blocked
  // online softmax; docs/cpu-kernels.md, "Attention without the T x T probabilities"), for the
  // backends where blocked_attention() is true: forward keeps lse [B,n_head,T], each row's
  // logsumexp of its masked, scaled scores (the statistics type: fp32, fp64 when A is fp64);
  // backward recomputes the probabilities block by block from qkv and lse and reads the
  // forward's out: memory O(T) per (batch, head) instead of O(T^2). It rounds differently from the
  // probabilities pair (a running max and sum per row), so a model uses one pair throughout.
  // Throws zero::Error on a backend without it.
  void attention_forward_lse(const Tensor& out, const Tensor& lse, const Tensor& qkv, int n_head);
  // dqkv [B,T,3C] overwritten; out and lse as attention_forward_lse left them.
  void attention_backward_lse(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                              const Tensor& out, const Tensor& lse, int n_head);
  // Whether this backend has the pair above (cpu: yes; cuda: no, it keeps the probabilities).
  virtual bool blocked_attention() const noexcept { return false; }

  // out = a + b, elementwise, all of type A and the same element count.
  void add(const Tensor& out, const Tensor& a, const Tensor& b);
  // acc += x, elementwise; x has type A. acc has type A, or is a gradient in a type the backend
  // stores gradients in for A: on cpu any of fp32, bf16, fp16 when A is one of them (added in
  // fp32, rounded once); on cuda acc's type is A.
  void accumulate(const Tensor& acc, const Tensor& x);

  // Cross-entropy of logits [N,V] (any leading shape; N its rows) against targets int32 [N]
  // (in [0,V), or -1 to ignore; out of range is an error as for tokens): losses [N] per row
  // (0 for ignored rows) and loss [1] = mean over the rows that count (0 if none). loss has the
  // statistics type: fp32, or fp64 when A is fp64 (finite differences need the loss in fp64).
  void cross_entropy_forward(const Tensor& loss, const Tensor& losses, const Tensor& logits,
                             const Tensor& targets);
  // dlogits = scale * (softmax(logits) - onehot(target)) / (rows that count); 0 for ignored
  // rows. dlogits overwritten, type A.
  void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                              float scale);

  // ---- Vocabulary-parallel ends (Megatron's VocabParallelEmbedding and parallel cross-entropy;
  // docs/tensor-parallel.md). A shard holds vocabulary entries [vocab_begin, vocab_begin + Vs)
  // of vocab_size: rows of wte [Vs,C], columns of logits [N,Vs]. Token ids and targets are
  // checked against vocab_size as the whole ops check them against V; an id outside the shard
  // is valid and contributes nothing here (another rank of the tensor group has it).

  // out[b,t,:] = (tokens[b,t] in the shard ? wte[tokens[b,t] - vocab_begin, :] : 0) + wpe[t,:];
  // wpe may be empty (no position term: the tensor ranks but one). With the whole vocabulary
  // and wpe it is embedding_forward.
  void embedding_forward_shard(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                               const Tensor& wpe, int64_t vocab_begin, int64_t vocab_size);
  // dwte[tokens[b,t] - vocab_begin, :] += dout[b,t,:] for the tokens in the shard only (rows
  // summed in (b,t) order, as embedding_backward); dwpe as embedding_backward, or skipped when
  // empty.
  void embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                const Tensor& tokens, int64_t vocab_begin, int64_t vocab_size);

  // The cross-entropy of logits whose columns are split over the tensor group, never gathering
  // them: three phases with an all-reduce between each (the caller's), then backward.
  //   1. rowmax [N] = the max of each row of this shard's logits [N,Vs].   -> all-reduce (max)
  void cross_entropy_shard_max(const Tensor& rowmax, const Tensor& logits);
  //   2. with rowmax the whole rows' max: sums [2,N], sums[0,r] = sum over this shard of
  //      exp(logits[r,j] - rowmax[r]) and sums[1,r] = logits[r, targets[r] - vocab_begin] when
  //      the target is in the shard, else 0 (ignored rows: 0).       -> all-reduce (sum) of both
  void cross_entropy_shard_sums(const Tensor& sums, const Tensor& logits, const Tensor& rowmax,
                                const Tensor& targets, int64_t vocab_begin, int64_t vocab_size);
  //   3. with sums summed over the group: losses[r] = log(sums[0,r]) + rowmax[r] - sums[1,r]
  //      (0 for ignored rows) and loss [1] = their mean over the rows that count, with
  //      cross_entropy_forward's convention and precision (cpu: the mean in double).
  void cross_entropy_shard_loss(const Tensor& loss, const Tensor& losses, const Tensor& rowmax,
                                const Tensor& sums, const Tensor& targets);
  // dlogits [N,Vs] = scale * (exp(logits - rowmax) / sums[0] - onehot(targets - vocab_begin))
  // / (rows that count): this shard's columns of cross_entropy_backward's result; 0 for ignored
  // rows. rowmax and sums as phases 1 to 3 left them.
  void cross_entropy_shard_backward(const Tensor& dlogits, const Tensor& logits,
                                    const Tensor& rowmax, const Tensor& sums,
                                    const Tensor& targets, int64_t vocab_begin,
                                    int64_t vocab_size, float scale);

  // Zero bytes, for gradient buffers.
  void zero(const Tensor& t);

  // Blocks until the stream has run what was enqueued, then throws zero::Error if an op found
  // bad data (a token or target out of range). For tests and the engine's step boundary.
  void check_errors();

 protected:
  Ops(Device& device, Stream& stream) : device_(device), stream_(stream) {}

 private:
  virtual void do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                    const Tensor& wpe) = 0;
  virtual void do_embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                     const Tensor& tokens) = 0;
  virtual void do_layernorm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd,
                                    const Tensor& x, const Tensor& w, const Tensor& b) = 0;
  virtual void do_layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db,
                                     const Tensor& dy, const Tensor& x, const Tensor& w,
                                     const Tensor& mean, const Tensor& rstd) = 0;
  virtual void do_linear_forward(const Tensor& y, const Tensor& x, const Tensor& w,
                                 const Tensor& b) = 0;
  virtual void do_linear_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w) = 0;
  virtual void do_linear_backward_weight(const Tensor& dw, const Tensor& db, const Tensor& dy,
                                         const Tensor& x) = 0;
  virtual void do_linear_t_forward(const Tensor& y, const Tensor& x, const Tensor& w) = 0;
  virtual void do_linear_t_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w) = 0;
  virtual void do_linear_t_backward_weight(const Tensor& dw, const Tensor& dy, const Tensor& x) = 0;
  virtual void do_gelu_forward(const Tensor& y, const Tensor& x) = 0;
  virtual void do_gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) = 0;
  virtual void do_attention_forward(const Tensor& out, const Tensor& probs, const Tensor& qkv,
                                    int n_head) = 0;
  virtual void do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                     const Tensor& probs, int n_head) = 0;
  // Only backends whose blocked_attention() is true override these (the public ops refuse the
  // call before reaching them otherwise).
  virtual void do_attention_forward_lse(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                        int n_head);
  virtual void do_attention_backward_lse(const Tensor& dqkv, const Tensor& dout,
                                         const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                         int n_head);
  virtual void do_add(const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  virtual void do_accumulate(const Tensor& acc, const Tensor& x) = 0;
  virtual void do_cross_entropy_forward(const Tensor& loss, const Tensor& losses,
                                        const Tensor& logits, const Tensor& targets) = 0;
  virtual void do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits,
                                         const Tensor& targets, float scale) = 0;
  virtual void do_embedding_forward_shard(const Tensor& out, const Tensor& tokens,
                                          const Tensor& wte, const Tensor& wpe,
                                          int64_t vocab_begin, int64_t vocab_size) = 0;
  virtual void do_embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe,
                                           const Tensor& dout, const Tensor& tokens,
                                           int64_t vocab_begin, int64_t vocab_size) = 0;
  virtual void do_cross_entropy_shard_max(const Tensor& rowmax, const Tensor& logits) = 0;
  virtual void do_cross_entropy_shard_sums(const Tensor& sums, const Tensor& logits,
                                           const Tensor& rowmax, const Tensor& targets,
                                           int64_t vocab_begin, int64_t vocab_size) = 0;
  virtual void do_cross_entropy_shard_loss(const Tensor& loss, const Tensor& losses,
                                           const Tensor& rowmax, const Tensor& sums,
                                           const Tensor& targets) = 0;
  virtual void do_cross_entropy_shard_backward(const Tensor& dlogits, const Tensor& logits,
                                               const Tensor& rowmax, const Tensor& sums,
                                               const Tensor& targets, int64_t vocab_begin,
                                               int64_t vocab_size, float scale) = 0;
  virtual void do_zero(const Tensor& t) = 0;
  virtual void do_check_errors() = 0;

  Device& device_;
  Stream& stream_;
};

// The Ops of `device`'s backend, enqueuing on `stream` (a stream of that device). Both must
// outlive the Ops. Throws zero::Error for a cuda device when the cuda backend is not built.
std::unique_ptr<Ops> make_ops(Device& device, Stream& stream);

// The CPU BLAS behind the cpu kernels and the kernel family it picked for this processor, e.g.
// "OpenBLAS 0.3.21, Cooperlake kernels; bf16 products: oneDNN 2.6.3, brg:avx512_core_bf16".
// Kernel families sum a matrix product's terms in
// different orders, so training is bitwise the same on two machines only when this line is the
// same (OPENBLAS_CORETYPE pins the family; docs/training.md, "Reproducibility"). Thread-safe.
std::string cpu_blas_description();

// The backends' factories (models/cpu/cpu_ops.cpp, models/cuda/cuda_ops.cpp).
std::unique_ptr<Ops> make_cpu_ops(Device& device, Stream& stream);
std::unique_ptr<Ops> make_cuda_ops(Device& device, Stream& stream);

}  // namespace zero::models
