// The batch-size rule (runtime/config/batch.cpp): train_batch_size = micro x accumulation x W.
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "tests/config/helpers.hpp"

using namespace zero::config;
using namespace zero::config::test;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;

namespace {

struct Triple {
  long long tb, micro, accum;
};

Triple batch_of(const LoadResult& r) {
  const Batch& b = r.config.batch;
  return {b.train_batch_size, b.train_micro_batch_size_per_gpu, b.gradient_accumulation_steps};
}

// Parses `body` on `w` ranks and expects it valid with exactly these three numbers.
void expect_batch(std::string_view body, int w, long long tb, long long micro, long long accum,
                  const Environment& base = {}) {
  Environment env = base;
  env.world_size = w;
  const LoadResult r = parse("{" + std::string(body) + "}", env);
  INFO(body << " on " << w << " ranks\n" << all(r));
  REQUIRE(r.ok());
  const Triple t = batch_of(r);
  CHECK(t.tb == tb);
  CHECK(t.micro == micro);
  CHECK(t.accum == accum);
}

// Parses `body` on `w` ranks and expects exactly one error, at train_batch_size.
std::string batch_error(std::string_view body, int w, const Environment& base = {}) {
  Environment env = base;
  env.world_size = w;
  const LoadResult r = parse("{" + std::string(body) + "}", env);
  INFO(body << " on " << w << " ranks\n" << all(r));
  CHECK_FALSE(r.ok());
  CHECK(count(r, Severity::error) == 1);
  return message_at(r, "train_batch_size");
}

}  // namespace

TEST_CASE("all three batch keys given: they must agree with the world size", "[batch]") {
  const char* body =
      R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1)";
  expect_batch(body, 4, 16, 4, 1);
  CHECK(batch_error(body, 2) ==
        "train_batch_size 16 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 1 "
        "x data-parallel world size 2 (= 8); fix one of them or remove train_batch_size to let "
        "it be derived");
  CHECK(batch_error(body, 1) ==
        "train_batch_size 16 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 1 "
        "x data-parallel world size 1 (= 4); fix one of them or remove train_batch_size to let "
        "it be derived");
  expect_batch(
      R"("train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8)",
      2, 64, 4, 8);
}

TEST_CASE("train_batch_size and micro-batch give the accumulation", "[batch]") {
  expect_batch(R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4)", 1, 32, 4, 8);
  expect_batch(R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4)", 2, 32, 4, 4);
  expect_batch(R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 4)", 4, 32, 4, 2);
  CHECK(batch_error(R"("train_batch_size": 10, "train_micro_batch_size_per_gpu": 4)", 2) ==
        "train_batch_size 10 != train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps "
        "1.25 (derived; must be a whole number >= 1) x data-parallel world size 2; make "
        "train_batch_size a multiple of 8 (micro-batch x world size) or remove it to let it be "
        "derived");
  // Smaller than one micro-batch per rank: accumulation would be below 1.
  CHECK_THAT(batch_error(R"("train_batch_size": 4, "train_micro_batch_size_per_gpu": 4)", 2),
             ContainsSubstring("gradient_accumulation_steps 0.5 (derived"));
}

TEST_CASE("train_batch_size and accumulation give the micro-batch", "[batch]") {
  expect_batch(R"("train_batch_size": 32, "gradient_accumulation_steps": 2)", 4, 32, 4, 2);
  expect_batch(R"("train_batch_size": 32, "gradient_accumulation_steps": 2)", 2, 32, 8, 2);
  CHECK(batch_error(R"("train_batch_size": 12, "gradient_accumulation_steps": 2)", 4) ==
        "train_batch_size 12 != train_micro_batch_size_per_gpu 1.5 (derived; must be a whole "
        "number >= 1) x gradient_accumulation_steps 2 x data-parallel world size 4; make "
        "train_batch_size a multiple of 8 (accumulation x world size) or give "
        "train_micro_batch_size_per_gpu");
}

