// The shape of a GPT-style decoder (GPT-2 layout: learned positions, pre-norm blocks, tied
// embedding and head), and the named presets a config may ask for ("zero_train.model.preset").
// Header-only: a value type and a constant table, no state. Thread-safe.
#pragma once

#include <array>
#include <optional>
#include <string_view>

namespace zero::models {

struct GptShape {
  int n_layer = 0;     // transformer blocks
  int n_embd = 0;      // hidden size h (the "auto" bucket sizes are derived from it)
  int n_head = 0;      // attention heads; n_embd must be divisible by it
  int vocab_size = 0;  // token ids 0..vocab_size-1
  int seq_len = 0;     // context length (positions)

  friend bool operator==(const GptShape&, const GptShape&) = default;
};

struct GptPreset {
  std::string_view name;
  GptShape shape;
};

// "tiny" is the default model: the embedded toy task trains it in seconds on a laptop.
// "zero-offload-10b" is the 10B model of the ZeRO-Offload paper (50 x 4096, 32 heads).
inline constexpr std::array<GptPreset, 6> kGptPresets{{
    {"tiny", {2, 128, 4, 64, 64}},
    {"gpt2-124m", {12, 768, 12, 50257, 1024}},
    {"gpt2-350m", {24, 1024, 16, 50257, 1024}},
    {"gpt2-774m", {36, 1280, 20, 50257, 1024}},
    {"gpt2-1.5b", {48, 1600, 25, 50257, 1024}},
    {"zero-offload-10b", {50, 4096, 32, 50257, 1024}},
}};

// The preset called `name` (exact, case-sensitive), or nullopt.
constexpr std::optional<GptShape> gpt_preset(std::string_view name) noexcept {
  for (const GptPreset& p : kGptPresets)
    if (p.name == name) return p.shape;
  return std::nullopt;
}

// The preset names, in table order (for "expected one of ..." messages and --help).
constexpr std::array<std::string_view, kGptPresets.size()> gpt_preset_names() noexcept {
  std::array<std::string_view, kGptPresets.size()> names{};
  for (std::size_t i = 0; i < kGptPresets.size(); ++i) names[i] = kGptPresets[i].name;
  return names;
}

}  // namespace zero::models
