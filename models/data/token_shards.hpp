// TokenShards: pre-tokenized text in llm.c's token shard format, memory-mapped, served as
// shuffled fixed-length windows.
//
// File format (docs/data-formats.md has the full spec): a 1024-byte header of 256 little-endian
// int32 -- [0] magic 20240520, [1] version 1, [2] token count N, the rest zero -- followed by N
// little-endian uint16 token ids. The files are mapped read-only and every token id is checked
// against vocab_size when they are opened, so batch() never meets a bad token.
//
// Sequences. For a given seq_len T, a shard of n tokens holds floor((n - 1) / T) windows: window
// k is tokens [k*T, k*T + T], T + 1 tokens (inputs = the first T, targets = the last T, every
// target counted). The windows of all shards, in file order, make one epoch of W windows.
// Sequence index i is window perm_e(i mod W) of epoch e = i / W, where perm_e is a seeded
// bijection of [0, W) keyed by (seed, e): every window appears exactly once per epoch, in a new
// order each epoch. The per-rank offset is simply the engine's first_sequence (each rank asks for
// its own disjoint index range); the dataset knows nothing of ranks.
//
// Ownership and thread-safety: the object owns its mappings (released when the last copy is
// destroyed; copies share them). Immutable after construction; every member may be called
// concurrently. The files must not be modified while mapped (rewrite them with
// write_token_shard, which replaces a file by rename and so leaves existing mappings intact).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "models/data/dataset.hpp"

namespace zero::models::data {

inline constexpr int32_t kTokenShardMagic = 20240520;
inline constexpr int32_t kTokenShardVersion = 1;
inline constexpr int kTokenShardHeaderInts = 256;
inline constexpr size_t kTokenShardHeaderBytes = kTokenShardHeaderInts * sizeof(int32_t);  // 1024

class TokenShards final : public Dataset {
 public:
  // Each entry is a file path or a glob pattern (any of * ? [); a pattern is expanded and its
  // matches sorted by name. Files are used in the order given (patterns in sorted order).
  // vocab_size is the model's, 1..65536. Throws zero::Error, naming the file and ending with a
  // "HINT:" line, for: no files, a pattern without matches, an unreadable file, a file shorter
  // than the header, a wrong magic, an unsupported version, a size that disagrees with the
  // header's token count, or a token id >= vocab_size.
  TokenShards(std::vector<std::string> paths_or_patterns, int vocab_size, uint64_t seed);
  TokenShards(const std::string& path_or_pattern, int vocab_size, uint64_t seed)
      : TokenShards(std::vector<std::string>{path_or_pattern}, vocab_size, seed) {}

  int vocab_size() const noexcept override { return vocab_size_; }
  std::string describe() const override;
  // Throws zero::Error when seq_len < 1, the range is negative, or some shard has fewer than
  // seq_len + 1 tokens (the message names the shard and the longest seq_len it allows).
  TokenBatch batch(int64_t first_sequence, int count, int seq_len) const override;

  // Windows per epoch for this seq_len (same checks as batch()).
  int64_t windows_per_epoch(int seq_len) const;
  int64_t num_tokens() const noexcept { return num_tokens_; }
  uint64_t seed() const noexcept { return seed_; }
  std::vector<std::string> paths() const;
  // The tokens of shard `i` (a view into its mapping, valid while this object or a copy lives).
  std::span<const uint16_t> shard_tokens(size_t i) const { return shards_.at(i).tokens; }
  size_t num_shards() const noexcept { return shards_.size(); }

 private:
  struct Shard {
    std::string path;
    std::span<const uint16_t> tokens;
    std::shared_ptr<const void> mapping;  // munmaps when the last owner goes
  };
  static Shard open_shard(const std::string& path, int vocab_size);
  // Prefix sums of windows per shard for seq_len, checking every shard holds one window.
  std::vector<int64_t> window_offsets(int seq_len) const;

  std::vector<Shard> shards_;
  int vocab_size_ = 0;
  uint64_t seed_ = 0;
  int64_t num_tokens_ = 0;
};

// Writes `tokens` as a token shard at `path`, atomically: to a temporary name beside it, flushed
// to disk, then renamed over `path`, so a reader sees the old file or the whole new one, never a
// partial one. Throws zero::Error naming the file when a system call fails or there are more
// tokens than the header's int32 count can say.
void write_token_shard(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace zero::models::data
