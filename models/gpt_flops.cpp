#include "models/gpt_flops.hpp"

#include <string>

#include "core/error.hpp"

namespace zero::models {

namespace {

// Forward FLOPs of a matmul with a [k, n] weight, per token (one row of its input).
constexpr int64_t matmul(int64_t k, int64_t n) noexcept { return 2 * k * n; }

}  // namespace

UnitFlops gpt_embedding_flops(const GptShape& s) noexcept {
  const int64_t C = s.n_embd;
  return {.forward = C, .backward = 2 * C};
}

UnitFlops gpt_block_flops(const GptShape& s, int seq_len) noexcept {
  const int64_t C = s.n_embd, T = seq_len;
  const int64_t matmuls = matmul(C, 3 * C)     // QKV
                          + matmul(C, C)       // attention output projection
                          + matmul(C, 4 * C)   // MLP up (c_fc)
                          + matmul(4 * C, C);  // MLP down (c_proj)
  // Per token, over all heads together: q.k^T against T keys is T dot products of length C
  // (2 T C), and the probabilities times V is another 2 T C.
  const int64_t attention = 2 * T * C + 2 * T * C;
  return {.forward = matmuls + attention, .backward = 2 * (matmuls + attention)};
}

UnitFlops gpt_head_flops(const GptShape& s) noexcept {
  const int64_t C = s.n_embd, V = s.vocab_size;
  const int64_t lm_head = matmul(C, V);
  return {.forward = lm_head + 3 * V, .backward = 2 * lm_head + 2 * V};
}

std::vector<UnitFlops> gpt_unit_flops(const GptShape& s, int seq_len) {
  ZERO_REQUIRE(s.n_layer > 0 && s.n_embd > 0 && s.vocab_size > 0 && s.seq_len > 0,
               "gpt_unit_flops: the shape needs positive n_layer, n_embd, vocab_size and seq_len "
               "(got " + std::to_string(s.n_layer) + ", " + std::to_string(s.n_embd) + ", " +
                   std::to_string(s.vocab_size) + ", " + std::to_string(s.seq_len) + ")");
  ZERO_REQUIRE(seq_len >= 1 && seq_len <= s.seq_len,
               "gpt_unit_flops: sequence length " + std::to_string(seq_len) +
                   " is outside the model's context [1, " + std::to_string(s.seq_len) + "]");
  std::vector<UnitFlops> out;
  out.reserve(static_cast<size_t>(s.n_layer) + 2);
  out.push_back(gpt_embedding_flops(s));
  for (int l = 0; l < s.n_layer; ++l) out.push_back(gpt_block_flops(s, seq_len));
  out.push_back(gpt_head_flops(s));
  return out;
}

}  // namespace zero::models
