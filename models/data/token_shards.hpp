// TokenShards: pre-tokenized text in llm.c's token shard format, read with pread(2), served as
// shuffled fixed-length windows (training) or windows in file order (evaluation).
//
// File format (docs/data-formats.md has the full spec): a 1024-byte header of 256 little-endian
// int32 -- [0] magic 20240520, [1] version 1, [2] token count N, the rest zero -- followed by N
// little-endian uint16 token ids. Every token id is checked against vocab_size when the files are
// opened, so batch() never meets a bad token.
//
// Sequences. For a given seq_len T, a shard of n tokens holds floor((n - 1) / T) windows: window
// k is tokens [k*T, k*T + T], T + 1 tokens (inputs = the first T, targets = the last T, every
// target counted). The windows of all shards, in file order, make one epoch of W windows.
// Sequence index i is window perm_e(i mod W) of epoch e = i / W, where perm_e is a seeded
// bijection of [0, W) keyed by (seed, e): every window appears exactly once per epoch, in a new
// order each epoch. The per-rank offset is simply the engine's first_sequence (each rank asks for
// its own disjoint index range); the dataset knows nothing of ranks.
//
// Files that change under the reader. The shards stay open and are read with pread(2) at every
// batch, never memory-mapped: a mapped file truncated under a run kills it with SIGBUS, with no
// word of which file. Instead every batch checks, after reading, that each shard it read from is
// still the file that was opened: the same size and modification time (fstat of the open
// descriptor) and the same inode at its path (stat). A shard that shrank, grew, was rewritten
// in place, or was replaced (renamed over, deleted) makes batch() throw zero::Error naming the
// file, what changed, and what to do; no token of a changed file is ever returned. (A rewrite
// that keeps the size and lands within the file system's timestamp granularity of the file's
// previous write is the one change this cannot see.)
//
// Ownership and thread-safety: the object owns its open descriptors (closed when the last copy
// is destroyed; copies share them). Immutable after construction; every member may be called
// concurrently (pread and fstat do not move a file offset).
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
  // Throws zero::Error when seq_len < 1, the range is negative, some shard has fewer than
  // seq_len + 1 tokens (the message names the shard and the longest seq_len it allows), a read
  // fails, or a shard changed since it was opened (see above).
  TokenBatch batch(int64_t first_sequence, int count, int seq_len) const override;
  // Windows in file order, unshuffled and independent of the seed: sequence i is window i, for
  // i in [0, windows_per_epoch(seq_len)) (a larger index is an error). The held-out set of an
  // evaluation, the same for every run of the same files. Same errors as batch().
  TokenBatch ordered_batch(int64_t first_window, int count, int seq_len) const;

  // Windows per epoch for this seq_len (same checks as batch()).
  int64_t windows_per_epoch(int seq_len) const;
  int64_t num_tokens() const noexcept { return num_tokens_; }
  uint64_t seed() const noexcept { return seed_; }
  std::vector<std::string> paths() const;
  // All tokens of shard `i`, read now (same checks as batch()).
  std::vector<uint16_t> shard_tokens(size_t i) const;
  size_t num_shards() const noexcept { return shards_.size(); }

 private:
  struct OpenFile;  // the descriptor and what the file was when opened
  struct Shard {
    std::string path;
    int64_t num_tokens = 0;
    std::shared_ptr<const OpenFile> file;  // closed when the last owner goes
  };
  static Shard open_shard(const std::string& path, int vocab_size);
  // Reads `bytes` bytes at `offset` of `shard`'s file, exactly; throws when the file ends before
  // them (it shrank since it was opened) or the read fails.
  static void read_bytes(const Shard& shard, void* out, size_t bytes, uint64_t offset);
  // Reads tokens [first, first + count) of `shard` into `out` (read_bytes' errors).
  static void read_tokens(const Shard& shard, int64_t first, size_t count, uint16_t* out);
  // Throws when `shard` is no longer the file that was opened (size, mtime, inode at its path).
  static void check_unchanged(const Shard& shard);
  // Prefix sums of windows per shard for seq_len, checking every shard holds one window.
  std::vector<int64_t> window_offsets(int seq_len) const;
  // The rows for the given window numbers (offsets from window_offsets(seq_len)).
  TokenBatch read_windows(const std::vector<int64_t>& windows, const std::vector<int64_t>& offsets,
                          int seq_len) const;

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
