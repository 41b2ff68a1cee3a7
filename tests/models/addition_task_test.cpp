// AdditionTask: layout, determinism, the train/held-out split, scoring and option checks.
#include "models/data/addition_task.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::models::data::AdditionOptions;
using zero::models::data::AdditionTask;
using zero::models::data::TokenBatch;

namespace {

// The tiny GPT preset's context: the task's default customer.
constexpr int kSeqLen = 64;

std::vector<int32_t> row_of(const std::vector<int32_t>& v, const TokenBatch& b, int r) {
  return {v.begin() + static_cast<ptrdiff_t>(r) * b.cols,
          v.begin() + static_cast<ptrdiff_t>(r + 1) * b.cols};
}

int64_t number(const std::string& s) { return std::stoll(s); }

std::string reversed(std::string s) { return {s.rbegin(), s.rend()}; }

// The (a, b) problems written in row r, read back from its input text (up to the padding).
std::vector<std::pair<int64_t, int64_t>> problems_in_row(const AdditionTask& task,
                                                         const TokenBatch& b, int r) {
  const int d = task.options().digits, len = task.problem_length();
  const std::string text = AdditionTask::decode(row_of(b.inputs, b, r));
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int slot = 0; slot < task.problems_per_sequence(b.cols); ++slot) {
    const std::string p = text.substr(static_cast<size_t>(slot * len));
    if (p.empty() || p[0] == '_') break;  // padding: the row holds no more problems
    out.emplace_back(number(p.substr(0, d)), number(p.substr(d + 1, d)));
  }
  return out;
}

}  // namespace

TEST_CASE("addition task: format_problem writes padded operands and the reversed, padded sum") {
  CHECK(AdditionTask({.digits = 2}).format_problem(7, 45) == "07+45=250\n");        // 52 -> "052"
  CHECK(AdditionTask({.digits = 3}).format_problem(999, 999) == "999+999=8991\n");  // 1998
  CHECK(AdditionTask({.digits = 1}).format_problem(0, 0) == "0+0=00\n");
  CHECK(AdditionTask({.digits = 2}).problem_length() == 10);
  CHECK(AdditionTask({.digits = 2}).min_seq_len() == 9);
}

TEST_CASE("addition task: encode and decode are inverse over the vocabulary") {
  const std::string text = "0123456789+=\n_";
  const std::vector<int32_t> ids = AdditionTask::encode(text);
  REQUIRE(ids.size() == text.size());
  for (size_t i = 0; i < ids.size(); ++i) CHECK(ids[i] == static_cast<int32_t>(i));
  CHECK(AdditionTask::decode(ids) == text);
  CHECK(AdditionTask::decode(std::vector<int32_t>{-1, 14, 3}) == "??3");
  static_assert(AdditionTask::kVocabSize <= 64, "must fit the tiny preset's vocabulary");
}

TEST_CASE("addition task: a sequence packs whole problems and pads the tail") {
  for (int digits = AdditionTask::kMinDigits; digits <= AdditionTask::kMaxDigits; ++digits) {
    const AdditionTask task({.digits = digits, .seed = 3});
    const TokenBatch b = task.batch(0, 2, kSeqLen);
    REQUIRE(b.rows == 2);
    REQUIRE(b.cols == kSeqLen);
    REQUIRE(b.inputs.size() == 2u * kSeqLen);
    const int len = task.problem_length(), k = task.problems_per_sequence(kSeqLen);
    CHECK(k == (kSeqLen + 1) / len);
    for (int r = 0; r < b.rows; ++r) {
      const std::string text = AdditionTask::decode(row_of(b.inputs, b, r));
      for (int slot = 0; slot < k; ++slot) {
        const std::string p =
            text.substr(static_cast<size_t>(slot * len), static_cast<size_t>(len));
        // The last problem's newline may be the character after the inputs (only a target).
        const auto [a, bb] = problems_in_row(task, b, r)[static_cast<size_t>(slot)];
        CHECK(task.format_problem(a, bb).substr(0, p.size()) == p);
      }
      for (size_t t = static_cast<size_t>(k * len); t < text.size(); ++t) CHECK(text[t] == '_');
    }
  }
}

