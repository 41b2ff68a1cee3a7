// The per-ISA leaf functions of models/cpu/elementwise.cpp: one table per vector path, each built
// from models/cpu/elementwise_body.hpp by elementwise_<isa>.cpp. Every entry is single-threaded
// and works on one contiguous range or one row; elementwise.cpp does the threading.
// Internal to models/cpu/.
#pragma once

#include <cstdint>

namespace zero::models::cpu::elementwise::detail {

struct Table {
  void (*gelu_forward)(float* y, const float* x, int64_t n);
  void (*gelu_backward)(float* dx, const float* dy, const float* x, int64_t n);
  void (*add)(float* out, const float* a, const float* b, int64_t n);
  // One row: mean, rstd and y.
  void (*layernorm_forward_row)(float* y, float* mean, float* rstd, const float* x,
                                const float* w, const float* b, int64_t C);
  // One row: dx, and dy * xhat and dy added into dw_acc[C] and db_acc[C].
  void (*layernorm_backward_row)(float* dx, float* dw_acc, float* db_acc, const float* dy,
                                 const float* x, const float* w, float mean, float rstd,
                                 int64_t C);
  float (*row_max)(const float* x, int64_t n);
  float (*exp_sum)(float* out, const float* x, float shift, int64_t n);
  void (*scale)(float* d, float inv, float f, int64_t n);
  float (*dot)(const float* a, const float* b, int64_t n);
  // d = p * (d - dot)
  void (*softmax_backward)(float* d, const float* p, float dot, int64_t n);
};

const Table& table_generic();
#if defined(__x86_64__) && defined(__GNUC__)
const Table& table_avx2();
const Table& table_avx512();
#define ZERO_ELEMENTWISE_X86 1
#else
#define ZERO_ELEMENTWISE_X86 0
#endif

}  // namespace zero::models::cpu::elementwise::detail