TEST_CASE("train_batch_size alone means accumulation 1", "[batch]") {
  expect_batch(R"("train_batch_size": 8)", 1, 8, 8, 1);
  expect_batch(R"("train_batch_size": 8)", 2, 8, 4, 1);
  expect_batch(R"("train_batch_size": 8)", 4, 8, 2, 1);
  CHECK(batch_error(R"("train_batch_size": 6)", 4) ==
        "train_batch_size 6 != train_micro_batch_size_per_gpu 1.5 (derived; must be a whole "
        "number >= 1) x gradient_accumulation_steps 1 (the default) x data-parallel world size "
        "4; make train_batch_size a multiple of 4 (the world size) or give "
        "train_micro_batch_size_per_gpu instead");
}

TEST_CASE("micro-batch with or without accumulation gives train_batch_size", "[batch]") {
  expect_batch(R"("train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3)", 2, 24,
               4, 3);
  expect_batch(R"("train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3)", 4, 48,
               4, 3);
  expect_batch(R"("train_micro_batch_size_per_gpu": 4)", 1, 4, 4, 1);
  expect_batch(R"("train_micro_batch_size_per_gpu": 4)", 4, 16, 4, 1);
}

TEST_CASE("accumulation alone or no batch key at all is an error, as in DeepSpeed", "[batch]") {
  CHECK(batch_error(R"("gradient_accumulation_steps": 4)", 1) ==
        "missing: give train_batch_size or train_micro_batch_size_per_gpu "
        "(gradient_accumulation_steps alone does not fix the batch size); DeepSpeed needs one of "
        "them too");
  CHECK(batch_error(R"("steps_per_print": 5)", 2) ==
        "missing: give train_batch_size or train_micro_batch_size_per_gpu; DeepSpeed needs one of "
        "them too");
}

TEST_CASE("batch keys set to \"auto\": derived, else micro-batch 1 and accumulation 1", "[batch][auto]") {
  const char* all_auto =
      R"("train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto")";
  expect_batch(all_auto, 1, 1, 1, 1);
  expect_batch(all_auto, 2, 2, 1, 1);
  expect_batch(all_auto, 4, 4, 1, 1);
  // Only accumulation known, one key "auto": micro-batch 1.
  expect_batch(R"("gradient_accumulation_steps": 4, "train_micro_batch_size_per_gpu": "auto")", 2,
               8, 1, 4);
  // A known train_batch_size still decides: the auto keys are derived from it.
  expect_batch(R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto")",
               4, 32, 8, 1);
  expect_batch(R"("train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2)",
               2, 16, 4, 2);
}

TEST_CASE("command-line flags fill absent or auto batch keys and must agree with the file",
          "[batch][flags]") {
  Environment env;
  env.micro_batch_flag = 8;
  env.grad_accum_flag = 2;
  expect_batch(R"("train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto")", 2, 32, 8,
               2, env);
  expect_batch(R"("steps_per_print": 1)", 1, 16, 8, 2, env);

  Environment micro_only;
  micro_only.micro_batch_flag = 4;
  expect_batch(R"("train_batch_size": 16)", 2, 16, 4, 2, micro_only);

  const LoadResult r = parse(R"({"train_micro_batch_size_per_gpu": 4})", env);
  CHECK(message_at(r, "train_micro_batch_size_per_gpu") ==
        "the file says 4 but --micro-batch says 8; remove one of them (or set the key to \"auto\" "
        "to take the flag)");

  Environment bad;
  bad.micro_batch_flag = 0;
  const LoadResult z = parse(R"({"train_batch_size": 8})", bad);
  CHECK(message_at(z, "") == "--micro-batch 0: expected an integer in 1..2147483647");
}