TEST_CASE("addition task: targets sit only on answer digits and spell the right sum") {
  for (int digits = AdditionTask::kMinDigits; digits <= AdditionTask::kMaxDigits; ++digits) {
    const AdditionTask task({.digits = digits, .seed = 11});
    const int d = digits, len = task.problem_length();
    for (const bool held_out : {false, true}) {
      const TokenBatch b =
          held_out ? task.held_out_batch(40, 8, kSeqLen) : task.batch(40, 8, kSeqLen);
      for (int r = 0; r < b.rows; ++r) {
        const auto problems = problems_in_row(task, b, r);
        const std::vector<int32_t> in = row_of(b.inputs, b, r), tg = row_of(b.targets, b, r),
                                   item = row_of(b.item, b, r);
        for (int t = 0; t < b.cols; ++t) {
          const int slot = t / len, at = t % len;
          const bool answer =
              slot < static_cast<int>(problems.size()) && at >= 2 * d + 1 && at < 3 * d + 2;
          INFO("digits " << d << " row " << r << " position " << t);
          CHECK((tg[static_cast<size_t>(t)] != -1) == answer);
          CHECK(item[static_cast<size_t>(t)] == (answer ? slot : -1));
          if (answer && t + 1 < b.cols)  // a target is the next input
            CHECK(tg[static_cast<size_t>(t)] == in[static_cast<size_t>(t) + 1]);
        }
        // The answer read from the targets alone is the reversed, zero-padded sum.
        for (size_t slot = 0; slot < problems.size(); ++slot) {
          const auto [a, bb] = problems[slot];
          const size_t first = slot * static_cast<size_t>(len) + 2 * static_cast<size_t>(d) + 1;
          const std::string answer = AdditionTask::decode(
              std::vector<int32_t>(tg.begin() + static_cast<ptrdiff_t>(first),
                                   tg.begin() + static_cast<ptrdiff_t>(first) + d + 1));
          CHECK(number(reversed(answer)) == a + bb);
        }
      }
    }
  }
}

TEST_CASE("addition task: the same indices give the same batch and ranges compose") {
  const AdditionTask task({.digits = 3, .seed = 5});
  const TokenBatch whole = task.batch(1000, 4, kSeqLen);
  const TokenBatch again = task.batch(1000, 4, kSeqLen);
  CHECK(whole.inputs == again.inputs);
  CHECK(whole.targets == again.targets);
  CHECK(whole.item == again.item);
  const TokenBatch lo = task.batch(1000, 2, kSeqLen), hi = task.batch(1002, 2, kSeqLen);
  for (int r = 0; r < 4; ++r) {
    const TokenBatch& part = r < 2 ? lo : hi;
    CHECK(row_of(whole.inputs, whole, r) == row_of(part.inputs, part, r % 2));
    CHECK(row_of(whole.targets, whole, r) == row_of(part.targets, part, r % 2));
    CHECK(row_of(whole.item, whole, r) == row_of(part.item, part, r % 2));
  }
  // A far index is produced directly, without walking the stream up to it.
  const TokenBatch far = task.batch(int64_t{1} << 40, 1, kSeqLen);
  CHECK(far.inputs == task.batch(int64_t{1} << 40, 1, kSeqLen).inputs);
  // Another seed or the held-out stream is other data.
  CHECK(AdditionTask({.digits = 3, .seed = 6}).batch(1000, 4, kSeqLen).inputs != whole.inputs);
  CHECK(task.held_out_batch(1000, 4, kSeqLen).inputs != whole.inputs);
  CHECK(task.held_out_batch(7, 3, kSeqLen).inputs == task.held_out_batch(7, 3, kSeqLen).inputs);
  // Rows differ from one another (a constant stream would pass the checks above).
  CHECK(row_of(whole.inputs, whole, 0) != row_of(whole.inputs, whole, 1));
}

TEST_CASE("addition task: held-out problems never appear in training sequences") {
  // digits 2: 10^4 problems, 1000 held out. 3000 sequences of 6 problems draw 18000 of each
  // stream, enough to see nearly every held-out problem, so a leak would show.
  const AdditionTask task({.digits = 2, .seed = 17, .held_out_fraction = 0.1});
  CHECK(task.num_problems() == 10000);
  CHECK(task.num_held_out() == 1000);
  std::set<std::pair<int64_t, int64_t>> train, held;
  const TokenBatch tb = task.batch(0, 3000, kSeqLen), hb = task.held_out_batch(0, 3000, kSeqLen);
  for (int r = 0; r < 3000; ++r) {
    for (const auto& p : problems_in_row(task, tb, r)) train.insert(p);
    for (const auto& p : problems_in_row(task, hb, r)) held.insert(p);
  }
  for (const auto& p : held) CHECK(train.count(p) == 0);
  for (const auto& p : held) CHECK(task.is_held_out(p.first, p.second));
  for (const auto& p : train) CHECK_FALSE(task.is_held_out(p.first, p.second));
  // The draws cover the sets as uniform draws would (a skewed or stuck draw would not):
  // 18000 draws from 1000 problems miss about 1000 * e^-18 of them, i.e. none;
  // 18000 draws from 9000 see about 9000 * (1 - e^-2) = 7782 (sd ~30), so 7500 is ~9 sd away.
  CHECK(held.size() <= 1000);
  CHECK(held.size() > 990);
  CHECK(train.size() > 7500);
}

