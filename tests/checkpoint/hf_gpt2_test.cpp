// Hugging Face GPT-2 interoperability: the config.json derived from a real GPT's parameter table,
// and import_safetensors reading the names, tied head and buffers of a save_pretrained file.
#include "runtime/checkpoint/hf_gpt2.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "models/gpt.hpp"
#include "models/ops.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "core/device.hpp"
#include "tests/checkpoint/helpers.hpp"

using namespace zero;
using namespace zero::checkpoint;
using namespace zero::checkpoint::test;
using Catch::Matchers::ContainsSubstring;

namespace {

// The parameter table models::make_gpt builds for `s` (the real model, on the cpu backend).
std::vector<ParamInfo> gpt_params(const models::GptShape& s) {
  auto device = make_device(DeviceKind::cpu);
  auto stream = device->create_stream("compute");
  auto ops = models::make_ops(*device, *stream);
  const Model m = models::make_gpt({s, ScalarType::f32, ScalarType::f32}, *ops);
  return param_table(m);
}

// Recognisable values for every parameter: value(p, e) = p + e / 1024.
std::vector<std::vector<float>> values_for(const std::vector<ParamInfo>& params) {
  std::vector<std::vector<float>> v;
  for (size_t p = 0; p < params.size(); ++p) {
    v.emplace_back(static_cast<size_t>(params[p].numel()));
    for (size_t e = 0; e < v.back().size(); ++e)
      v.back()[e] = static_cast<float>(p) + static_cast<float>(e) / 1024.0f;
  }
  return v;
}

// A safetensors file of arbitrary dtype tensors, written byte by byte (the writer under test
// writes F32 only): name -> (dtype, shape, raw bytes).
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
void write_raw(const std::string& path, const std::vector<RawTensor>& ts) {
  nlohmann::ordered_json h;
  h["__metadata__"] = {{"format", "pt"}};
  size_t off = 0;
  for (const RawTensor& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t n = text.size();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << text;
  for (const RawTensor& t : ts) f << t.bytes;
}
std::string f32_bytes(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// The tensors GPT2LMHeadModel.save_pretrained writes for `params` / `values`: "transformer."
// names, lm_head.weight = `head` (the tied wte unless changed), a BOOL causal mask and an F32
// masked_bias per block.
std::vector<RawTensor> hf_file(const std::vector<ParamInfo>& params,
                               const std::vector<std::vector<float>>& values, int n_layer,
                               int64_t positions, const std::vector<float>& head) {
  std::vector<RawTensor> ts;
  for (size_t p = 0; p < params.size(); ++p)
    ts.push_back({"transformer." + params[p].name, "F32", params[p].shape, f32_bytes(values[p])});
  ts.push_back({"lm_head.weight", "F32", params[0].shape, f32_bytes(head)});
  std::string mask;
  for (int64_t i = 0; i < positions; ++i)
    for (int64_t j = 0; j < positions; ++j) mask += static_cast<char>(j <= i ? 1 : 0);
  for (int l = 0; l < n_layer; ++l) {
    ts.push_back({"transformer.h." + std::to_string(l) + ".attn.bias", "BOOL", {1, 1, positions, positions}, mask});
    ts.push_back({"transformer.h." + std::to_string(l) + ".attn.masked_bias", "F32", {}, f32_bytes({-1e4f})});
  }
  return ts;
}

}  // namespace

TEST_CASE("hf_gpt2: the shape and config.json of a real GPT's parameter table") {
  const models::GptShape s{3, 48, 6, 50, 20};
  const std::vector<ParamInfo> params = gpt_params(s);
  CHECK(gpt_shape_from_params(params, 6) == s);

  const nlohmann::json j = nlohmann::json::parse(hf_gpt2_config_json(s));
  CHECK(j["architectures"] == nlohmann::json::array({"GPT2LMHeadModel"}));
  CHECK(j["model_type"] == "gpt2");
  CHECK(j["n_layer"] == 3);
  CHECK(j["n_embd"] == 48);
  CHECK(j["n_head"] == 6);
  CHECK(j["vocab_size"] == 50);
  CHECK(j["n_positions"] == 20);
  CHECK(j["n_ctx"] == 20);
  CHECK(j["n_inner"].is_null());
  CHECK(j["activation_function"] == "gelu_new");
  CHECK(j["layer_norm_epsilon"] == 1e-5);
  CHECK(j["tie_word_embeddings"] == true);
  CHECK(j["attn_pdrop"] == 0.0);
  CHECK(j["bos_token_id"].is_null());  // no <|endoftext|> in a 50-token vocabulary
  const nlohmann::json big = nlohmann::json::parse(hf_gpt2_config_json({12, 768, 12, 50257, 1024}));
  CHECK(big["eos_token_id"] == 50256);

  CHECK_THROWS_WITH(gpt_shape_from_params(params, 5),
                    ContainsSubstring("5 attention heads do not divide the hidden size 48"));
  std::vector<ParamInfo> other = params;
  other[7].shape = {48, 48};  // h.0.attn.c_proj.bias made a matrix
  CHECK_THROWS_WITH(gpt_shape_from_params(other, 6),
                    ContainsSubstring("parameter 7 is 'h.0.attn.c_proj.bias' [48, 48]") &&
                        ContainsSubstring("has 'h.0.attn.c_proj.bias' [48]"));
  CHECK_THROWS_WITH(gpt_shape_from_params(std::vector<ParamInfo>{{"w", {2, 2}}}, 1),
                    ContainsSubstring("do not start with a GPT-2's 'wte.weight'"));

  CHECK(recorded_n_head(R"({"engine": {}, "user": {"step": 3, "model": {"n_layer": 3, "n_head": 6}}})") == 6);
  CHECK(recorded_n_head(R"({"engine": {}, "user": {"step": 3}})") == std::nullopt);
  CHECK(recorded_n_head("not json") == std::nullopt);

  TempDir dir;
  write_hf_gpt2_config(dir / "config.json", s);
  std::ifstream in(dir / "config.json");
  CHECK(nlohmann::json::parse(in) == j);
}

TEST_CASE("hf_gpt2: import reads a save_pretrained file: prefixed names, tied head, buffers") {
  const models::GptShape s{2, 16, 2, 10, 8};
  const std::vector<ParamInfo> params = gpt_params(s);
  const auto values = values_for(params);
  TempDir dir;
  write_raw(dir / "hf.safetensors", hf_file(params, values, 2, 8, values[0]));
  CHECK(import_safetensors(dir / "hf.safetensors", params) == values);

  // An untied head: another model than ours; refused with the first differing element.
  std::vector<float> head = values[0];
  head[3] += 0.5f;
  write_raw(dir / "untied.safetensors", hf_file(params, values, 2, 8, head));
  CHECK_THROWS_WITH(import_safetensors(dir / "untied.safetensors", params),
                    ContainsSubstring("'lm_head.weight' differs from 'wte.weight' (first at element 3") &&
                        ContainsSubstring("HINT: start from a model saved with tie_word_embeddings true"));

  // One parameter under both names: which one is meant is not ours to guess.
  std::vector<RawTensor> both = hf_file(params, values, 2, 8, values[0]);
  both.push_back({"wpe.weight", "F32", params[1].shape, f32_bytes(values[1])});
  write_raw(dir / "both.safetensors", both);
  CHECK_THROWS_WITH(import_safetensors(dir / "both.safetensors", params),
                    ContainsSubstring("has both 'transformer.wpe.weight' and 'wpe.weight'"));

  // A parameter stored in a dtype the reader does not convert is named; n_positions mismatch hint.
  std::vector<RawTensor> ints = hf_file(params, values, 2, 8, values[0]);
  ints[2] = {"transformer.h.0.ln_1.weight", "I32", params[2].shape, f32_bytes(values[2])};
  write_raw(dir / "ints.safetensors", ints);
  CHECK_THROWS_WITH(import_safetensors(dir / "ints.safetensors", params),
                    ContainsSubstring("tensor 'transformer.h.0.ln_1.weight' has dtype \"I32\""));
  std::vector<ParamInfo> longer = params;
  longer[1].shape = {1024, 16};
  CHECK_THROWS_WITH(import_safetensors(dir / "hf.safetensors", longer),
                    ContainsSubstring("tensor 'transformer.wpe.weight' has shape [8, 16]") &&
                        ContainsSubstring("set zero_train.model.seq_len to it"));
}

TEST_CASE("safetensors: other dtypes are kept without data only when asked") {
  TempDir dir;
  write_raw(dir / "m.safetensors", {{"mask", "BOOL", {2, 2}, std::string("\1\0\1\1", 4)},
                                     {"w", "F32", {2}, f32_bytes({1.5f, -2.0f})},
                                     {"ids", "I64", {1}, std::string(8, '\0')}});
  CHECK_THROWS_WITH(read_safetensors(dir / "m.safetensors"),
                    ContainsSubstring("tensor 'mask' has dtype \"BOOL\""));
  const SafetensorsFile f = read_safetensors(dir / "m.safetensors", {.keep_other_dtypes = true});
  REQUIRE(f.tensors.size() == 3);
  CHECK((f.tensors[0].name == "mask" && !f.tensors[0].widened && f.tensors[0].data.empty()));
  CHECK(f.tensors[0].shape == std::vector<int64_t>{2, 2});
  CHECK((f.tensors[1].name == "w" && f.tensors[1].widened));
  CHECK(f.tensors[1].data == std::vector<float>{1.5f, -2.0f});
  CHECK((f.tensors[2].dtype == "I64" && !f.tensors[2].widened));
  // Offsets are still checked against the dtype's size: a BOOL mask of 5 bytes for 4 elements.
  write_raw(dir / "bad.safetensors", {{"mask", "BOOL", {2, 2}, std::string(5, '\1')}});
  CHECK_THROWS_WITH(read_safetensors(dir / "bad.safetensors", {.keep_other_dtypes = true}),
                    ContainsSubstring("spanning 5 bytes, but shape [2, 2] of BOOL needs 4"));
}
