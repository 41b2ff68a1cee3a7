// runtime/config/text.cpp: the distance behind "did you mean", byte sizes, number text.
#include <catch2/catch_test_macros.hpp>

#include <array>
#include <string_view>

#include "runtime/config/config.hpp"
#include "runtime/config/text.hpp"

using namespace zero::config;
using namespace zero::config::detail;

TEST_CASE("edit distance counts insertions, deletions, substitutions and swaps", "[text]") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("abc", "") == 3);
  CHECK(edit_distance("stage", "stage") == 0);
  CHECK(edit_distance("stgae", "stage") == 1);  // one adjacent swap
  CHECK(edit_distance("stag", "stage") == 1);
  CHECK(edit_distance("Stage", "stage") == 0);  // case-insensitive
  // "persitance" -> "persistence": insert an 's', turn the 'a' into an 'e'.
  CHECK(edit_distance("stage3_param_persitance_threshold", "stage3_param_persistence_threshold") ==
        2);
  CHECK(edit_distance("kitten", "sitting") == 3);
}

TEST_CASE("nearest picks the closest candidate, the first on ties", "[text]") {
  constexpr std::array<std::string_view, 4> keys{"enabled", "loss_scale", "loss_scale_window",
                                                 "hysteresis"};
  CHECK(nearest("loss_scale_windw", keys) == "loss_scale_window");
  CHECK(nearest("enable", keys) == "enabled");
  CHECK(nearest("loss_scal", keys) == "loss_scale");
  CHECK(nearest("zzz", std::array<std::string_view, 2>{"ab", "cd"}) == "ab");
  CHECK(nearest("x", std::span<const std::string_view>{}).empty());
}

TEST_CASE("key_distance counts words in another order as one edit", "[text]") {
  // DeepSpeedExamples' 10B config has "comm_overlap" for overlap_comm.
  CHECK(key_distance("comm_overlap", "overlap_comm") == 1);
  CHECK(key_distance("size_reduce_bucket", "reduce_bucket_size") == 1);
  CHECK(key_distance("stage3_persistence_param_threshold", "stage3_param_persistence_threshold") ==
        1);
  CHECK(key_distance("comm_overlpa", "overlap_comm") == 2);  // the swap, then a typo inside
  CHECK(key_distance("stgae", "stage") == 1);                // plain typos as before
  CHECK(key_distance("stage", "stage") == 0);
  CHECK(key_distance("Overlap_Comm", "comm_overlap") == 1);   // case-insensitive
  constexpr std::array<std::string_view, 4> zero_keys{"stage", "cpu_offload", "overlap_comm",
                                                      "reduce_scatter"};
  CHECK(nearest("comm_overlap", zero_keys) == "overlap_comm");
  CHECK(nearest("scatter_reduce", zero_keys) == "reduce_scatter");
  CHECK(is_close("batch_size_train", "train_batch_size"));
  CHECK(is_close("gradient_steps_accumulation", "gradient_accumulation_steps"));
}

TEST_CASE("is_close accepts typos, not unrelated words", "[text]") {
  CHECK(is_close("gradient_cliping", "gradient_clipping"));
  CHECK(is_close("trian_batch_size", "train_batch_size"));
  CHECK_FALSE(is_close("foo", "fp16"));
  CHECK_FALSE(is_close("my_custom_thing", "tensorboard"));
}

TEST_CASE("numbers read back as the same double", "[text]") {
  CHECK(format_number(1.0) == "1");
  CHECK(format_number(0.001) == "0.001");
  CHECK(format_number(1e-8) == "1e-08");
  CHECK(format_number(5e8) == "500000000");
  CHECK(format_number(1.25) == "1.25");
}
