// Between checkpoints and safetensors: a checkpoint's array exported as whole tensors (from a
// save sliced over 3 ranks), then imported as a model's parameters; mismatches are named.
#include "runtime/checkpoint/checkpoint.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "runtime/checkpoint/safetensors.hpp"
#include "tests/checkpoint/helpers.hpp"

using namespace zero::checkpoint;
using namespace zero::checkpoint::test;
using Catch::Matchers::ContainsSubstring;

TEST_CASE("export: a sliced checkpoint's array becomes one whole tensor per parameter") {
  TempDir dir;
  const auto params = model_params();
  FakeSave s;
  s.params = params;
  s.world = 3;
  s.pieces = [&](int r) { return dealt(params, 3, r, 11); };
  s.run(dir.path, "t");
  export_safetensors(dir.path, "t", "exp_avg", dir / "w.safetensors");

  const SafetensorsFile f = read_safetensors(dir / "w.safetensors");
  CHECK(f.metadata == std::vector<std::pair<std::string, std::string>>{
                          {"format", "pt"}, {"zero_checkpoint", "t"}, {"zero_array", "exp_avg"}});
  REQUIRE(f.tensors.size() == params.size());
  for (size_t p = 0; p < params.size(); ++p) {
    INFO(params[p].name);
    // Written in table order, so the data order is the table order.
    CHECK(f.tensors[p].name == params[p].name);
    CHECK(f.tensors[p].shape == params[p].shape);
    std::vector<float> want;
    for (int64_t e = 0; e < params[p].numel(); ++e)
      want.push_back(value(1, static_cast<int>(p), e));
    CHECK(f.tensors[p].data == want);
  }

  // Imported back as the model's parameters (in table order, whatever the file's order).
  std::vector<ParamInfo> reordered(params.rbegin(), params.rend());
  const auto values = import_safetensors(dir / "w.safetensors", reordered);
  REQUIRE(values.size() == reordered.size());
  CHECK(values[0] == f.tensors[params.size() - 1].data);
  CHECK(values.back() == f.tensors[0].data);

  CHECK_THROWS_WITH(export_safetensors(dir.path, "t", "momentum", dir / "m.safetensors"),
                    ContainsSubstring("has no array 'momentum'"));
}

TEST_CASE("export: import names the missing or misshapen parameter; extra tensors are ignored") {
  TempDir dir;
  const std::vector<float> v(12, 1.0f);
  const std::vector<TensorRef> ts{
      {"a", {3, 4}, v.data()}, {"b", {2}, v.data()}, {"mask", {1}, v.data()}};
  write_safetensors(dir / "w.safetensors", ts);
  const std::vector<ParamInfo> ok{{"b", {2}}, {"a", {3, 4}}};
  const auto values = import_safetensors(dir / "w.safetensors", ok);
  CHECK(values == std::vector<std::vector<float>>{std::vector<float>(2, 1.0f), v});
  CHECK_THROWS_WITH(import_safetensors(dir / "w.safetensors", std::vector<ParamInfo>{{"c", {2}}}),
                    ContainsSubstring("w.safetensors") && ContainsSubstring("has no tensor 'c'"));
  CHECK_THROWS_WITH(
      import_safetensors(dir / "w.safetensors", std::vector<ParamInfo>{{"a", {4, 3}}}),
      ContainsSubstring("w.safetensors") &&
          ContainsSubstring("tensor 'a' has shape [3, 4], the model's parameter [4, 3]"));
}
