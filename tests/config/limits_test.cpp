// runtime/config/limits.cpp and the bounds of single keys that keep later arithmetic exact:
// every number a config passes with is one the program can count, allocate and train with.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include "tests/config/helpers.hpp"

using namespace zero::config;
using namespace zero::config::test;
using Catch::Matchers::ContainsSubstring;
using Catch::Matchers::StartsWith;

namespace {

// `body` (after a valid batch unless it has batch keys of its own) must give exactly one error,
// at `path`; returns its message.
std::string one_error(std::string_view body, std::string_view path) {
  const bool batch = body.find("train_") != std::string_view::npos;
  const LoadResult r = batch ? parse("{" + std::string(body) + "}") : parse_with(body);
  INFO(body << "\n" << all(r));
  CHECK_FALSE(r.ok());
  CHECK(count(r, Severity::error) == 1);
  return message_at(r, path);
}

}  // namespace

TEST_CASE("learning rates above 1 are refused, with the reason", "[limits][lr]") {
  const char* why = "; Adam moves every weight by about lr per step, so a learning rate above 1 "
                    "destroys any model (typical values: 1e-5 to 1e-3)";
  CHECK(one_error(R"("optimizer": {"type": "AdamW", "params": {"lr": 1e30}})", "optimizer.params.lr") ==
        std::string("expected a number in [0, 1], got 1e+30") + why);
  CHECK(one_error(R"("optimizer": {"type": "AdamW", "params": {"lr": -3e-4}})", "optimizer.params.lr") ==
        "expected a number in [0, 1], got -0.0003");
  CHECK(one_error(R"("optimizer": {"type": "AdamW", "params": {"lr": "nan"}})", "optimizer.params.lr") ==
        "expected a number in [0, 1], got \"nan\" (a string)");
  // JSON has no NaN or Infinity literal: a syntax error naming the place.
  CHECK_THAT(message_at(parse(R"({"optimizer": {"type": "AdamW", "params": {"lr": NaN}}})"), ""),
             StartsWith("invalid JSON at line 1, column 50"));
  // Every schedule's lrs have the same bound.
  CHECK_THAT(one_error(R"("scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 5}})",
                       "scheduler.params.warmup_max_lr"),
             StartsWith("expected a number in [0, 1], got 5; Adam moves"));
  CHECK_THAT(one_error(R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 10}})",
                       "scheduler.params.cycle_max_lr"),
             StartsWith("expected a number in [0, 1], got 10;"));
  CHECK_THAT(one_error(R"("scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 2}})",
                       "scheduler.params.lr_range_test_min_lr"),
             StartsWith("expected a number in [0, 1], got 2;"));
  // The bound itself is allowed.
  CHECK(parse_with(R"("optimizer": {"type": "AdamW", "params": {"lr": 1}})").ok());
}

TEST_CASE("a model too large to count is refused at zero_train.model", "[limits][model]") {
  // 1000 layers of n_embd 2^20: 12 x 2^40 x 1000 ~ 1.3e16 parameters > 2^53.
  CHECK_THAT(one_error(R"("zero_train": {"model": {"n_layer": 1000, "n_embd": 1048576, "n_head": 1,
                           "vocab_size": 8, "seq_len": 8}})",
                       "zero_train.model"),
             StartsWith("the model has 13194") && ContainsSubstring("more than 2^53"));
  CHECK_THAT(one_error(R"("zero_train": {"model": {"preset": "tiny", "n_layer": 100001}})",
                       "zero_train.model.n_layer"),
             StartsWith("expected an integer in 1..100000, got 100001; far deeper"));
  CHECK(parse_with(R"("zero_train": {"model": {"preset": "zero-offload-10b"}})").ok());
}

TEST_CASE("one micro-batch's activations must be countable", "[limits][activations]") {
  // 2^20 sequences x 2^20 tokens x 2^20 vocabulary = 2^60 logits.
  CHECK_THAT(one_error(R"("train_micro_batch_size_per_gpu": 1048576, "zero_train": {"model": {
                           "n_layer": 1, "n_embd": 8, "n_head": 1, "vocab_size": 1048576,
                           "seq_len": 1048576}})",
                       "train_micro_batch_size_per_gpu"),
             StartsWith("1048576 sequences of 1048576 tokens make logits") &&
                 ContainsSubstring("lower the micro-batch"));
  // Attention grows with seq_len squared: 2^10 sequences x 4 heads x (2^21)^2 = 2^54 > 2^53.
  CHECK_THAT(one_error(R"("train_micro_batch_size_per_gpu": 1024, "zero_train": {"model": {
                           "n_layer": 1, "n_embd": 8, "n_head": 4, "vocab_size": 16,
                           "seq_len": 2097152}})",
                       "train_micro_batch_size_per_gpu"),
             ContainsSubstring("attention scores"));
}

TEST_CASE("the run's sample count must fit 64 bits", "[limits][steps]") {
  CHECK_THAT(one_error(R"("train_batch_size": 2147483647, "zero_train": {"steps": 9000000000000000000})",
                       "zero_train.steps"),
             ContainsSubstring("more than a 64-bit counter holds safely (2^62); use fewer steps"));
}
