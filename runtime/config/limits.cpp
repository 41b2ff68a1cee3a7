#include "runtime/config/limits.hpp"

#include <climits>
#include <string>

#include "runtime/config/text.hpp"

namespace zero::config::detail {
namespace {

// Products of config values in 128 bits: each factor is at most 2^63, and no product below has
// more than two factors of that size before it is compared.
__extension__ typedef __int128 Wide;  // (__extension__: -Wpedantic knows it is deliberate)

std::string text(Wide v) {
  if (v <= static_cast<Wide>(LLONG_MAX)) return std::to_string(static_cast<long long>(v));
  return format_number(static_cast<double>(v));
}

}  // namespace

void check_sizes(const Config& c, std::vector<Diagnostic>& d) {
  const auto error = [&d](std::string path, std::string message) {
    d.push_back({Diagnostic::Severity::error, std::move(path), std::move(message)});
  };
  const models::GptShape& s = c.ours.model;
  const Wide L = s.n_layer, C = s.n_embd, H = s.n_head, V = s.vocab_size, T = s.seq_len;
  const Wide B = c.batch.train_micro_batch_size_per_gpu;
  if (L < 1 || C < 1 || H < 1 || V < 1 || T < 1) return;  // reported where the shape is read

  // GPT-2 layout (models/gpt.cpp): embeddings, per block 12 C^2 + 13 C, the final LayerNorm.
  const Wide params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
  if (params > kMaxElements)
    error("zero_train.model",
          "the model has " + text(params) + " parameters (n_layer " + std::to_string(s.n_layer) +
              ", n_embd " + std::to_string(s.n_embd) + ", vocab_size " +
              std::to_string(s.vocab_size) + ", seq_len " + std::to_string(s.seq_len) +
              "), more than 2^53 (" + text(kMaxElements) +
              "): no machine holds that; check the model's sizes");

  // One micro-batch's largest tensors, each allocated whole.
  struct Activation {
    const char* what;
    Wide elements;
  };
  const Activation acts[] = {
      {"logits (micro-batch x seq_len x vocab_size)", B * T * V},
      {"attention scores (micro-batch x n_head x seq_len x seq_len)", B * H * T * T},
      {"MLP activations (micro-batch x seq_len x 4 n_embd)", B * T * 4 * C},
  };
  for (const Activation& a : acts) {
    if (a.elements <= kMaxElements) continue;
    error("train_micro_batch_size_per_gpu",
          std::to_string(c.batch.train_micro_batch_size_per_gpu) + " sequences of " +
              std::to_string(s.seq_len) + " tokens make " + a.what + " of " + text(a.elements) +
              " elements, more than 2^53 (" + text(kMaxElements) +
              "): no machine holds that; lower the micro-batch (raise "
              "gradient_accumulation_steps instead) or zero_train.model.seq_len");
    break;  // one paragraph: the largest fix is the same
  }

  // The run's samples are numbered (step - 1) x train_batch_size + ... in 64-bit integers.
  const Wide samples = static_cast<Wide>(c.ours.steps) * c.batch.train_batch_size;
  if (samples > (static_cast<Wide>(1) << 62))
    error("zero_train.steps",
          std::to_string(c.ours.steps) + " steps of " + std::to_string(c.batch.train_batch_size) +
              " samples number " + text(samples) +
              " samples, more than a 64-bit counter holds safely (2^62); use fewer steps");
}

}  // namespace zero::config::detail