TEST_CASE("addition task: the split is exact and seeded") {
  // digits 1: 100 problems, all enumerable: exactly round(0.1 * 100) are held out.
  const AdditionTask a({.digits = 1, .seed = 1}), b({.digits = 1, .seed = 2});
  int held_a = 0, same = 0;
  for (int x = 0; x < 10; ++x)
    for (int y = 0; y < 10; ++y) {
      held_a += a.is_held_out(x, y);
      same += a.is_held_out(x, y) == b.is_held_out(x, y);
    }
  CHECK(held_a == 10);
  CHECK(same < 100);  // another seed holds out other problems
  // A tiny positive fraction still holds one problem out; 0 holds none out.
  CHECK(AdditionTask({.digits = 1, .held_out_fraction = 0.001}).num_held_out() == 1);
  CHECK(AdditionTask({.digits = 1, .held_out_fraction = 0.0}).num_held_out() == 0);
}

TEST_CASE("addition task: score counts whole problems, one wrong digit fails just its problem") {
  const AdditionTask task({.digits = 2, .seed = 9});
  const TokenBatch b = task.batch(0, 3, kSeqLen);
  const int per_row = task.problems_per_sequence(kSeqLen);
  // Perfect teacher-forced predictions: the target wherever there is one, anything elsewhere.
  std::vector<int32_t> pred(b.targets.size());
  for (size_t i = 0; i < pred.size(); ++i) pred[i] = b.targets[i] >= 0 ? b.targets[i] : 0;
  auto s = AdditionTask::score(b, pred);
  CHECK(s.problems == 3 * per_row);
  CHECK(s.correct == 3 * per_row);
  // Wrong predictions on non-answer positions do not count.
  for (size_t i = 0; i < pred.size(); ++i)
    if (b.targets[i] < 0) pred[i] = 7;
  CHECK(AdditionTask::score(b, pred).correct == 3 * per_row);
  // One wrong digit in row 1's third problem: exactly that problem fails.
  size_t pos = 0;
  for (size_t i = 0; i < pred.size(); ++i)
    if (static_cast<int>(i) / b.cols == 1 && b.item[i] == 2) pos = i;  // its last answer position
  REQUIRE(pos != 0);
  pred[pos] = (pred[pos] + 1) % 10;
  s = AdditionTask::score(b, pred);
  CHECK(s.problems == 3 * per_row);
  CHECK(s.correct == 3 * per_row - 1);
}

TEST_CASE("addition task: bad options and requests fail with clear messages") {
  REQUIRE_THROWS_WITH(AdditionTask({.digits = 0}),
                      ContainsSubstring("digits is 0; it must be 1..6"));
  REQUIRE_THROWS_WITH(AdditionTask({.digits = 7}),
                      ContainsSubstring("digits is 7; it must be 1..6"));
  REQUIRE_THROWS_WITH(AdditionTask({.held_out_fraction = -0.1}),
                      ContainsSubstring("it must be in [0, 1)"));
  REQUIRE_THROWS_WITH(AdditionTask({.held_out_fraction = 1.0}),
                      ContainsSubstring("it must be in [0, 1)"));
  REQUIRE_THROWS_WITH(AdditionTask({.held_out_fraction = std::nan("")}),
                      ContainsSubstring("it must be in [0, 1)"));
  REQUIRE_THROWS_WITH(AdditionTask({.digits = 1, .held_out_fraction = 0.999}),
                      ContainsSubstring("leaving none to train on"));

  const AdditionTask task({.digits = 2});
  REQUIRE_THROWS_WITH(task.batch(0, 1, 8), ContainsSubstring("seq_len must be at least 9"));
  REQUIRE_THROWS_WITH(task.batch(0, 1, 8), ContainsSubstring("a problem is 10 characters"));
  CHECK(task.batch(0, 1, 9).targets.size() == 9u);  // the minimum works: one problem
  REQUIRE_THROWS_WITH(task.batch(-1, 1, kSeqLen), ContainsSubstring("must be >= 0"));
  REQUIRE_THROWS_WITH(task.batch(0, -1, kSeqLen), ContainsSubstring("must be >= 0"));
  REQUIRE_THROWS_WITH(AdditionTask({.held_out_fraction = 0.0}).held_out_batch(0, 1, kSeqLen),
                      ContainsSubstring("held_out_fraction is 0"));
  REQUIRE_THROWS_WITH(AdditionTask::encode("1+x"), ContainsSubstring("character 0x78 at offset 2"));

  const TokenBatch b = task.batch(0, 1, kSeqLen);
  REQUIRE_THROWS_WITH(AdditionTask::score(b, std::vector<int32_t>(3)),
                      ContainsSubstring("got 3 predictions for a batch of 1 x 64"));
  TokenBatch foreign = b;
  foreign.item.clear();
  REQUIRE_THROWS_WITH(AdditionTask::score(foreign, b.targets),
                      ContainsSubstring("needs a batch from AdditionTask"));
  // Option errors carry a hint line, like every user-facing error.
  try {
    AdditionTask({.digits = 9});
    FAIL("digits 9 accepted");
  } catch (const zero::Error& e) {
    CHECK_THAT(e.message(), ContainsSubstring("\nHINT: "));
  }
}

