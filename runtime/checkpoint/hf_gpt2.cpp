// The config.json of a Hugging Face GPT-2 for an exported model. Key names and meanings are
// transformers' GPT2Config (the defaults it would fill in are written out, so that the file
// says what the weights compute whatever the reader's version defaults to).
#include "runtime/checkpoint/hf_gpt2.hpp"

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/checkpoint/file_io.hpp"
#include "runtime/checkpoint/pieces.hpp"
#include "core/error.hpp"

namespace zero::checkpoint {
namespace {

// The table models::make_gpt builds for `s`, in its order.
std::vector<ParamInfo> gpt_table(const models::GptShape& s) {
  const int64_t C = s.n_embd;
  std::vector<ParamInfo> t{{"wte.weight", {s.vocab_size, C}}, {"wpe.weight", {s.seq_len, C}}};
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    t.push_back({h + "ln_1.weight", {C}});
    t.push_back({h + "ln_1.bias", {C}});
    t.push_back({h + "attn.c_attn.weight", {C, 3 * C}});
    t.push_back({h + "attn.c_attn.bias", {3 * C}});
    t.push_back({h + "attn.c_proj.weight", {C, C}});
    t.push_back({h + "attn.c_proj.bias", {C}});
    t.push_back({h + "ln_2.weight", {C}});
    t.push_back({h + "ln_2.bias", {C}});
    t.push_back({h + "mlp.c_fc.weight", {C, 4 * C}});
    t.push_back({h + "mlp.c_fc.bias", {4 * C}});
    t.push_back({h + "mlp.c_proj.weight", {4 * C, C}});
    t.push_back({h + "mlp.c_proj.bias", {C}});
  }
  t.push_back({"ln_f.weight", {C}});
  t.push_back({"ln_f.bias", {C}});
  return t;
}

}  // namespace

models::GptShape gpt_shape_from_params(std::span<const ParamInfo> params, int n_head) {
  const std::string hint =
      "\nHINT: --hf-config describes zero-train's GPT only; export without it for other models";
  if (params.size() < 4 || params[0].name != "wte.weight" || params[0].shape.size() != 2 ||
      params[1].name != "wpe.weight" || params[1].shape.size() != 2)
    ZERO_FAIL("the checkpoint's parameters do not start with a GPT-2's 'wte.weight' [V, C] and "
              "'wpe.weight' [T, C]" + hint);
  if ((params.size() - 4) % 12 != 0)
    ZERO_FAIL("the checkpoint has " + std::to_string(params.size()) +
              " parameters, not 4 + 12 per block as a GPT-2" + hint);
  models::GptShape s;
  s.vocab_size = static_cast<int>(params[0].shape[0]);
  s.n_embd = static_cast<int>(params[0].shape[1]);
  s.seq_len = static_cast<int>(params[1].shape[0]);
  s.n_layer = static_cast<int>((params.size() - 4) / 12);
  s.n_head = n_head;
  if (n_head <= 0 || s.n_embd % n_head != 0)
    ZERO_FAIL(std::to_string(n_head) + " attention heads do not divide the hidden size " +
              std::to_string(s.n_embd) + "\nHINT: pass the n_head the model was trained with");
  const std::vector<ParamInfo> want = gpt_table(s);
  for (size_t i = 0; i < want.size(); ++i)
    if (params[i] != want[i])
      ZERO_FAIL("the checkpoint's parameter " + std::to_string(i) + " is '" + params[i].name +
                "' " + detail::shape_text(params[i].shape) + " where a GPT-2 of " +
                std::to_string(s.n_layer) + " layers and hidden size " + std::to_string(s.n_embd) +
                " has '" + want[i].name + "' " + detail::shape_text(want[i].shape) + hint);
  return s;
}

std::optional<int> recorded_n_head(std::string_view metadata) {
  const nlohmann::json meta = nlohmann::json::parse(metadata, nullptr, false);
  if (!meta.is_object()) return std::nullopt;
  const auto user = meta.find("user");
  if (user == meta.end() || !user->is_object()) return std::nullopt;
  const auto model = user->find("model");
  if (model == user->end() || !model->is_object()) return std::nullopt;
  const auto n = model->find("n_head");
  if (n == model->end() || !n->is_number_unsigned() || n->get<uint64_t>() == 0 ||
      n->get<uint64_t>() > (1u << 30))
    return std::nullopt;
  return static_cast<int>(n->get<uint64_t>());
}

std::string hf_gpt2_config_json(const models::GptShape& s) {
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = s.vocab_size;
  j["n_positions"] = s.seq_len;
  j["n_ctx"] = s.seq_len;  // the older name of n_positions, still read by old releases
  j["n_embd"] = s.n_embd;
  j["n_layer"] = s.n_layer;
  j["n_head"] = s.n_head;
  j["n_inner"] = nullptr;  // 4 * n_embd, our MLP's width
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = 1e-5;
  j["initializer_range"] = 0.02;
  // Our GPT has no dropout: with these the Hugging Face model computes ours in training mode too.
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = true;
  j["use_cache"] = true;
  // GPT-2's tokenizer has <|endoftext|> = 50256; a smaller vocabulary (the addition task's) has
  // no such token, and the defaults (50256) would point outside it.
  const nlohmann::ordered_json eot = s.vocab_size > 50256 ? nlohmann::ordered_json(50256) : nlohmann::ordered_json();
  j["bos_token_id"] = eot;
  j["eos_token_id"] = eot;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

void write_hf_gpt2_config(const std::string& path, const models::GptShape& shape) {
  io::write_file_atomic(path, hf_gpt2_config_json(shape), "the Hugging Face config");
}

}  // namespace zero::checkpoint
