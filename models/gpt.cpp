#include "models/gpt.hpp"

#include <cmath>
#include <utility>

#include "models/gpt_block.hpp"
#include "models/gpt_ends.hpp"

namespace zero::models {

void check_gpt_options(const GptOptions& o, const Ops& ops) {
  const GptShape& s = o.shape;
  ZERO_REQUIRE(s.n_layer > 0 && s.n_embd > 0 && s.n_head > 0 && s.vocab_size > 0 && s.seq_len > 0,
               "gpt: every size must be positive (n_layer " + std::to_string(s.n_layer) + ", n_embd " +
                   std::to_string(s.n_embd) + ", n_head " + std::to_string(s.n_head) + ", vocab_size " +
                   std::to_string(s.vocab_size) + ", seq_len " + std::to_string(s.seq_len) + ")");
  ZERO_REQUIRE(s.n_embd % s.n_head == 0, "gpt: n_embd " + std::to_string(s.n_embd) +
                                             " is not divisible by n_head " + std::to_string(s.n_head));
  const ScalarType a = o.activation_type;
  if (ops.device().kind() == DeviceKind::cpu) {
    ZERO_REQUIRE(a == ScalarType::f32 || a == ScalarType::bf16 || a == ScalarType::f16 || a == ScalarType::f64,
                 "gpt on " + ops.device().name() + ": activations must be fp32, bf16 or fp16 (or fp64 for checks), got " +
                     std::string(to_string(a)));
    ZERO_REQUIRE(a == ScalarType::f32 || a == ScalarType::f64 || !o.attention_probabilities,
                 "gpt on " + ops.device().name() + ": attention_probabilities needs fp32 or fp64 activations on cpu (got " +
                     std::string(to_string(a)) + ")\nHINT: leave attention_probabilities off (the blocked attention "
                     "computes in 16-bit activations)");
  } else {
    ZERO_REQUIRE(a == ScalarType::f32 || a == ScalarType::bf16 || a == ScalarType::f16,
                 "gpt on " + ops.device().name() + ": activations must be fp32, bf16 or fp16, got " +
                     std::string(to_string(a)));
  }
  ZERO_REQUIRE(o.param_type != ScalarType::i32, "gpt: parameters must have a float type");
  ZERO_REQUIRE((o.param_type == ScalarType::f64) == (a == ScalarType::f64),
               "gpt: fp64 parameters go with fp64 activations only");
}

Model make_gpt(const GptOptions& o, Ops& ops) {
  check_gpt_options(o, ops);
  const GptShape& s = o.shape;
  const int64_t C = s.n_embd;
  Model m;
  m.name = "gpt(n_layer " + std::to_string(s.n_layer) + ", n_embd " + std::to_string(C) +
           ", n_head " + std::to_string(s.n_head) + ", vocab " + std::to_string(s.vocab_size) +
           ", seq_len " + std::to_string(s.seq_len) + ")";
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(s.n_layer));
  auto add = [&](std::string name, Shape shape, ParamInit init, float std_dev = 0.02f) {
    ParamSpec p;
    p.name = std::move(name);
    p.shape = shape;
    p.type = o.param_type;
    p.weight_decay = shape.rank() >= 2;
    p.init = init;
    p.init_std = std_dev;
    m.params.push_back(std::move(p));
    return static_cast<int>(m.params.size()) - 1;
  };
  const int wte = add("wte.weight", Shape{s.vocab_size, C}, ParamInit::normal);
  const int wpe = add("wpe.weight", Shape{s.seq_len, C}, ParamInit::normal);
  m.units.push_back(std::make_unique<GptEmbedding>("embedding", std::vector<int>{wte, wpe}, ops, o, TensorGroup()));
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    std::vector<int> ids;
    ids.push_back(add(h + "ln_1.weight", Shape{C}, ParamInit::ones));
    ids.push_back(add(h + "ln_1.bias", Shape{C}, ParamInit::zeros));
    ids.push_back(add(h + "attn.c_attn.weight", Shape{C, 3 * C}, ParamInit::normal));
    ids.push_back(add(h + "attn.c_attn.bias", Shape{3 * C}, ParamInit::zeros));
    ids.push_back(add(h + "attn.c_proj.weight", Shape{C, C}, ParamInit::normal, proj_std));
    ids.push_back(add(h + "attn.c_proj.bias", Shape{C}, ParamInit::zeros));
    ids.push_back(add(h + "ln_2.weight", Shape{C}, ParamInit::ones));
    ids.push_back(add(h + "ln_2.bias", Shape{C}, ParamInit::zeros));
    ids.push_back(add(h + "mlp.c_fc.weight", Shape{C, 4 * C}, ParamInit::normal));
    ids.push_back(add(h + "mlp.c_fc.bias", Shape{4 * C}, ParamInit::zeros));
    ids.push_back(add(h + "mlp.c_proj.weight", Shape{4 * C, C}, ParamInit::normal, proj_std));
    ids.push_back(add(h + "mlp.c_proj.bias", Shape{C}, ParamInit::zeros));
    m.units.push_back(std::make_unique<GptBlock>("h." + std::to_string(l), std::move(ids), ops, o, TensorGroup()));
  }
  const int lnf_w = add("ln_f.weight", Shape{C}, ParamInit::ones);
  const int lnf_b = add("ln_f.bias", Shape{C}, ParamInit::zeros);
  m.units.push_back(std::make_unique<GptHead>("head", std::vector<int>{lnf_w, lnf_b, wte}, ops, o, TensorGroup()));
  return m;
}

int64_t gpt_parameter_count(const GptShape& s) noexcept {
  const int64_t C = s.n_embd;
  return static_cast<int64_t>(s.n_layer) * (12 * C * C + 13 * C) +
         static_cast<int64_t>(s.vocab_size) * C + static_cast<int64_t>(s.seq_len) * C + 2 * C;
}

double gpt_flops_per_token(const GptShape& s) noexcept {
  const double C = s.n_embd, L = s.n_layer, V = s.vocab_size, T = s.seq_len;
  // Matmul parameters per token: 12 C^2 per block (qkv 3, proj 1, fc 4, fc proj 4) and V C for
  // the head; each does 2 FLOPs per parameter forward and 4 backward. Attention: q k^T and
  // probs v are 2 T C each per layer forward (counted over the full T x T, as is customary).
  const double matmul_params = L * 12.0 * C * C + V * C;
  return 6.0 * matmul_params + 12.0 * L * T * C;
}

}  // namespace zero::models
