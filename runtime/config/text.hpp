// Small text helpers of the config reader (private to runtime/config): the distances behind
// "did you mean", and number formatting for messages. No JSON here.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace zero::config::detail {

// Damerau-Levenshtein distance (optimal string alignment: insert, delete, substitute, swap two
// adjacent characters), ASCII case-insensitive.
int edit_distance(std::string_view a, std::string_view b);

// How far a typed key is from a valid one: edit_distance, except that words (separated by '_')
// written in another order count as one edit plus the typos inside them, so "comm_overlap" is
// 1 from "overlap_comm" (DeepSpeedExamples' 10B config has that typo).
int key_distance(std::string_view a, std::string_view b);

// The candidate nearest to `key` by key_distance; ties go to the earlier candidate. Empty when
// there are no candidates.
std::string_view nearest(std::string_view key, std::span<const std::string_view> candidates);

// Whether `candidate` is close enough to `key` to be offered as "did you mean" when nothing
// obliges us to name the nearest (top-level keys): a typo, not merely the nearest word.
bool is_close(std::string_view key, std::string_view candidate);

// Shortest text that reads back as the same double ("0.001", "1e-08", "500000000").
std::string format_number(double v);

}  // namespace zero::config::detail
