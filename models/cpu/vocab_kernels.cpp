// The cpu kernels of the vocabulary-parallel ends (contract in kernels.hpp, ops.hpp). The same
// partitioning rules as kernels.cpp (fixed row blocks, sums in index order), and the same exp, so
// that a shard's exponentials are bitwise those the whole cross-entropy computes for the same
// argument.
#include <algorithm>
#include <numeric>
#include <vector>

#include "models/cpu/elementwise.hpp"
#include "models/cpu/kernel_common.hpp"
#include "models/cpu/kernels.hpp"

namespace zero::models::cpu {

using namespace detail;

template <ComputeType F>
void embedding_forward_shard(F* out, const int32_t* tokens, Param<F> wte, Param<F> wpe,
                             bool has_wpe, int64_t B, int64_t T, int64_t C, int64_t v0,
                             int64_t Vs, int64_t V) {
  check_ids("embedding_forward_shard", "token id", tokens, B, T, V, false);
  for_blocks(B * T, kRowBlock, [&](int64_t r0, int64_t r1) {
    const auto pos = scratch<F>(C);
    for (int64_t r = r0; r < r1; ++r) {
      F* o = out + r * C;
      const int64_t local = int64_t{tokens[r]} - v0;
      if (local >= 0 && local < Vs)
        wte.load(local * C, o, C);
      else
        std::fill_n(o, C, F(0));  // another rank's token: this rank's part of the sum is 0
      if (!has_wpe) continue;
      wpe.load((r % T) * C, pos.get(), C);
      for (int64_t c = 0; c < C; ++c) o[c] += pos[c];
    }
  });
}

template <ComputeType F>
void embedding_backward_shard(Grad<F> dwte, Grad<F> dwpe, bool has_wpe, const F* dout,
                              const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t v0,
                              int64_t Vs, int64_t V) {
  check_ids("embedding_backward_shard", "token id", tokens, B, T, V, false);
  // As embedding_backward: the shard's positions grouped by token ((b,t) order within a group),
  // one summed contribution per touched row.
  const TokenGroups tg = group_by_token(tokens, B * T, v0, Vs);
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
      dwte.add((int64_t{tokens[order[starts[g]]]} - v0) * C, acc.get(), C);
    }
  });
  if (!has_wpe) return;
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

template <ComputeType F>
void cross_entropy_shard_max(F* rowmax, const F* logits, int64_t N, int64_t Vs) {
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if constexpr (std::same_as<F, float>)
        rowmax[r] = elementwise::row_max(logits + r * Vs, Vs);
      else
        rowmax[r] = row_max(logits + r * Vs, Vs);
    }
  });
}

template <ComputeType F>
void cross_entropy_shard_sums(F* sums, const F* logits, const F* rowmax, const int32_t* targets,
                              int64_t N, int64_t v0, int64_t Vs, int64_t V) {
  check_ids("cross_entropy_shard_sums", "target", targets, 1, N, V, true);
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    std::vector<F> e(std::same_as<F, float> ? 0 : static_cast<size_t>(Vs));  // fp64 only
    for (int64_t r = r0; r < r1; ++r) {
      const F* row = logits + r * Vs;
      const F m = rowmax[r];
      if constexpr (std::same_as<F, float>) {
        sums[r] = elementwise::exp_sum(nullptr, row, m, Vs);  // the sum the whole op computes
      } else {
        // Two loops, as exp_shifted: the exponentials vectorise, the sum stays in index order.
        for (int64_t j = 0; j < Vs; ++j) e[static_cast<size_t>(j)] = exp_of(row[j] - m);
        F sum = 0;
        for (int64_t j = 0; j < Vs; ++j) sum += e[static_cast<size_t>(j)];
        sums[r] = sum;
      }
      const int64_t local = int64_t{targets[r]} - v0;
      sums[N + r] = targets[r] >= 0 && local >= 0 && local < Vs ? row[local] : F(0);
    }
  });
}

template <ComputeType F>
F cross_entropy_shard_loss(F* losses, const F* rowmax, const F* sums, const int32_t* targets,
                           int64_t N) {
  for (int64_t r = 0; r < N; ++r)  // logsumexp - the target's logit
    losses[r] = targets[r] < 0 ? F(0) : rowmax[r] + std::log(sums[r]) - sums[N + r];
  return detail::mean_loss(losses, targets, N);
}

template <ComputeType F>
void cross_entropy_shard_backward(F* dlogits, const F* logits, const F* rowmax, const F* sums,
                                  const int32_t* targets, int64_t N, int64_t v0, int64_t Vs,
                                  int64_t V, F scale) {
  check_ids("cross_entropy_shard_backward", "target", targets, 1, N, V, true);
  const int64_t count = std::count_if(targets, targets + N, [](int32_t t) { return t >= 0; });
  const F f = count == 0 ? F(0) : scale / F(count);
  for_blocks(N, kRowBlock, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      F* d = dlogits + r * Vs;
      if (targets[r] < 0) {
        std::fill_n(d, Vs, F(0));
        continue;
      }
      const F* row = logits + r * Vs;
      const F m = rowmax[r];
      if constexpr (std::same_as<F, float>)
        elementwise::exp_sum(d, row, m, Vs);
      else
        for (int64_t j = 0; j < Vs; ++j) d[j] = exp_of(row[j] - m);
      // As cross_entropy_backward: softmax = e * (1 / sum), the target's entry minus 1.
      const F inv = F(1) / sums[r];
      const int64_t local = int64_t{targets[r]} - v0;
      const bool here = local >= 0 && local < Vs;
      const F p_target = here ? d[local] * inv : F(0);
      if constexpr (std::same_as<F, float>)
        elementwise::scale(d, inv, f, Vs);
      else
        for (int64_t j = 0; j < Vs; ++j) d[j] = f * (d[j] * inv);
      if (here) d[local] = f * (p_target - F(1));
    }
  });
}

#define ZERO_CPU_VOCAB_KERNELS(F)                                                                 \
  template void embedding_forward_shard<F>(F*, const int32_t*, Param<F>, Param<F>, bool, int64_t, \
                                           int64_t, int64_t, int64_t, int64_t, int64_t);          \
  template void embedding_backward_shard<F>(Grad<F>, Grad<F>, bool, const F*, const int32_t*,     \
                                            int64_t, int64_t, int64_t, int64_t, int64_t, int64_t); \
  template void cross_entropy_shard_max<F>(F*, const F*, int64_t, int64_t);                       \
  template void cross_entropy_shard_sums<F>(F*, const F*, const F*, const int32_t*, int64_t,      \
                                            int64_t, int64_t, int64_t);                           \
  template F cross_entropy_shard_loss<F>(F*, const F*, const F*, const int32_t*, int64_t);        \
  template void cross_entropy_shard_backward<F>(F*, const F*, const F*, const F*, const int32_t*, \
                                                int64_t, int64_t, int64_t, int64_t, F);

ZERO_CPU_VOCAB_KERNELS(float)
ZERO_CPU_VOCAB_KERNELS(double)
#undef ZERO_CPU_VOCAB_KERNELS

}  // namespace zero::models::cpu
