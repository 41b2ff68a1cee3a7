#include "runtime/config/text.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "runtime/config/config.hpp"

namespace zero::config::detail {

namespace {

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

}  // namespace

int edit_distance(std::string_view a, std::string_view b) {
  // d[i][j] = distance between a[0..i) and b[0..j), kept as three rolling rows (the swap looks
  // two rows back).
  const std::size_t n = a.size(), m = b.size();
  std::vector<int> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (std::size_t j = 0; j <= m; ++j) prev[j] = static_cast<int>(j);
  for (std::size_t i = 1; i <= n; ++i) {
    cur[0] = static_cast<int>(i);
    for (std::size_t j = 1; j <= m; ++j) {
      const int cost = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1]))
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[m];
}

namespace {

// The '_'-separated words of `key`, lower-cased and sorted, joined by '_' again:
// "comm_overlap" and "overlap_comm" both give "comm_overlap".
std::string sorted_words(std::string_view key) {
  std::vector<std::string> words(1);
  for (char c : key) {
    if (c == '_') words.emplace_back();
    else words.back() += lower(c);
  }
  std::sort(words.begin(), words.end());
  std::string out;
  for (const std::string& w : words) out += (out.empty() ? "" : "_") + w;
  return out;
}

}  // namespace

int key_distance(std::string_view a, std::string_view b) {
  const int plain = edit_distance(a, b);
  if (plain <= 1) return plain;
  // Words in another order count as one edit, plus the typos inside the words. (When neither
  // name needed reordering, this is 1 + plain: the plain distance wins.)
  return std::min(plain, 1 + edit_distance(sorted_words(a), sorted_words(b)));
}

std::string_view nearest(std::string_view key, std::span<const std::string_view> candidates) {
  std::string_view best;
  int best_d = std::numeric_limits<int>::max();
  for (std::string_view c : candidates) {
    const int d = key_distance(key, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

bool is_close(std::string_view key, std::string_view candidate) {
  // A third of the longer name: "gradient_cliping" (1 of 17), "trian_batch_size" (1 swap) and
  // "batch_size_train" (words swapped) are typos; "foo" vs "fp16" (3 of 4) is not.
  const int d = key_distance(key, candidate);
  const auto longer = static_cast<int>(std::max(key.size(), candidate.size()));
  return d > 0 ? d * 3 <= longer : true;
}

std::string format_number(double v) {
  if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 1e15) {
    return std::to_string(static_cast<long long>(v));
  }
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace zero::config::detail

namespace zero::config {


}  // namespace zero::config
