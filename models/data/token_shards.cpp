#include "models/data/token_shards.hpp"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/error.hpp"

namespace zero::models::data {

// The format is little-endian and we read it straight into uint16 arrays; a big-endian host would
// need byte swaps here, and none of our targets is one.
static_assert(std::endian::native == std::endian::little,
              "token shards are read in place and are little-endian");

namespace {

constexpr uint64_t kEpochStream = 1;  // hash stream of the per-epoch permutation keys

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may or may not be buf).
  const char* msg = strerror_r(err, buf, sizeof buf);
  return std::string(msg) + " (errno " + std::to_string(err) + ")";
}

std::string quoted(const std::string& path) { return "'" + path + "'"; }

bool is_pattern(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> expand(const std::vector<std::string>& paths_or_patterns) {
  std::vector<std::string> files;
  for (const std::string& p : paths_or_patterns) {
    if (!is_pattern(p)) {
      files.push_back(p);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(p.c_str(), 0, nullptr, &g);
    std::vector<std::string> matches;
    if (rc == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) matches.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    ZERO_REQUIRE(rc == 0 || rc == GLOB_NOMATCH,
                 "token shards: cannot expand the pattern " + quoted(p) + " (glob error " +
                     std::to_string(rc) + ", e.g. an unreadable directory)" +
                     "\nHINT: check that the pattern's directory exists and is readable");
    ZERO_REQUIRE(!matches.empty(),
                 "token shards: no file matches the pattern " + quoted(p) +
                     "\nHINT: check the directory and the name pattern (llm.c's data scripts "
                     "write names like fineweb_train_000001.bin), relative to the working "
                     "directory");
    // glob(3) sorts by the locale's collation; sort bytewise so the order, and with it the
    // window numbering, is the same on every machine.
    std::sort(matches.begin(), matches.end());
    files.insert(files.end(), matches.begin(), matches.end());
  }
  return files;
}

}  // namespace

TokenShards::TokenShards(std::vector<std::string> paths_or_patterns, int vocab_size, uint64_t seed)
    : vocab_size_(vocab_size), seed_(seed) {
  ZERO_REQUIRE(vocab_size >= 1 && vocab_size <= 65536,
               "token shards: vocab_size is " + std::to_string(vocab_size) +
                   "; it must be 1..65536 (shard token ids are uint16)" +
                   "\nHINT: use the vocab_size of the model the shards were tokenized for");
  ZERO_REQUIRE(!paths_or_patterns.empty(),
               std::string("token shards: no files given") +
                   "\nHINT: give a shard path or a pattern such as \"data/train_*.bin\"");
  for (const std::string& path : expand(paths_or_patterns)) {
    shards_.push_back(open_shard(path, vocab_size));
    num_tokens_ += shards_.back().num_tokens;
  }
}

struct TokenShards::OpenFile {
  int fd = -1;
  // What the file was when opened; check_unchanged() compares against these.
  dev_t dev{};
  ino_t ino{};
  off_t size = 0;
  timespec mtime{};
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

namespace {

const char* const kChangedHint =
    "\nHINT: a run reads its token shards until it ends; do not truncate, append to, rewrite or "
    "replace them while it runs. Write new data under new file names, then restart the run "
    "(--resume continues from its last checkpoint)";

}  // namespace

TokenShards::Shard TokenShards::open_shard(const std::string& path, int vocab_size) {
  const std::string where = "token shard " + quoted(path);
  const std::string regenerate =
      "\nHINT: regenerate it with llm.c's dev/data scripts or zero's write_token_shard(), which "
      "write this header";
  auto file = std::make_shared<OpenFile>();
  file->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file->fd < 0) {
    const int err = errno;
    ZERO_FAIL("cannot open " + where + ": " + errno_text(err) +
              "\nHINT: check the path (relative paths start at the working directory) and its "
              "permissions");
  }
  struct stat st {};
  if (::fstat(file->fd, &st) != 0) {
    const int err = errno;
    ZERO_FAIL("cannot stat " + where + ": " + errno_text(err) + "\nHINT: check the file");
  }
  file->dev = st.st_dev;
  file->ino = st.st_ino;
  file->size = st.st_size;
  file->mtime = st.st_mtim;
  const auto size = static_cast<size_t>(st.st_size);
  if (size < kTokenShardHeaderBytes)
    ZERO_FAIL(where + " has " + std::to_string(size) + " bytes, shorter than the " +
              std::to_string(kTokenShardHeaderBytes) +
              "-byte header: it is not an llm.c token shard, or was cut short" + regenerate);
  Shard shard;
  shard.path = path;
  shard.file = file;

  int32_t header[kTokenShardHeaderInts];
  read_bytes(shard, header, sizeof header, 0);
  ZERO_REQUIRE(header[0] == kTokenShardMagic,
               where + " starts with magic " + std::to_string(header[0]) + ", expected " +
                   std::to_string(kTokenShardMagic) +
                   ": it is not an llm.c token shard (maybe an older llm.c .bin of raw uint16 "
                   "tokens without a header, or another kind of file)" +
                   regenerate);
  ZERO_REQUIRE(header[1] == kTokenShardVersion,
               where + " has format version " + std::to_string(header[1]) +
                   "; this reader supports version " + std::to_string(kTokenShardVersion) +
                   " (uint16 token ids) only" +
                   "\nHINT: re-export the shard as version 1, or tokenize with a vocabulary of "
                   "at most 65536 tokens");
  const int32_t n = header[2];
  ZERO_REQUIRE(n >= 0, where + " has a negative token count (" + std::to_string(n) +
                           ") in its header: the header is corrupt" + regenerate);
  const size_t expected = kTokenShardHeaderBytes + sizeof(uint16_t) * static_cast<size_t>(n);
  ZERO_REQUIRE(size >= expected,
               where + " is truncated: the header says " + std::to_string(n) +
                   " tokens = " + std::to_string(expected) + " bytes expected (" +
                   std::to_string(kTokenShardHeaderBytes) +
                   "-byte header + 2 bytes per token), "
                   "the file has " +
                   std::to_string(size) +
                   "\nHINT: the copy or download was cut short; fetch or regenerate the file");
  ZERO_REQUIRE(size == expected, where + " is longer than its header says: " + std::to_string(n) +
                                     " tokens = " + std::to_string(expected) +
                                     " bytes expected, the file has " + std::to_string(size) +
                                     " (trailing data, or a wrong token count)" + regenerate);
  shard.num_tokens = n;

  // Check every id once here, so batch() never hands the model an out-of-range embedding row.
  // Read in chunks (a GiB-sized shard is not held in memory); a branch-free max pass per chunk
  // vectorises, and only on failure do we look for the first offender.
  constexpr size_t kChunk = size_t{1} << 20;  // tokens
  std::vector<uint16_t> chunk(std::min(kChunk, static_cast<size_t>(n)));
  for (int64_t at = 0; at < n; at += static_cast<int64_t>(kChunk)) {
    const size_t m = std::min(kChunk, static_cast<size_t>(n - at));
    read_tokens(shard, at, m, chunk.data());
    uint16_t max_id = 0;
    for (size_t k = 0; k < m; ++k) max_id = std::max(max_id, chunk[k]);
    if (max_id < vocab_size) continue;
    const auto bad = std::find_if(chunk.begin(), chunk.begin() + static_cast<ptrdiff_t>(m),
                                  [&](uint16_t t) { return t >= vocab_size; });
    const int64_t index = at + (bad - chunk.begin());
    ZERO_FAIL(where + ": the token at index " + std::to_string(index) + " (of " +
              std::to_string(n) + ") is " + std::to_string(*bad) +
              ", outside the model's vocabulary of " + std::to_string(vocab_size) +
              " tokens (ids 0.." + std::to_string(vocab_size - 1) + ")" +
              "\nHINT: the shard was tokenized for a larger vocabulary (GPT-2's has 50257); use "
              "a model whose vocab_size is at least " +
              std::to_string(max_id + 1) + ", or shards tokenized for this model");
  }
  check_unchanged(shard);  // nothing changed while we scanned it
  return shard;
}

void TokenShards::read_bytes(const Shard& shard, void* out, size_t bytes, uint64_t offset) {
  char* p = static_cast<char*>(out);
  uint64_t at = offset;
  size_t left = bytes;
  while (left > 0) {
    const ssize_t r = ::pread(shard.file->fd, p, left, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ZERO_FAIL("reading token shard " + quoted(shard.path) + " (bytes " + std::to_string(at) +
                ".." + std::to_string(offset + bytes) + ") failed: " + errno_text(err) +
                "\nHINT: the disk or network file system reported an error; check it (dmesg), "
                "then restart the run (--resume continues from its last checkpoint)");
    }
    if (r == 0) {
      check_unchanged(shard);  // says how it changed: it is shorter now than when opened
      ZERO_FAIL("token shard " + quoted(shard.path) + " changed while it was being read: it had " +
                std::to_string(shard.file->size) + " bytes when opened, and a read now ends at byte " +
                std::to_string(at) + " (it was truncated)" + kChangedHint);
    }
    p += r;
    at += static_cast<uint64_t>(r);
    left -= static_cast<size_t>(r);
  }
}

void TokenShards::read_tokens(const Shard& shard, int64_t first, size_t count, uint16_t* out) {
  read_bytes(shard, out, count * sizeof(uint16_t),
             kTokenShardHeaderBytes + sizeof(uint16_t) * static_cast<uint64_t>(first));
}

void TokenShards::check_unchanged(const Shard& shard) {
  const OpenFile& f = *shard.file;
  const std::string where = "token shard " + quoted(shard.path);
  struct stat now {};
  if (::fstat(f.fd, &now) != 0) {
    const int err = errno;
    ZERO_FAIL("cannot stat " + where + ": " + errno_text(err) + kChangedHint);
  }
  if (now.st_size != f.size)
    ZERO_FAIL(where + " changed while it was being read: it had " + std::to_string(f.size) +
              " bytes when opened and has " + std::to_string(now.st_size) + " now (it was " +
              (now.st_size < f.size ? "truncated" : "appended to") + ")" + kChangedHint);
  if (now.st_mtim.tv_sec != f.mtime.tv_sec || now.st_mtim.tv_nsec != f.mtime.tv_nsec)
    ZERO_FAIL(where + " changed while it was being read: it was rewritten in place (same size, "
                      "new modification time)" +
              kChangedHint);
  // The open descriptor still reads the original file after a rename over its path or an
  // unlink; the next run, and a resumed one, would read something else, so this is a change too.
  struct stat at_path {};
  if (::stat(shard.path.c_str(), &at_path) != 0) {
    const int err = errno;
    ZERO_FAIL(where + " changed while it was being read: its path no longer opens (" +
              errno_text(err) + "; it was deleted or renamed)" + kChangedHint);
  }
  if (at_path.st_dev != f.dev || at_path.st_ino != f.ino)
    ZERO_FAIL(where + " changed while it was being read: another file was put in its place "
                      "(renamed over it, or deleted and written anew)" +
              kChangedHint);
}

std::vector<int64_t> TokenShards::window_offsets(int seq_len) const {
  ZERO_REQUIRE(seq_len >= 1,
               "token shards: seq_len is " + std::to_string(seq_len) + "; it must be at least 1");
  std::vector<int64_t> offsets{0};
  offsets.reserve(shards_.size() + 1);
  for (const Shard& s : shards_) {
    const int64_t n = s.num_tokens;
    ZERO_REQUIRE(n >= int64_t{seq_len} + 1,
                 "token shard " + quoted(s.path) + " has " + std::to_string(n) +
                     " tokens, fewer than the seq_len + 1 = " + std::to_string(seq_len + 1) +
                     " one sequence needs (its inputs plus the shifted last target)" +
                     "\nHINT: use seq_len <= " + std::to_string(std::max<int64_t>(n - 1, 0)) +
                     ", or leave this shard out (or merge it with others)");
    offsets.push_back(offsets.back() + (n - 1) / seq_len);
  }
  return offsets;
}

int64_t TokenShards::windows_per_epoch(int seq_len) const { return window_offsets(seq_len).back(); }

TokenBatch TokenShards::batch(int64_t first_sequence, int count, int seq_len) const {
  ZERO_REQUIRE(first_sequence >= 0 && count >= 0 &&
                   first_sequence <= std::numeric_limits<int64_t>::max() - count,
               "token shards: batch(): sequence range [" + std::to_string(first_sequence) + ", +" +
                   std::to_string(count) + ") is invalid; first_sequence and count must be >= 0");
  const std::vector<int64_t> offsets = window_offsets(seq_len);
  const auto windows = static_cast<uint64_t>(offsets.back());
  std::vector<int64_t> chosen(static_cast<size_t>(count));
  for (int r = 0; r < count; ++r) {
    const auto i = static_cast<uint64_t>(first_sequence + r);
    const uint64_t epoch = i / windows;
    // A fresh permutation object per row costs a few shifts: no cache, so no lock.
    const detail::IndexPermutation perm(windows, detail::hash_counters(seed_, kEpochStream, epoch));
    chosen[static_cast<size_t>(r)] = static_cast<int64_t>(perm(i % windows));
  }
  return read_windows(chosen, offsets, seq_len);
}

TokenBatch TokenShards::ordered_batch(int64_t first_window, int count, int seq_len) const {
  const std::vector<int64_t> offsets = window_offsets(seq_len);
  const int64_t windows = offsets.back();
  ZERO_REQUIRE(first_window >= 0 && count >= 0 && first_window <= windows - count,
               "token shards: ordered_batch(): windows [" + std::to_string(first_window) + ", +" +
                   std::to_string(count) + ") are not within the " + std::to_string(windows) +
                   " windows of seq_len " + std::to_string(seq_len) + " the files hold");
  std::vector<int64_t> chosen(static_cast<size_t>(count));
  for (int r = 0; r < count; ++r) chosen[static_cast<size_t>(r)] = first_window + r;
  return read_windows(chosen, offsets, seq_len);
}

TokenBatch TokenShards::read_windows(const std::vector<int64_t>& windows,
                                     const std::vector<int64_t>& offsets, int seq_len) const {
  TokenBatch out;
  out.rows = static_cast<int>(windows.size());
  out.cols = seq_len;
  const size_t cells = windows.size() * static_cast<size_t>(seq_len);
  out.inputs.resize(cells);
  out.targets.resize(cells);
  std::vector<uint16_t> src(static_cast<size_t>(seq_len) + 1);
  std::vector<char> touched(shards_.size(), 0);
  for (size_t r = 0; r < windows.size(); ++r) {
    const int64_t w = windows[r];
    const size_t s = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), w) -
                                         offsets.begin() - 1);
    read_tokens(shards_[s], (w - offsets[s]) * seq_len, src.size(), src.data());
    touched[s] = 1;
    int32_t* in = out.inputs.data() + r * static_cast<size_t>(seq_len);
    int32_t* tg = out.targets.data() + r * static_cast<size_t>(seq_len);
    for (int t = 0; t < seq_len; ++t) {
      in[t] = src[static_cast<size_t>(t)];
      tg[t] = src[static_cast<size_t>(t) + 1];
    }
  }
  // After the reads: a change before or during them shows here, so nothing returned comes from
  // a changed file (a change after them concerns later batches, which check again).
  for (size_t s = 0; s < shards_.size(); ++s)
    if (touched[s]) check_unchanged(shards_[s]);
  return out;
}

