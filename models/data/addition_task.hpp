// AdditionTask: the embedded default dataset. Multi-digit addition as character-level text,
// generated on the fly (nothing to download), whose learning is measurable as exact-match
// accuracy on problems the model never trained on.
//
// One problem with digits = 2 reads "07+45=250\n": operands zero-padded to `digits`, then the
// sum (52) zero-padded to digits + 1 and written REVERSED, least significant digit first. A
// causal model writes the answer left to right; reversed, each digit depends only on the operand
// digits at its place and the carry out of the previous one, which it has just written. A small
// transformer learns that far more easily than most-significant-first, where the first digit
// already depends on every carry.
//
// A sequence of seq_len tokens packs as many whole problems as fit in seq_len + 1 characters
// (the inputs are characters [0, seq_len), the targets the same shifted by one); the leftover
// tail is padding. Targets are -1 everywhere except at the positions that predict an answer
// digit, so the loss and the accuracy measure the sum only, never the randomly drawn operands.
// Exact layout, vocabulary, split and drawing: docs/data-formats.md.
//
// Train / held-out split: each problem (a, b) is in exactly one of the two sets, decided by a
// seeded bijective hash of its index a * 10^digits + b; training sequences only draw training
// problems and held_out_batch() only held-out ones. Problem draws are a counter-based hash of
// (seed, sequence index, slot): no generator state, so any range is produced independently.
//
// Thread-safety: immutable after construction; every member may be called concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/data/dataset.hpp"

namespace zero::models::data {

struct AdditionOptions {
  int digits = 2;                  // operand digits, 1..6
  uint64_t seed = 0;               // keys the split and the draws
  double held_out_fraction = 0.1;  // share of all problems kept out of training, [0, 1)
};

// Exact-match accuracy over the problems of a batch.
struct AdditionScore {
  int64_t problems = 0;  // problems whose answer the batch holds
  int64_t correct = 0;   // of those, problems with every answer digit predicted right
};

class AdditionTask final : public Dataset {
 public:
  // Vocabulary: '0'..'9' are ids 0..9, then '+' 10, '=' 11, '\n' 12, and '_' 13 for padding.
  static constexpr int kVocabSize = 14;
  static constexpr int kMinDigits = 1, kMaxDigits = 6;

  // Throws zero::Error for options out of range (the message names the option and the range).
  explicit AdditionTask(AdditionOptions options = {});

  int vocab_size() const noexcept override { return kVocabSize; }
  std::string describe() const override;

  // Training sequences (training problems only). batch.item is filled: see TokenBatch.
  // Throws zero::Error when seq_len < min_seq_len() or the range is negative.
  TokenBatch batch(int64_t first_sequence, int count, int seq_len) const override;
  // Held-out sequences: the same layout and determinism, drawing only held-out problems (a
  // stream of its own: held_out_batch(i) shares nothing with batch(i)). Throws zero::Error when
  // held_out_fraction is 0.
  TokenBatch held_out_batch(int64_t first_sequence, int count, int seq_len) const;
  // The held-out set itself, each problem once, in a fixed order (for evaluation): held-out
  // problem j, j in [0, num_held_out()), is the j-th of the split's order (the same seeded
  // permutation that chose the set, so any prefix is a uniform sample of it); sequence i holds
  // problems i*k .. i*k + k - 1 (k = problems_per_sequence(seq_len)), the last sequence only those
  // that remain, then padding. held_out_set_size(seq_len) = ceil(num_held_out() / k) sequences.
  // Depends on the seed (which problems are held out) and seq_len only. Throws zero::Error when
  // held_out_fraction is 0, seq_len < min_seq_len(), or the range leaves the set.
  int64_t held_out_set_size(int seq_len) const;
  TokenBatch held_out_set_batch(int64_t first_sequence, int count, int seq_len) const;

  // Scores teacher-forced predictions: `predictions` [rows*cols] holds the model's argmax token
  // at every position of `batch` (which must come from batch() or held_out_batch()). A problem
  // is correct when all of its answer positions are predicted right. With a causal model this
  // equals exact match under greedy decoding (see the .cpp for why). Throws zero::Error when the
  // sizes disagree or batch.item is empty.
  static AdditionScore score(const TokenBatch& batch, std::span<const int32_t> predictions);

  // Text <-> token ids, for logs and tests. decode writes '?' for an id outside the vocabulary
  // (e.g. a -1 target); encode throws zero::Error naming a character outside it.
  static std::string decode(std::span<const int32_t> tokens);
  static std::vector<int32_t> encode(std::string_view text);

  const AdditionOptions& options() const noexcept { return options_; }
  int problem_length() const noexcept { return 3 * options_.digits + 4; }  // "a+b=sum\n"
  int min_seq_len() const noexcept { return problem_length() - 1; }
  int problems_per_sequence(int seq_len) const noexcept { return (seq_len + 1) / problem_length(); }
  int64_t num_problems() const noexcept { return num_problems_; }  // 10^(2 digits)
  int64_t num_held_out() const noexcept { return num_held_out_; }
  bool is_held_out(int64_t a, int64_t b) const;            // a, b in [0, 10^digits)
  std::string format_problem(int64_t a, int64_t b) const;  // e.g. "07+45=250\n"

 private:
  enum class Split { train, held_out, held_out_set };
  TokenBatch make_batch(Split split, int64_t first_sequence, int count, int seq_len) const;
  int64_t draw_problem(Split split, int64_t sequence, int slot) const;  // a * 10^digits + b

  AdditionOptions options_;
  int64_t operand_limit_ = 0;  // 10^digits
  int64_t num_problems_ = 0;
  int64_t num_held_out_ = 0;
  detail::IndexPermutation
      split_;  // problem rank -> problem index; ranks < num_held_out_ are held out
};

}  // namespace zero::models::data
