// runtime/config/json_parse.cpp: the text -> Json step in linear time, numbers no double holds,
// nesting, duplicate keys listed then counted, and the command line's overrides.
//
// The million-key cases are the linear-time tests: nlohmann's ordered_json parser looks every
// new key up in its object's vector (n^2/2 string comparisons: hours for 10^6 keys), and the
// reader used to report every unknown key with a did-you-mean over all candidates. Here each
// case takes about a second; quadratic code runs into ctest's 300 s timeout. (No timing is
// asserted: the machine's load would make it flaky.)
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "tests/config/helpers.hpp"

using namespace zero::config;
using namespace zero::config::test;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;

namespace {

// {"train_batch_size": 8, <prefix>"k0": 0, "k1": 1, ...<suffix>}
std::string many_keys(int n, std::string_view prefix = "", std::string_view suffix = "",
                      bool same_key = false) {
  std::string text = "{\"train_batch_size\": 8, " + std::string(prefix);
  text.reserve(text.size() + static_cast<std::size_t>(n) * 16);
  for (int i = 0; i < n; ++i) {
    if (i) text += ", ";
    text += same_key ? "\"k\"" : "\"k" + std::to_string(i) + "\"";
    text += ": " + std::to_string(i);
  }
  return text + std::string(suffix) + "}";
}

}  // namespace

TEST_CASE("a number no double holds is one error naming its path, line and column", "[json]") {
  const LoadResult r = parse(
      "{\n  \"train_batch_size\": 8,\n  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e999}}\n}");
  INFO(all(r));
  CHECK_FALSE(r.ok());
  REQUIRE(r.diagnostics.size() == 1);
  CHECK(message_at(r, "optimizer.params.lr") ==
        "the number 1e999 at line 3, column 51 is too large for a 64-bit floating-point number; "
        "write a finite value");
  // Anywhere: in an ignored section, negative, inside a list.
  CHECK_THAT(message_at(parse(R"({"train_batch_size": 8, "wandb": {"x": [1, -2e400]}})"), "wandb.x[]"),
             StartsWith("the number -2e400 at line 1, column 44 is too large"));
  // Tiny numbers are not an error: they round to 0 like in any JSON reader.
  CHECK(parse(R"({"train_batch_size": 8, "gradient_clipping": 1e-999})").ok());
}

TEST_CASE("nesting deeper than a config can be is refused before anything recurses", "[json]") {
  const std::string deep = "{\"train_batch_size\": 8, \"x\": " + std::string(100000, '[') +
                           std::string(100000, ']') + "}";
  const LoadResult r = parse(deep);
  CHECK_FALSE(r.ok());
  REQUIRE(r.diagnostics.size() == 1);
  CHECK_THAT(r.diagnostics[0].message,
             ContainsSubstring("nested more than 64 levels deep; a DeepSpeed config is a few levels "
                               "deep: is this the right file?"));
  CHECK_THAT(r.diagnostics[0].path, StartsWith("x[][]"));
  // 60 levels in an ignored section are fine.
  const std::string ok = "{\"train_batch_size\": 8, \"x\": " + std::string(60, '[') +
                         std::string(60, ']') + "}";
  CHECK(parse(ok).ok());
}

TEST_CASE("a million unknown top-level keys: 20 warnings and a count, in linear time",
          "[json][linear]") {
  const LoadResult r = parse(many_keys(1'000'000));
  CHECK(r.ok());  // DeepSpeed ignores unknown top-level keys: a warning each, not an error
  CHECK(r.config.batch.train_batch_size == 8);
  REQUIRE(r.diagnostics.size() == 21);
  CHECK(message_at(r, "k0", Severity::warning) == "unknown key, ignored (DeepSpeed ignores it too)");
  CHECK(message_at(r, "k19", Severity::warning) == "unknown key, ignored (DeepSpeed ignores it too)");
  CHECK(message_at(r, "k20", Severity::warning).empty());
  CHECK(message_at(r, "", Severity::warning) ==
        "999980 more unknown keys in the top-level object (not listed), ignored");
}

TEST_CASE("a million unknown keys inside a block: 20 errors and a count, in linear time",
          "[json][linear]") {
  const LoadResult r = parse(many_keys(1'000'000, "\"zero_optimization\": {\"stage\": 1, ", "}"));
  CHECK_FALSE(r.ok());
  REQUIRE(count(r, Severity::error) == 21);
  CHECK_THAT(message_at(r, "zero_optimization.k0"), StartsWith("unknown key; did you mean"));
  CHECK(message_at(r, "zero_optimization") ==
        "999980 more unknown keys in 'zero_optimization' (not listed); remove them");
}

TEST_CASE("a million duplicate keys: 20 errors and a count, in linear time", "[json][linear]") {
  const LoadResult r = parse(many_keys(1'000'000, "", "", /*same_key=*/true));
  CHECK_FALSE(r.ok());
  const char* msg = "duplicate key: it appears twice in the same object (DeepSpeed rejects this "
                    "too); keep one";
  std::size_t listed = 0;
  for (const Diagnostic& d : r.diagnostics) listed += d.path == "k" && d.message == msg ? 1 : 0;
  CHECK(listed == 20);
  CHECK(message_at(r, "") == "999979 more duplicate keys (not listed); keep one of each");
}

TEST_CASE("overrides replace part of the file before it is read", "[json][overrides]") {
  Environment env;
  env.overrides.push_back({"zero_train.model", R"({"preset": "gpt2-124m"})", "--model gpt2-124m"});
  env.overrides.push_back({"seed", "7", "--seed"});
  // Derived values follow the override: "auto" bucket sizes come from the new n_embd.
  const LoadResult r = parse(R"({"train_batch_size": 8, "seed": 1,
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
      "zero_train": {"model": {"preset": "tiny"}, "steps": 3}})",
                             env);
  INFO(all(r));
  REQUIRE(r.ok());
  CHECK(r.config.seed == 7);
  CHECK(r.config.ours.model_preset == "gpt2-124m");
  CHECK(r.config.zero.reduce_bucket_size == 768LL * 768);
  CHECK(r.config.ours.steps == 3);  // the rest of zero_train stays
  // Parents are created when the file has none.
  Environment device;
  device.overrides.push_back({"zero_train.device", "\"cpu\"", "--device"});
  const LoadResult d = parse(R"({"train_batch_size": 8})", device);
  REQUIRE(d.ok());
  CHECK(d.config.ours.device == zero::DeviceKind::cpu);
  // A bad value names the flag and the path it was for.
  Environment bad;
  bad.overrides.push_back({"zero_train.model", "{\"n_layer\": 2,}", "--model m.json"});
  const LoadResult b = parse(R"({"train_batch_size": 8})", bad);
  CHECK_FALSE(b.ok());
  CHECK_THAT(message_at(b, "zero_train.model"),
             StartsWith("--model m.json: invalid JSON at line 1, column 15:"));
  // A parent that is not an object in the file is left for the reader to report.
  const LoadResult p = parse(R"({"train_batch_size": 8, "zero_train": 5})", device);
  CHECK(message_at(p, "zero_train") == "expected an object, got 5");
}