TEST_CASE("addition task: describe names the task, its split and its seed") {
  const std::string d = AdditionTask({.digits = 2, .seed = 4}).describe();
  CHECK_THAT(d, ContainsSubstring("07+45=250"));
  CHECK_THAT(d, ContainsSubstring("9000 training / 1000 held-out"));
  CHECK_THAT(d, ContainsSubstring("seed 4"));
  CHECK(d.find('\n') == std::string::npos);
}

TEST_CASE("addition task: the held-out set holds every held-out problem once, in a fixed order") {
  // digits 2, seq_len 64: 6 problems per sequence, 1000 held out -> 167 sequences, the last one
  // holding the remaining 4 problems and then padding.
  const AdditionTask task({.digits = 2, .seed = 17, .held_out_fraction = 0.1});
  const int k = task.problems_per_sequence(kSeqLen);
  REQUIRE(k == 6);
  const int64_t n = task.held_out_set_size(kSeqLen);
  CHECK(n == 167);
  const TokenBatch all = task.held_out_set_batch(0, static_cast<int>(n), kSeqLen);
  std::set<std::pair<int64_t, int64_t>> seen;
  int64_t problems = 0, counted = 0;
  for (int r = 0; r < all.rows; ++r) {
    const auto row = problems_in_row(task, all, r);
    const int filled = r + 1 < all.rows ? k : 1000 - k * (all.rows - 1);
    for (int slot = 0; slot < filled; ++slot) {
      CHECK(task.is_held_out(row[static_cast<size_t>(slot)].first, row[static_cast<size_t>(slot)].second));
      seen.insert(row[static_cast<size_t>(slot)]);
      ++problems;
    }
    for (int t = 0; t < all.cols; ++t) counted += all.targets[static_cast<size_t>(r) * all.cols + t] >= 0;
  }
  CHECK(problems == 1000);
  CHECK(seen.size() == 1000);  // each held-out problem exactly once
  CHECK(counted == 1000 * 3);  // 3 answer digits each, nothing counted in the padding
  // The last row is 4 problems, then padding only.
  const std::string last = AdditionTask::decode(row_of(all.inputs, all, all.rows - 1));
  CHECK(last.substr(40).find_first_not_of('_') == std::string::npos);
  // Any range is the same rows as the whole (the chunks of an evaluation stack up to the set).
  const TokenBatch part = task.held_out_set_batch(160, 7, kSeqLen);
  for (int r = 0; r < 7; ++r) CHECK(row_of(part.inputs, part, r) == row_of(all.inputs, all, 160 + r));
  // The seed chooses the set; nothing else does (the draw stream of held_out_batch is not used).
  CHECK(task.held_out_set_batch(0, 4, kSeqLen).inputs ==
        AdditionTask({.digits = 2, .seed = 17}).held_out_set_batch(0, 4, kSeqLen).inputs);
  CHECK(task.held_out_set_batch(0, 4, kSeqLen).inputs !=
        AdditionTask({.digits = 2, .seed = 18}).held_out_set_batch(0, 4, kSeqLen).inputs);
  // At the minimum seq_len one problem per sequence: 1000 sequences.
  CHECK(task.held_out_set_size(task.min_seq_len()) == 1000);
  REQUIRE_THROWS_WITH(task.held_out_set_batch(160, 8, kSeqLen), ContainsSubstring("leave the held-out set of 167"));
  REQUIRE_THROWS_WITH(AdditionTask({.held_out_fraction = 0.0}).held_out_set_size(kSeqLen),
                      ContainsSubstring("the held-out set is empty"));
}