TEST_CASE("batch values must be positive integers; a bad one is reported once", "[batch]") {
  const auto one_error = [](std::string_view body, std::string_view path, std::string_view msg) {
    const LoadResult r = parse("{" + std::string(body) + "}");
    INFO(all(r));
    CHECK(count(r, Severity::error) == 1);
    CHECK(message_at(r, path) == msg);
  };
  one_error(R"("train_batch_size": 0)", "train_batch_size", "expected an integer in 1..2147483647, got 0");
  one_error(R"("train_micro_batch_size_per_gpu": -2)", "train_micro_batch_size_per_gpu",
            "expected an integer in 1..2147483647, got -2");
  one_error(R"("train_micro_batch_size_per_gpu": 2.5)", "train_micro_batch_size_per_gpu",
            "expected an integer in 1..2147483647, got 2.5");
  one_error(R"("train_batch_size": "8")", "train_batch_size",
            "expected an integer in 1..2147483647, got \"8\" (a string)");
  one_error(R"("train_batch_size": 8, "gradient_accumulation_steps": true)",
            "gradient_accumulation_steps", "expected an integer in 1..2147483647, got true (a boolean)");
  // An integral float is an integer.
  expect_batch(R"("train_batch_size": 8.0, "train_micro_batch_size_per_gpu": 2e0)", 1, 8, 2, 4);
}

TEST_CASE("batch values and products beyond 32 bits are refused", "[batch][limits]") {
  // Each key alone: at most 2^31 - 1 (the engine counts accumulation steps and micro-batch rows
  // in 32-bit integers); the message says why.
  const auto key_error = [](std::string_view body, std::string_view path, std::string_view got) {
    const LoadResult r = parse("{" + std::string(body) + "}");
    INFO(all(r));
    CHECK(count(r, Severity::error) == 1);
    CHECK_THAT(message_at(r, path),
               StartsWith("expected an integer in 1..2147483647, got " + std::string(got) + "; ") &&
                   ContainsSubstring("32-bit"));
  };
  key_error(R"("train_batch_size": 2147483648)", "train_batch_size", "2147483648");
  key_error(R"("train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 4294967296)",
            "gradient_accumulation_steps", "4294967296");
  key_error(R"("train_micro_batch_size_per_gpu": 4e18)", "train_micro_batch_size_per_gpu", "4e+18");
  // Past 64 bits JSON gives a float, which is no integer here: the plain type message.
  CHECK(message_at(parse(R"({"train_micro_batch_size_per_gpu": 18446744073709551616})"),
                   "train_micro_batch_size_per_gpu") ==
        "expected an integer in 1..2147483647, got 1.8446744073709552e+19");
  // The largest value itself is fine.
  expect_batch(R"("train_batch_size": 2147483647)", 1, 2147483647, 2147483647, 1);
  // Each in range, the product not: one error printing the four numbers.
  CHECK(batch_error(R"("train_micro_batch_size_per_gpu": 65536, "gradient_accumulation_steps": 65536)",
                    1) ==
        "train_micro_batch_size_per_gpu 65536 x gradient_accumulation_steps 65536 x data-parallel "
        "world size 1 = 4294967296 samples per step, more than zero-train counts (2147483647); use "
        "a smaller micro-batch or accumulation");
  CHECK_THAT(batch_error(R"("train_micro_batch_size_per_gpu": 1073741824)", 4),
             ContainsSubstring("x data-parallel world size 4 = 4294967296 samples per step"));
  Environment flags;
  flags.grad_accum_flag = 4294967296LL;
  CHECK(message_at(parse(R"({"train_batch_size": 8})", flags), "") ==
        "--grad-accum 4294967296: expected an integer in 1..2147483647");
}

TEST_CASE("the batch file of the cli tests: valid on 4 ranks, the four numbers on 2",
          "[batch][files]") {
  const int w = GENERATE(1, 2, 4);
  const LoadResult r = load_config_file(data_file("batch_mismatch_np2.json"), world(w));
  INFO(all(r));
  if (w == 4) {
    REQUIRE(r.ok());
    CHECK(r.config.batch.train_batch_size == 16);
  } else {
    CHECK_FALSE(r.ok());
    CHECK_THAT(message_at(r, "train_batch_size"),
               ContainsSubstring("train_batch_size 16 != train_micro_batch_size_per_gpu 4 x "
                                 "gradient_accumulation_steps 1 x data-parallel world size " +
                                 std::to_string(w)));
  }
}
