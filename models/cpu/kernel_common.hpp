// Helpers the cpu kernel files share (kernels.cpp, vocab_kernels.cpp): the fixed-block
// parallel loop, scratch, id checks, and the row max and exponentials of the softmaxes, so every
// softmax on the cpu backend (whole or vocabulary-parallel) computes exp with the same bits.
// Internal to models/cpu/.
#pragma once

#include <tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace zero::models::cpu::detail {

// Rows per task for row-wise kernels (layernorm, softmax, embedding).
inline constexpr int64_t kRowBlock = 16;

// fn(begin, end) over [0, n) cut into blocks of `block`, the blocks in parallel.
template <class Fn>
void for_blocks(int64_t n, int64_t block, const Fn& fn) {
  const int64_t blocks = (n + block - 1) / block;
  tbb::parallel_for(int64_t{0}, blocks, [&](int64_t i) {
    fn(i * block, std::min(n, (i + 1) * block));
  });
}

template <class F>
std::unique_ptr<F[]> scratch(int64_t n) {
  return std::make_unique_for_overwrite<F[]>(static_cast<size_t>(n));
}

// Throws for the first id outside [0, V) in memory order (-1 passes when allow_ignore).
inline void check_ids(const char* op, const char* what, const int32_t* ids, int64_t B,
                      int64_t T, int64_t V, bool allow_ignore) {
  for (int64_t i = 0; i < B * T; ++i) {
    const int32_t id = ids[i];
    if ((id >= 0 && id < V) || (allow_ignore && id == -1)) continue;
    const std::string where = allow_ignore ? "row " + std::to_string(i)
                                           : "[b=" + std::to_string(i / T) + ", t=" +
                                                 std::to_string(i % T) + "]";
    ZERO_FAIL(std::string(op) + ": " + what + " " + std::to_string(id) + " at " + where +
              " is outside the vocabulary [0, " + std::to_string(V) + ")" +
              (allow_ignore ? " (-1 marks a row to ignore)" : ""));
  }
}

// The maximum of row[0, n).
template <class F>
F row_max(const F* row, int64_t n) {
  F m = -std::numeric_limits<F>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, row[j]);
  return m;
}

// out[j] = exp(in[j] - max) over [0, n) (out may be in); returns their sum. Shifting by the
// maximum keeps every exp in (0, 1]: no overflow, and the sum is at least 1.
// exp for fp32 that the compiler vectorises (std::exp is one libm call per element, and GELU's
// tanh and the softmaxes were over a third of a training step's time). Cody-Waite reduction
// x = n ln2 + r with |r| <= ln2/2, a degree-7 Taylor polynomial for e^r (truncation below 7e-9
// relative), 2^n written into the exponent bits: within 2 ulp of e^x. Inputs are clamped to
// [-87, 88], inside fp32's normal range (softmax arguments are <= 0; GELU saturates long before).
// Plain +, * and a round-to-nearest trick only: the same bits on every x86 host and thread count.
inline float exp_fast(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kShifter) - kShifter;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln2 = 0.693359375 - 2.12e-4
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}
// fp64 is the reference precision: the library's exp.
inline float exp_of(float x) { return exp_fast(x); }
inline double exp_of(double x) { return std::exp(x); }

template <class F>
F exp_shifted(const F* in, F* out, int64_t n) {
  const F m = row_max(in, n);
  // Two loops: the exponentials vectorise, the sum stays in index order (deterministic).
  for (int64_t j = 0; j < n; ++j) out[j] = exp_of(in[j] - m);
  F sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += out[j];
  return sum;
}

// The mean of the per-row losses over the rows with a target (targets[r] >= 0), 0 when there
// are none: summed in row order in double, so that the fp32 loss of many rows is not the
// rounding error of a long fp32 sum, and so that every cross-entropy kernel (whole, vocabulary
// shard, vectorised) returns the same bits for the same losses.
template <class F>
F mean_loss(const F* losses, const int32_t* targets, int64_t N) {
  double total = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < N; ++r) {
    if (targets[r] < 0) continue;
    total += double(losses[r]);
    ++count;
  }
  return count == 0 ? F(0) : F(total / double(count));
}

// The positions i in [0, n) whose token is in [v0, v0 + Vs), grouped by token: `order` holds
// them sorted by token, (b,t) order kept within a token; group g is order[starts[g],
// starts[g + 1]). The embedding backward kernels (whole, vocabulary shard, 16-bit) give each
// touched row of the token table one summed contribution per group, so no two tasks write one
// row and the sum's order depends only on the tokens.
struct TokenGroups {
  std::vector<int64_t> order;
  std::vector<int64_t> starts;  // groups() + 1 entries
  int64_t groups() const noexcept { return static_cast<int64_t>(starts.size()) - 1; }
};
inline TokenGroups group_by_token(const int32_t* tokens, int64_t n, int64_t v0, int64_t Vs) {
  TokenGroups g;
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] >= v0 && tokens[i] < v0 + Vs) g.order.push_back(i);
  std::stable_sort(g.order.begin(), g.order.end(),
                   [&](int64_t a, int64_t b) { return tokens[a] < tokens[b]; });
  for (size_t i = 0; i < g.order.size(); ++i)
    if (i == 0 || tokens[g.order[i]] != tokens[g.order[i - 1]]) g.starts.push_back(int64_t(i));
  g.starts.push_back(static_cast<int64_t>(g.order.size()));
  return g;
}

}  // namespace zero::models::cpu::detail
