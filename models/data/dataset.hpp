// The datasets' common face: a Dataset turns sequence indices into token micro-batches.
//
// Host-only and tensor-free: a batch is two int32 vectors the model code copies to its device.
// The formats the datasets read or generate are specified in docs/data-formats.md.
//
// Determinism contract. A dataset is an infinite, deterministic stream of sequences, and
// batch(first, count, T) returns sequences first .. first+count-1 of it. Each row depends only
// on (dataset, its own sequence index, T), never on what was asked before, so:
//   - any range can be produced independently, in any order, from any thread;
//   - batch(0, 4, T) equals batch(0, 2, T) stacked on batch(2, 2, T);
//   - the engine gives rank r of step s micro-batch m its own disjoint range of indices, and one
//     rank running W times the gradient accumulation sees exactly the data W ranks see.
// Thread-safety: every const member of a Dataset may be called concurrently.
//
// Also here: a seeded bijection on [0, n) (IndexPermutation), built on the counter-based hashes
// of core/random.hpp. They hold no state, so the contract above holds without locks or
// caches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/random.hpp"

namespace zero::models::data {

// A micro-batch of `rows` sequences of `cols` tokens, row-major: element (r, t) is at r*cols + t.
struct TokenBatch {
  int rows = 0, cols = 0;
  std::vector<int32_t> inputs;  // [rows*cols] token ids
  std::vector<int32_t>
      targets;  // [rows*cols] next-token ids; -1 = position not counted in the loss
  // For datasets scored by exact match of whole answers (AdditionTask), else empty:
  // [rows*cols], the index within row r of the scored item (problem) whose answer the target at
  // (r, t) belongs to, or -1 where the target is -1. Per row, not per batch, so that stacking two
  // batches of consecutive ranges gives the batch of the joint range, this field included.
  std::vector<int32_t> item;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int vocab_size() const noexcept = 0;  // every token id is in [0, vocab_size)
  virtual std::string describe() const = 0;     // one line for logs
  // Sequences first_sequence .. first_sequence+count-1 of the stream, each `seq_len` tokens (see
  // the contract above). Throws zero::Error for a negative range or a seq_len the dataset cannot
  // serve (the message says the limit).
  virtual TokenBatch batch(int64_t first_sequence, int count, int seq_len) const = 0;
};

namespace detail {

// The counter-based hashes live in core/random.hpp; the datasets draw from them.
using zero::hash_counters;
using zero::mix64;

// A seeded permutation of [0, n), computed per index in O(1) expected time and memory: a
// balanced Feistel network on the smallest even number of bits that covers n, with "cycle
// walking" (re-apply until the value falls inside [0, n)). A Feistel network is a bijection on
// its 2^bits domain whatever the round function, and cycle walking restricts a bijection to a
// subset; the domain is < 4n, so a walk takes fewer than 4 steps on average. Not cryptographic,
// only well mixed: six rounds, where Luby-Rackoff needs four with ideal round functions; the
// two extra are margin for our cheap hash-based ones.
class IndexPermutation {
 public:
  IndexPermutation(uint64_t n, uint64_t key) noexcept : n_(n), key_(key) {
    int bits = 2;  // at least one bit per half
    while (bits < 64 && (uint64_t{1} << bits) < n) bits += 2;
    half_ = bits / 2;
    mask_ = (uint64_t{1} << half_) - 1;
  }
  uint64_t size() const noexcept { return n_; }

  // i in [0, size()) -> its image, also in [0, size()).
  uint64_t operator()(uint64_t i) const noexcept {
    if (n_ <= 1) return i;
    do i = encrypt(i);
    while (i >= n_);
    return i;
  }
  // The inverse: inverse((*this)(i)) == i.
  uint64_t inverse(uint64_t x) const noexcept {
    if (n_ <= 1) return x;
    do x = decrypt(x);
    while (x >= n_);
    return x;
  }

 private:
  static constexpr int kRounds = 6;
  uint64_t round(int r, uint64_t half_value) const noexcept {
    return hash_counters(key_, static_cast<uint64_t>(r), half_value) & mask_;
  }
  uint64_t encrypt(uint64_t v) const noexcept {
    uint64_t l = v >> half_, r = v & mask_;
    for (int k = 0; k < kRounds; ++k) {
      const uint64_t next_r = l ^ round(k, r);
      l = r;
      r = next_r;
    }
    return (l << half_) | r;
  }
  uint64_t decrypt(uint64_t v) const noexcept {
    uint64_t l = v >> half_, r = v & mask_;
    for (int k = kRounds - 1; k >= 0; --k) {
      const uint64_t prev_l = r ^ round(k, l);
      r = l;
      l = prev_l;
    }
    return (l << half_) | r;
  }

  uint64_t n_, key_;
  int half_ = 1;
  uint64_t mask_ = 1;
};

}  // namespace detail
}  // namespace zero::models::data
