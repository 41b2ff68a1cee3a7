// Counter-based randomness: every value is a pure function of (key, counters), with no generator
// state, so any slice of a stream can be produced on its own: each rank initialises only the
// parameter elements it owns, a dataset builds sequence i without building 0..i-1, and the
// results do not depend on the world size or on the order of calls.
//
// Not cryptographic: splitmix64's finaliser, a fixed bijective mix of 64 bits, is enough to make
// consecutive counters look independent. Thread-safety: pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string_view>

namespace zero {

// splitmix64's finaliser (a bijection on 64-bit values).
constexpr uint64_t mix64(uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// 64 well-mixed bits from a key and up to three counters.
constexpr uint64_t hash_counters(uint64_t key, uint64_t a, uint64_t b = 0, uint64_t c = 0) noexcept {
  uint64_t h = mix64(key ^ 0x6a09e667f3bcc908ULL);  // constant: key 0 must not mix from 0
  h = mix64(h ^ a);
  h = mix64((h + 0x9e3779b97f4a7c15ULL) ^ b);
  h = mix64((h + 0x9e3779b97f4a7c15ULL) ^ c);
  return h;
}

// FNV-1a of a string: turns a name (a parameter's) into a key.
constexpr uint64_t hash_string(std::string_view s) noexcept {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

// A standard normal value for (key, index): Box-Muller on the two 32-bit halves of
// hash_counters(key, index), in double, rounded once. u1 is in (0, 1], so the log is finite.
inline float counter_normal(uint64_t key, uint64_t index) noexcept {
  const uint64_t bits = hash_counters(key, index);
  const double u1 = (static_cast<double>(bits >> 32) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(bits & 0xffffffffULL) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace zero
