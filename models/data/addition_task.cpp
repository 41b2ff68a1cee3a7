#include "models/data/addition_task.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/error.hpp"

namespace zero::models::data {

namespace {

constexpr int32_t kPlus = 10, kEquals = 11, kNewline = 12, kPad = 13;
constexpr char kChars[AdditionTask::kVocabSize + 1] = "0123456789+=\n_";

// Stream keys: the split and the two draw streams must not share hash inputs.
enum : uint64_t { kSplitStream = 1, kTrainStream = 2, kHeldOutStream = 3 };

int64_t pow10(int e) {
  int64_t p = 1;
  while (e-- > 0) p *= 10;
  return p;
}

// Writes `value` as `width` decimal digits, zero padded, most significant first (or least
// significant first when `reversed`).
void put_digits(int32_t* out, int64_t value, int width, bool reversed) {
  for (int i = 0; i < width; ++i) {
    const auto digit = static_cast<int32_t>(value % 10);
    value /= 10;
    out[reversed ? i : width - 1 - i] = digit;
  }
}

void check_range(const char* what, int64_t first_sequence, int count) {
  ZERO_REQUIRE(first_sequence >= 0 && count >= 0 &&
                   first_sequence <= std::numeric_limits<int64_t>::max() - count,
               std::string(what) + ": sequence range [" + std::to_string(first_sequence) + ", +" +
                   std::to_string(count) + ") is invalid; first_sequence and count must be >= 0");
}

}  // namespace

AdditionTask::AdditionTask(AdditionOptions options)
    : options_(options), split_(1, 0) {  // replaced below, once the option checks have passed
  ZERO_REQUIRE(options_.digits >= kMinDigits && options_.digits <= kMaxDigits,
               "addition task: digits is " + std::to_string(options_.digits) + "; it must be " +
                   std::to_string(kMinDigits) + ".." + std::to_string(kMaxDigits) +
                   "\nHINT: a 6-digit problem is already 22 characters, so the tiny preset's "
                   "64-token context holds only two of them");
  const double f = options_.held_out_fraction;
  ZERO_REQUIRE(std::isfinite(f) && f >= 0.0 && f < 1.0,
               "addition task: held_out_fraction is " + std::to_string(f) +
                   "; it must be in [0, 1)\nHINT: 0 disables the held-out set; 0.1 is the default");
  operand_limit_ = pow10(options_.digits);
  num_problems_ = operand_limit_ * operand_limit_;
  // Rounded, but a positive fraction keeps at least one problem out, so that asking for a
  // held-out set always gets one.
  num_held_out_ = std::llround(f * static_cast<double>(num_problems_));
  if (f > 0.0 && num_held_out_ == 0) num_held_out_ = 1;
  ZERO_REQUIRE(num_held_out_ < num_problems_,
               "addition task: held_out_fraction " + std::to_string(f) + " with digits " +
                   std::to_string(options_.digits) + " holds out all " +
                   std::to_string(num_problems_) + " problems, leaving none to train on" +
                   "\nHINT: lower held_out_fraction or raise digits");
  split_ = detail::IndexPermutation(static_cast<uint64_t>(num_problems_),
                                    detail::hash_counters(options_.seed, kSplitStream));
}

std::string AdditionTask::describe() const {
  return "addition task: " + std::to_string(options_.digits) + "-digit operands, sum reversed (\"" +
         std::string(format_problem(7 % operand_limit_, 45 % operand_limit_), 0,
                     problem_length() - 1) +
         "\"), vocab " + std::to_string(kVocabSize) + ", " +
         std::to_string(num_problems_ - num_held_out_) + " training / " +
         std::to_string(num_held_out_) + " held-out problems, seed " +
         std::to_string(options_.seed);
}

TokenBatch AdditionTask::batch(int64_t first_sequence, int count, int seq_len) const {
  return make_batch(Split::train, first_sequence, count, seq_len);
}

TokenBatch AdditionTask::held_out_batch(int64_t first_sequence, int count, int seq_len) const {
  ZERO_REQUIRE(num_held_out_ > 0,
               std::string("addition task: held_out_batch() asked for held-out problems, but "
                           "held_out_fraction is 0 so there are none") +
                   "\nHINT: set held_out_fraction > 0 (default 0.1) to measure accuracy on "
                   "problems the model never trained on");
  return make_batch(Split::held_out, first_sequence, count, seq_len);
}

int64_t AdditionTask::held_out_set_size(int seq_len) const {
  ZERO_REQUIRE(num_held_out_ > 0,
               std::string("addition task: the held-out set is empty: held_out_fraction is 0") +
                   "\nHINT: set held_out_fraction > 0 (default 0.1) to evaluate on problems the "
                   "model never trained on");
  ZERO_REQUIRE(seq_len >= min_seq_len(),
               "addition task: held_out_set_size(): seq_len " + std::to_string(seq_len) +
                   " cannot hold one problem; it must be at least " + std::to_string(min_seq_len()));
  const int64_t k = problems_per_sequence(seq_len);
  return (num_held_out_ + k - 1) / k;
}

TokenBatch AdditionTask::held_out_set_batch(int64_t first_sequence, int count, int seq_len) const {
  const int64_t size = held_out_set_size(seq_len);
  check_range("addition task: held_out_set_batch()", first_sequence, count);
  ZERO_REQUIRE(first_sequence <= size - count,
               "addition task: held_out_set_batch(): sequences [" + std::to_string(first_sequence) +
                   ", +" + std::to_string(count) + ") leave the held-out set of " +
                   std::to_string(size) + " sequences of seq_len " + std::to_string(seq_len));
  return make_batch(Split::held_out_set, first_sequence, count, seq_len);
}

// Problem rank u -> problem index split_(u). Ranks [0, num_held_out_) are the held-out set and
// [num_held_out_, num_problems_) the training set, so the two sets are disjoint by construction
// (split_ is a bijection) and a draw never needs rejection. The rank is a 64-bit hash reduced
// modulo the set size; its bias, at most size / 2^64 < 1e-7 for 10^12 problems, is irrelevant.
int64_t AdditionTask::draw_problem(Split split, int64_t sequence, int slot) const {
  const bool train = split == Split::train;
  const uint64_t h =
      detail::hash_counters(options_.seed, train ? kTrainStream : kHeldOutStream,
                            static_cast<uint64_t>(sequence), static_cast<uint64_t>(slot));
  const auto set_size =
      static_cast<uint64_t>(train ? num_problems_ - num_held_out_ : num_held_out_);
  const uint64_t rank = (train ? static_cast<uint64_t>(num_held_out_) : 0) + h % set_size;
  return static_cast<int64_t>(split_(rank));
}

bool AdditionTask::is_held_out(int64_t a, int64_t b) const {
  ZERO_REQUIRE(a >= 0 && a < operand_limit_ && b >= 0 && b < operand_limit_,
               "addition task: is_held_out(" + std::to_string(a) + ", " + std::to_string(b) +
                   "): operands must be in [0, " + std::to_string(operand_limit_) + ")");
  const uint64_t rank = split_.inverse(static_cast<uint64_t>(a * operand_limit_ + b));
  return rank < static_cast<uint64_t>(num_held_out_);
}

std::string AdditionTask::format_problem(int64_t a, int64_t b) const {
  const int d = options_.digits;
  std::vector<int32_t> ids(static_cast<size_t>(problem_length()));
  put_digits(&ids[0], a, d, false);
  ids[d] = kPlus;
  put_digits(&ids[d + 1], b, d, false);
  ids[2 * d + 1] = kEquals;
  put_digits(&ids[2 * d + 2], a + b, d + 1, true);
  ids[3 * d + 3] = kNewline;
  return decode(ids);
}

TokenBatch AdditionTask::make_batch(Split split, int64_t first_sequence, int count,
                                    int seq_len) const {
  const char* what = split == Split::train      ? "addition task: batch()"
                     : split == Split::held_out ? "addition task: held_out_batch()"
                                                : "addition task: held_out_set_batch()";
  check_range(what, first_sequence, count);
  const int d = options_.digits, len = problem_length();
  ZERO_REQUIRE(seq_len >= min_seq_len(),
               std::string(what) + ": seq_len " + std::to_string(seq_len) + " cannot hold one " +
                   std::to_string(d) + "-digit problem: a problem is " + std::to_string(len) +
                   " characters and a sequence holds seq_len + 1 (inputs plus the last shifted "
                   "target), so seq_len must be at least " +
                   std::to_string(min_seq_len()) +
                   "\nHINT: raise the model's seq_len or lower the addition task's digits");

  TokenBatch out;
  out.rows = count;
  out.cols = seq_len;
  const size_t cells = static_cast<size_t>(count) * static_cast<size_t>(seq_len);
  out.inputs.assign(cells, kPad);
  out.targets.assign(cells, -1);
  out.item.assign(cells, -1);

  const int per_row = problems_per_sequence(seq_len);
  std::vector<int32_t> chars(static_cast<size_t>(seq_len) + 1);
  for (int r = 0; r < count; ++r) {
    const int64_t sequence = first_sequence + r;
    std::fill(chars.begin(), chars.end(), kPad);
    int filled = per_row;
    for (int slot = 0; slot < per_row; ++slot) {
      int64_t x = 0;
      if (split == Split::held_out_set) {
        // The set in the split's order; the last sequence ends where the set does.
        const int64_t u = sequence * per_row + slot;
        if (u >= num_held_out_) {
          filled = slot;
          break;
        }
        x = static_cast<int64_t>(split_(static_cast<uint64_t>(u)));
      } else {
        x = draw_problem(split, sequence, slot);
      }
      const int64_t a = x / operand_limit_, b = x % operand_limit_;
      int32_t* p = &chars[static_cast<size_t>(slot) * len];
      put_digits(p, a, d, false);
      p[d] = kPlus;
      put_digits(p + d + 1, b, d, false);
      p[2 * d + 1] = kEquals;
      put_digits(p + 2 * d + 2, a + b, d + 1, true);
      p[3 * d + 3] = kNewline;
    }
    const size_t row = static_cast<size_t>(r) * static_cast<size_t>(seq_len);
    std::copy(chars.begin(), chars.end() - 1, out.inputs.begin() + static_cast<ptrdiff_t>(row));
    // Answer characters of problem `slot` sit at [start + 2d + 2, start + 3d + 3); position t
    // predicts character t + 1, so its answer targets are positions [start + 2d + 1, start + 3d +
    // 2) (from the '=' to the second-to-last answer digit). All are < seq_len: the problem fits.
    for (int slot = 0; slot < filled; ++slot) {
      const int start = slot * len;
      for (int t = start + 2 * d + 1; t < start + 3 * d + 2; ++t) {
        out.targets[row + static_cast<size_t>(t)] = chars[static_cast<size_t>(t) + 1];
        out.item[row + static_cast<size_t>(t)] = slot;
      }
    }
  }
  return out;
}

// Why teacher-forced exact match equals greedy-decoding exact match. With a causal model the
// prediction at position t is a function of inputs [0, t] only. Greedy decoding of a problem
// starts from the same true prefix (everything up to its '=') and feeds back its own digits.
// If every teacher-forced answer prediction is right, greedy's first digit is the first
// teacher-forced prediction (same context), hence right, so its context for the second digit is
// again the true one, and so on: greedy writes the whole answer right. If some is wrong, take the
// first wrong one: greedy's context up to there is the true prefix (the digits before it were
// right), so greedy makes the same mistake. Both tests accept exactly the same problems. (This
// assumes the logits of a position do not depend on how many later positions the forward pass
// also computed, which holds for a causal model up to floating-point summation order.)
AdditionScore AdditionTask::score(const TokenBatch& batch, std::span<const int32_t> predictions) {
  const size_t cells = static_cast<size_t>(batch.rows) * static_cast<size_t>(batch.cols);
  ZERO_REQUIRE(batch.item.size() == cells && batch.targets.size() == cells,
               "addition task: score() needs a batch from AdditionTask::batch() or "
               "held_out_batch() (its item field has " +
                   std::to_string(batch.item.size()) +
                   " entries, expected rows * cols = " + std::to_string(cells) + ")");
  ZERO_REQUIRE(predictions.size() == cells,
               "addition task: score() got " + std::to_string(predictions.size()) +
                   " predictions for a batch of " + std::to_string(batch.rows) + " x " +
                   std::to_string(batch.cols) + " = " + std::to_string(cells) + " positions");
  AdditionScore s;
  std::vector<char> seen, right;  // per item of the current row
  for (int r = 0; r < batch.rows; ++r) {
    seen.clear();
    right.clear();
    for (int t = 0; t < batch.cols; ++t) {
      const size_t i =
          static_cast<size_t>(r) * static_cast<size_t>(batch.cols) + static_cast<size_t>(t);
      const int32_t item = batch.item[i];
      if (item < 0) continue;
      if (static_cast<size_t>(item) >= seen.size()) {
        seen.resize(static_cast<size_t>(item) + 1, 0);
        right.resize(static_cast<size_t>(item) + 1, 1);
      }
      seen[static_cast<size_t>(item)] = 1;
      if (predictions[i] != batch.targets[i]) right[static_cast<size_t>(item)] = 0;
    }
    for (size_t k = 0; k < seen.size(); ++k) {
      s.problems += seen[k];
      s.correct += seen[k] && right[k];
    }
  }
  return s;
}

std::string AdditionTask::decode(std::span<const int32_t> tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (int32_t id : tokens) text += (id >= 0 && id < kVocabSize) ? kChars[id] : '?';
  return text;
}

std::vector<int32_t> AdditionTask::encode(std::string_view text) {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    int32_t id = -1;
    for (int32_t k = 0; k < kVocabSize; ++k)
      if (kChars[k] == c) id = k;
    if (id < 0) {
      char code[8];
      std::snprintf(code, sizeof code, "0x%02x", static_cast<unsigned char>(c));
      ZERO_FAIL("addition task: cannot encode character " + std::string(code) + " at offset " +
                std::to_string(i) +
                ": the vocabulary is the digits 0-9, '+', '=', newline and "
                "'_' (padding)");
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace zero::models::data
