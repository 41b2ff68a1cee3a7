// Per-Unit FLOPs of a GPT (models/gpt_flops.hpp): a block against the standard count, 6 x its
// matmul parameters per token plus the attention term (Narayanan et al., SC'21: 24 s h^2 + 4 s^2 h
// per layer and sequence forward, backward twice that; PaLM, appendix B: 6N + 12 L H Q T), with
// the parameters read from the model's own table; the Units' sum against gpt_flops_per_token.
#include "models/gpt_flops.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "core/device.hpp"
#include "core/error.hpp"
#include "models/gpt.hpp"
#include "models/ops.hpp"

using namespace zero;
using namespace zero::models;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("gpt flops: a block is 6 x its matmul parameters per token plus 12 T C of attention") {
  auto device = make_device(DeviceKind::cpu);
  auto stream = device->create_stream("compute");
  auto ops = make_ops(*device, *stream);
  for (const char* preset : {"tiny", "gpt2-124m"}) {
    INFO(preset);
    const GptShape s = *gpt_preset(preset);
    const Model m = make_gpt({s, ScalarType::f32, ScalarType::f32}, *ops);
    // Block 0's matmul weights are its 2-D parameters (c_attn, attn c_proj, c_fc, mlp c_proj);
    // its biases and LayerNorm parameters do elementwise work the standard count leaves out.
    int64_t matmul_params = 0, all_params = 0;
    for (int id : m.units[1]->param_ids()) {
      const ParamSpec& p = m.params[static_cast<size_t>(id)];
      all_params += p.numel();
      if (p.shape.rank() == 2) matmul_params += p.numel();
    }
    REQUIRE(matmul_params == 12LL * s.n_embd * s.n_embd);
    for (int T : {1, s.seq_len / 2, s.seq_len}) {
      INFO("T = " << T);
      const int64_t attention = 12LL * T * s.n_embd;
      const UnitFlops block = gpt_block_flops(s, T);
      CHECK(block.total() == 6 * matmul_params + attention);
      CHECK(block.backward == 2 * block.forward);
      // Against 6 x all of the block's parameters: short by 6 x its 13 C biases and norms, a
      // fraction 13 / (12 C) of the matmul count (1% for C = 128).
      CHECK(6 * all_params + attention - block.total() == 6 * 13LL * s.n_embd);
    }
  }
}

TEST_CASE("gpt flops: the Units in order sum to gpt_flops_per_token plus embedding and loss") {
  const GptShape s = *gpt_preset("gpt2-124m");
  const auto units = gpt_unit_flops(s, s.seq_len);
  REQUIRE(units.size() == static_cast<size_t>(s.n_layer) + 2);
  CHECK(units.front() == gpt_embedding_flops(s));
  CHECK(units.back() == gpt_head_flops(s));
  const int64_t C = s.n_embd, V = s.vocab_size;
  CHECK(units.front().total() == 3 * C);             // the position add and two scatter-adds
  CHECK(units.back().total() == 6 * V * C + 5 * V);  // LM head matmul and cross-entropy
  int64_t sum = 0;
  for (const UnitFlops& u : units) sum += u.total();
  // gpt_flops_per_token is a double of integers below 2^53: exact.
  CHECK(sum == static_cast<int64_t>(gpt_flops_per_token(s)) + 3 * C + 5 * V);
  // Shorter sequences cost less attention, not less matmul.
  CHECK(gpt_unit_flops(s, 512)[1].total() == units[1].total() - 12LL * 512 * C);
}

TEST_CASE("gpt flops: a sequence longer than the context or a bad shape is refused") {
  const GptShape s = *gpt_preset("tiny");
  CHECK_THROWS_WITH(gpt_unit_flops(s, s.seq_len + 1),
                    ContainsSubstring("sequence length 65") && ContainsSubstring("[1, 64]"));
  CHECK_THROWS_AS(gpt_unit_flops(s, 0), Error);
  CHECK_THROWS_AS(gpt_unit_flops(GptShape{}, 1), Error);
}