std::vector<uint16_t> TokenShards::shard_tokens(size_t i) const {
  const Shard& s = shards_.at(i);
  std::vector<uint16_t> tokens(static_cast<size_t>(s.num_tokens));
  read_tokens(s, 0, tokens.size(), tokens.data());
  check_unchanged(s);
  return tokens;
}

std::vector<std::string> TokenShards::paths() const {
  std::vector<std::string> p;
  for (const Shard& s : shards_) p.push_back(s.path);
  return p;
}

std::string TokenShards::describe() const {
  std::string files = std::to_string(shards_.size()) +
                      (shards_.size() == 1 ? " file " : " files ") + quoted(shards_.front().path);
  if (shards_.size() > 1) files += " .. " + quoted(shards_.back().path);
  return "token shards: " + files + ", " + std::to_string(num_tokens_) + " tokens, vocab " +
         std::to_string(vocab_size_) + ", seed " + std::to_string(seed_);
}

void write_token_shard(const std::string& path, std::span<const uint16_t> tokens) {
  ZERO_REQUIRE(tokens.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
               "write_token_shard: " + std::to_string(tokens.size()) + " tokens for " +
                   quoted(path) + ", more than the header's int32 count can hold" +
                   "\nHINT: split the tokens over several shards");
  // Unique per process and call, so concurrent writers of the same path do not collide; the
  // last rename wins, and each rename installs a complete file.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const auto fail = [&](const char* what, int err) {
    ::unlink(tmp.c_str());
    ZERO_FAIL("write_token_shard: " + std::string(what) + " for " + quoted(path) + " (via " +
              quoted(tmp) + ") failed: " + errno_text(err) +
              "\nHINT: check that the directory exists and is writable, and the disk space");
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) fail("open", errno);

  int32_t header[kTokenShardHeaderInts] = {};
  header[0] = kTokenShardMagic;
  header[1] = kTokenShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  const auto write_all = [&](const void* data, size_t bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t w = ::write(fd, p, bytes);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        const int err = errno;
        ::close(fd);
        fail("write", err);
      }
      p += w;
      bytes -= static_cast<size_t>(w);
    }
  };
  write_all(header, sizeof header);
  write_all(tokens.data(), tokens.size_bytes());
  // Flushed before the rename: otherwise a crash could leave the new name on a file whose
  // contents never reached the disk.
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("fsync", err);
  }
  if (::close(fd) != 0) fail("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename", errno);
}

}  // namespace zero::models::data
