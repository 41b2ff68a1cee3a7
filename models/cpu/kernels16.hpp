// The cpu kernels for 16-bit activations (docs/cpu-kernels.md, "16-bit activations"): the ops
// of kernels.hpp with activations, their gradients and logits stored as S = bf16 or fp16 and
// every computation in fp32. models/cpu/cpu_ops.cpp calls them when an op's activation type is
// 16-bit; the fp32 and fp64 kernels of kernels.hpp are untouched by them.
//
// Storage and conversions. An activation argument is a pointer to S elements (`s` names S for
// the whole call); statistics (mean, rstd, lse, rowmax, sums) and per-row losses are fp32;
// parameters and gradients are Param<float> / Grad<float> as in kernels.hpp (fp32, bf16 or fp16
// storage). No kernel makes an fp32 copy of a whole activation tensor:
//   - row and element kernels widen one block (16 rows, 64 rows for layernorm backward, 16384
//     elements) into per-task fp32 scratch, run the fp32 row code of elementwise.hpp on it and
//     round each output element once to S;
//   - matrix products take S operands as stored where oneDNN has an S kernel on this CPU
//     (matmul_supports; bf16 on AVX-512 CPUs), with fp32 accumulation into an fp32 block of
//     kGemmRows rows (or a weight-gradient tile) that gets the bias, if any, and is then rounded
//     once to S (activations) or added to the gradient (weight gradients, "+=" as kernels.hpp).
//     Where there is no S kernel (fp16 without AVX512-FP16), or the weight is not stored as S,
//     the operands' blocks are widened to fp32 and the BLAS multiplies;
//   - attention multiplies S blocks of qkv in place (ld 3C); scores, probabilities and the
//     output accumulator are fp32 scratch per task; P and dS are rounded to S for their products
//     (as FlashAttention does); dQ, dK, dV sum in fp32 per task and are rounded once, when their
//     block is complete.
//
// Determinism: as kernels.hpp: block bounds depend on the shapes only, each block is one
// sequential computation, sums across blocks go in block order; so for fixed shapes the results
// are bitwise the same for every oneTBB thread count and every vector path of elementwise.hpp.
//
// Numerics: each output is the fp32 computation on the widened inputs, rounded once to S
// (relative error 2^-8 for bf16, 2^-11 for fp16, on top of the fp32 kernel's own); products with
// a rounded P or dS carry that rounding in their operands too. docs/cpu-kernels.md states the
// bounds the tests check.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"
#include "models/cpu/kernels.hpp"

namespace zero::models::cpu::k16 {

// The vocabulary-shard forms serve the whole ops too (v0 = 0, Vs = V, has_wpe); `op` names the
// op in errors (bad token ids or targets throw zero::Error as kernels.hpp says).
void embedding_forward(ScalarType s, void* out, const int32_t* tokens, Param<float> wte,
                       Param<float> wpe, bool has_wpe, int64_t B, int64_t T, int64_t C,
                       int64_t v0, int64_t Vs, int64_t V, const char* op);
void embedding_backward(ScalarType s, Grad<float> dwte, Grad<float> dwpe, bool has_wpe,
                        const void* dout, const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                        int64_t v0, int64_t Vs, int64_t V, const char* op);

void layernorm_forward(ScalarType s, void* y, float* mean, float* rstd, const void* x,
                       Param<float> w, Param<float> b, int64_t N, int64_t C);
void layernorm_backward(ScalarType s, void* dx, Grad<float> dw, Grad<float> db, const void* dy,
                        const void* x, Param<float> w, const float* mean, const float* rstd,
                        int64_t N, int64_t C);

// y[N,OC] = x[N,C] @ w[C,OC] (+ b when has_bias); dx = dy @ w^T; dw += x^T @ dy, db += column
// sums of dy.
void linear_forward(ScalarType s, void* y, const void* x, Param<float> w, Param<float> b,
                    bool has_bias, int64_t N, int64_t C, int64_t OC);
void linear_backward_input(ScalarType s, void* dx, const void* dy, Param<float> w, int64_t N,
                           int64_t C, int64_t OC);
void linear_backward_weight(ScalarType s, Grad<float> dw, Grad<float> db, bool has_bias,
                            const void* dy, const void* x, int64_t N, int64_t C, int64_t OC);
// y[N,V] = x[N,C] @ w[V,C]^T; dx = dy @ w; dw += dy^T @ x.
void linear_t_forward(ScalarType s, void* y, const void* x, Param<float> w, int64_t N, int64_t C,
                      int64_t V);
void linear_t_backward_input(ScalarType s, void* dx, const void* dy, Param<float> w, int64_t N,
                             int64_t C, int64_t V);
void linear_t_backward_weight(ScalarType s, Grad<float> dw, const void* dy, const void* x,
                              int64_t N, int64_t C, int64_t V);

void gelu_forward(ScalarType s, void* y, const void* x, int64_t n);  // y may be x
void gelu_backward(ScalarType s, void* dx, const void* dy, const void* x, int64_t n);  // dx may be dy
void add(ScalarType s, void* out, const void* a, const void* b, int64_t n);  // out may be a or b
// acc (fp32, bf16 or fp16) += x, added in fp32 and rounded once.
void accumulate(ScalarType s, Grad<float> acc, const void* x, int64_t n);

// The blocked attention pair of kernels.hpp (attention16.cpp); lse fp32.
void attention_forward_lse(ScalarType s, void* out, float* lse, const void* qkv, int64_t B,
                           int64_t T, int64_t C, int64_t NH);
void attention_backward_lse(ScalarType s, void* dqkv, const void* dout, const void* qkv,
                            const void* out, const float* lse, int64_t B, int64_t T, int64_t C,
                            int64_t NH);

// Cross-entropy (losses fp32; returns the mean as cross_entropy_forward) and its backward.
float cross_entropy_forward(ScalarType s, float* losses, const void* logits,
                            const int32_t* targets, int64_t N, int64_t V);
void cross_entropy_backward(ScalarType s, void* dlogits, const void* logits,
                            const int32_t* targets, int64_t N, int64_t V, float scale);
// The vocabulary-parallel cross-entropy's phases (kernels.hpp) on 16-bit logits; phase 3
// (cross_entropy_shard_loss) reads statistics only and is the fp32 kernel.
void cross_entropy_shard_max(ScalarType s, float* rowmax, const void* logits, int64_t N,
                             int64_t Vs);
void cross_entropy_shard_sums(ScalarType s, float* sums, const void* logits, const float* rowmax,
                              const int32_t* targets, int64_t N, int64_t v0, int64_t Vs,
                              int64_t V);
void cross_entropy_shard_backward(ScalarType s, void* dlogits, const void* logits,
                                  const float* rowmax, const float* sums, const int32_t* targets,
                                  int64_t N, int64_t v0, int64_t Vs, int64_t V, float scale);

}  // namespace zero::models::cpu::k16
