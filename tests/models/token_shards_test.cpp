// TokenShards and write_token_shard: the llm.c shard format, windowing, the per-epoch shuffle,
// and one test per error a user can meet. Files go to a fresh directory under /tmp.
#include "models/data/token_shards.hpp"

#include <stdlib.h>

#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::models::data::kTokenShardMagic;
using zero::models::data::TokenBatch;
using zero::models::data::TokenShards;
using zero::models::data::write_token_shard;
namespace fs = std::filesystem;

namespace {

// A fresh directory, removed with everything in it at scope exit.
struct TempDir {
  fs::path path;
  TempDir() {
    char name[] = "/tmp/zero_token_shards_test_XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    path = name;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// Tokens that name their own place: shard s, position t -> s * 1000 + t (shards < 1000 tokens).
std::vector<uint16_t> numbered(int shard, int n) {
  std::vector<uint16_t> v(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) v[static_cast<size_t>(t)] = static_cast<uint16_t>(shard * 1000 + t);
  return v;
}

// A file with the given header fields and `payload_bytes` bytes after the 1024-byte header.
void write_raw(const std::string& path, int32_t magic, int32_t version, int32_t ntok,
               size_t payload_bytes) {
  int32_t header[256] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = ntok;
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header), sizeof header);
  const std::vector<char> payload(payload_bytes, 0);
  f.write(payload.data(), static_cast<std::streamsize>(payload.size()));
}

std::vector<int32_t> row_of(const std::vector<int32_t>& v, const TokenBatch& b, int r) {
  return {v.begin() + static_cast<ptrdiff_t>(r) * b.cols,
          v.begin() + static_cast<ptrdiff_t>(r + 1) * b.cols};
}

// The error's own message (without the "at file:line" suffix) ends with a "HINT: ..." line.
template <typename F>
void check_hint_last(F&& f) {
  try {
    f();
    FAIL("no error");
  } catch (const zero::Error& e) {
    const std::string& m = e.message();
    const size_t last = m.rfind('\n');
    REQUIRE(last != std::string::npos);
    CHECK(m.compare(last + 1, 6, "HINT: ") == 0);
  }
}

}  // namespace

TEST_CASE("token shards: IndexPermutation is a seeded bijection with an inverse") {
  using zero::models::data::detail::IndexPermutation;
  for (uint64_t n : {1u, 2u, 3u, 5u, 64u, 1000u, 4097u}) {
    const IndexPermutation p(n, 42), q(n, 43);
    std::vector<char> hit(n, 0);
    uint64_t moved = 0, differs = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t x = p(i);
      REQUIRE(x < n);
      CHECK(hit[x] == 0);
      hit[x] = 1;
      CHECK(p.inverse(x) == i);
      moved += x != i;
      differs += x != q(i);
    }
    // Shuffled, and differently per key: at n >= 64 the identity or a key-independent order
    // would show (a uniform permutation has about one fixed point).
    if (n >= 64) {
      CHECK(moved > n / 2);
      CHECK(differs > n / 2);
    }
  }
}

TEST_CASE("token shards: write_token_shard writes the llm.c header and the tokens, atomically") {
  TempDir dir;
  const std::string path = dir.file("round.bin");
  const std::vector<uint16_t> tokens = {0, 1, 65535, 7, 50256};
  write_token_shard(path, tokens);

  // The bytes: 256 int32 of header, then the uint16 tokens, nothing else.
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() == 1024 + 2 * tokens.size());
  int32_t header[256];
  std::memcpy(header, bytes.data(), sizeof header);
  CHECK(header[0] == 20240520);
  CHECK(header[1] == 1);
  CHECK(header[2] == 5);
  for (int i = 3; i < 256; ++i) CHECK(header[i] == 0);
  CHECK(std::memcmp(bytes.data() + 1024, tokens.data(), 2 * tokens.size()) == 0);
  // The temporary file was renamed, not left behind.
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);

  const TokenShards shards(path, 65536, 0);
  CHECK(shards.num_shards() == 1);
  CHECK(shards.num_tokens() == 5);
  const auto read = shards.shard_tokens(0);
  CHECK(std::vector<uint16_t>(read.begin(), read.end()) == tokens);
  CHECK_THAT(shards.describe(), ContainsSubstring("5 tokens, vocab 65536"));

  // Rewriting replaces the whole file: a new reader sees the new one; the reader that opened
  // the old one refuses to go on (its run would not be the one its checkpoints describe).
  write_token_shard(path, std::vector<uint16_t>{9, 9});
  CHECK(TokenShards(path, 65536, 0).num_tokens() == 2);
  REQUIRE_THROWS_WITH(shards.shard_tokens(0), ContainsSubstring("another file was put in its place"));
}

TEST_CASE("token shards: windows are seq_len + 1 tokens at stride seq_len, targets shifted") {
  TempDir dir;
  // Shard lengths 13, 9, 25 with T = 4 give (n - 1) / T = 3, 2, 6 windows.
  const int lengths[] = {13, 9, 25};
  std::vector<std::string> paths;
  for (int s = 0; s < 3; ++s) {
    paths.push_back(dir.file("w" + std::to_string(s) + ".bin"));
    write_token_shard(paths.back(), numbered(s, lengths[s]));
  }
  const TokenShards shards(paths, 65536, 7);
  const int T = 4;
  const int64_t W = shards.windows_per_epoch(T);
  REQUIRE(W == 3 + 2 + 6);
  const TokenBatch b = shards.batch(0, static_cast<int>(W), T);
  REQUIRE(b.rows == W);
  REQUIRE(b.cols == T);
  for (int r = 0; r < b.rows; ++r) {
    const auto in = row_of(b.inputs, b, r), tg = row_of(b.targets, b, r);
    const int shard = in[0] / 1000, start = in[0] % 1000;
    INFO("row " << r << " starts at shard " << shard << " token " << start);
    CHECK(start % T == 0);                   // stride T
    CHECK(start + T + 1 <= lengths[shard]);  // the whole window inside its shard
    for (int t = 0; t < T; ++t) {
      CHECK(in[static_cast<size_t>(t)] == shard * 1000 + start + t);
      CHECK(tg[static_cast<size_t>(t)] == shard * 1000 + start + t + 1);  // no -1 targets
    }
  }
  CHECK(b.item.empty());
}

TEST_CASE("token shards: every window appears exactly once per epoch, reshuffled each epoch") {
  TempDir dir;
  write_token_shard(dir.file("a.bin"), numbered(0, 600));
  write_token_shard(dir.file("b.bin"), numbered(1, 333));
  const TokenShards shards({dir.file("a.bin"), dir.file("b.bin")}, 65536, 123);
  const int T = 8;
  const int64_t W = shards.windows_per_epoch(T);
  REQUIRE(W == 599 / 8 + 332 / 8);
  std::vector<std::vector<int32_t>> orders;
  for (int epoch = 0; epoch < 3; ++epoch) {
    const TokenBatch b = shards.batch(epoch * W, static_cast<int>(W), T);
    std::vector<int32_t> starts;
    for (int r = 0; r < b.rows; ++r) starts.push_back(b.inputs[static_cast<size_t>(r) * T]);
    CHECK(std::set<int32_t>(starts.begin(), starts.end()).size() == static_cast<size_t>(W));
    orders.push_back(starts);
  }
  CHECK(orders[0] != orders[1]);
  CHECK(orders[1] != orders[2]);
  // Shuffled, not file order: file order would start with shard 0's windows 0, 8, 16, ...
  std::vector<int32_t> file_order;
  for (int s = 0; s < 2; ++s)
    for (int k = 0; k < (s == 0 ? 599 : 332) / T; ++k) file_order.push_back(s * 1000 + k * T);
  CHECK(orders[0] != file_order);
}

TEST_CASE("token shards: batches are a pure, thread-safe function of the indices") {
  TempDir dir;
  write_token_shard(dir.file("x.bin"), numbered(0, 999));
  const TokenShards shards(dir.file("x.bin"), 1000, 5);
  const int T = 16;
  const TokenBatch whole = shards.batch(0, 200, T);  // crosses into the fourth epoch (W = 62)
  const TokenBatch part = shards.batch(50, 30, T);
  for (int r = 0; r < 30; ++r) {
    CHECK(row_of(part.inputs, part, r) == row_of(whole.inputs, whole, 50 + r));
    CHECK(row_of(part.targets, part, r) == row_of(whole.targets, whole, 50 + r));
  }
  CHECK(TokenShards(dir.file("x.bin"), 1000, 5).batch(0, 200, T).inputs == whole.inputs);
  CHECK(TokenShards(dir.file("x.bin"), 1000, 6).batch(0, 200, T).inputs != whole.inputs);

  // Concurrent callers get the same answers as a sequential one.
  std::vector<TokenBatch> got(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] { got[static_cast<size_t>(k)] = shards.batch(0, 200, T); });
  for (auto& t : threads) t.join();
  for (const TokenBatch& g : got) CHECK(g.inputs == whole.inputs);
}

TEST_CASE("token shards: a glob pattern expands to its matches in sorted order") {
  TempDir dir;
  for (const char* name : {"train_002.bin", "train_000.bin", "train_001.bin", "val_000.bin"})
    write_token_shard(dir.file(name), numbered(0, 20));
  const TokenShards shards(dir.file("train_*.bin"), 65536, 0);
  CHECK(shards.paths() == std::vector<std::string>{dir.file("train_000.bin"),
                                                   dir.file("train_001.bin"),
                                                   dir.file("train_002.bin")});
  CHECK(shards.num_tokens() == 60);
  CHECK_THAT(shards.describe(), ContainsSubstring("3 files"));

  const std::string none = dir.file("test_*.bin");
  REQUIRE_THROWS_WITH(TokenShards(none, 65536, 0),
                      ContainsSubstring("no file matches the pattern '" + none + "'"));
  check_hint_last([&] { TokenShards(none, 65536, 0); });
}

TEST_CASE("token shards: each malformed file gets a message naming it, the problem and a hint") {
  TempDir dir;
  const std::string p = dir.file("bad.bin");

  SECTION("wrong magic") {
    write_raw(p, 12345, 1, 0, 0);
    REQUIRE_THROWS_WITH(TokenShards(p, 65536, 0), ContainsSubstring("token shard '" + p +
                                                                    "' starts with magic 12345, "
                                                                    "expected 20240520"));
    REQUIRE_THROWS_WITH(TokenShards(p, 65536, 0), ContainsSubstring("not an llm.c token shard"));
    REQUIRE_THROWS_WITH(TokenShards(p, 65536, 0), ContainsSubstring("older"));
    check_hint_last([&] { TokenShards(p, 65536, 0); });
  }
  SECTION("unsupported version") {
    write_raw(p, kTokenShardMagic, 2, 0, 0);
    REQUIRE_THROWS_WITH(TokenShards(p, 65536, 0),
                        ContainsSubstring("'" + p +
                                          "' has format version 2; this reader "
                                          "supports version 1"));
    check_hint_last([&] { TokenShards(p, 65536, 0); });
  }
  SECTION("truncated") {
    write_raw(p, kTokenShardMagic, 1, 100, 50);
    REQUIRE_THROWS_WITH(TokenShards(p, 65536, 0),
                        ContainsSubstring("'" + p +
                                          "' is truncated: the header says 100 tokens "
                                          "= 1224 bytes expected"));
    REQUIRE_THROWS_WITH(TokenShards(p, 65536, 0), ContainsSubstring("the file has 1074"));
    check_hint_last([&] { TokenShards(p, 65536, 0); });
  }
  SECTION("longer than the header says") {
    write_raw(p, kTokenShardMagic, 1, 10, 24);
    REQUIRE_THROWS_WITH(TokenShards(p, 65536, 0),
                        ContainsSubstring("is longer than its header says"));
    check_hint_last([&] { TokenShards(p, 65536, 0); });
  }
  SECTION("shorter than the header") {
    std::ofstream(p, std::ios::binary) << std::string(100, 'x');
    REQUIRE_THROWS_WITH(TokenShards(p, 65536, 0),
                        ContainsSubstring("'" + p +
                                          "' has 100 bytes, shorter than the "
                                          "1024-byte header"));
    check_hint_last([&] { TokenShards(p, 65536, 0); });
  }
  SECTION("empty file") {
    std::ofstream(p, std::ios::binary).flush();
    REQUIRE_THROWS_WITH(TokenShards(p, 65536, 0), ContainsSubstring("has 0 bytes"));
  }
  SECTION("a token outside the vocabulary") {
    write_token_shard(p, std::vector<uint16_t>{1, 2, 70, 3, 99});
    REQUIRE_THROWS_WITH(TokenShards(p, 64, 0),
                        ContainsSubstring("'" + p +
                                          "': the token at index 2 (of 5) is 70, outside the "
                                          "model's vocabulary of 64 tokens"));
    REQUIRE_THROWS_WITH(TokenShards(p, 64, 0), ContainsSubstring("at least 100"));
    check_hint_last([&] { TokenShards(p, 64, 0); });
    CHECK(TokenShards(p, 100, 0).num_tokens() == 5);  // 99 < 100: the boundary is accepted
  }
  SECTION("missing file") {
    REQUIRE_THROWS_WITH(TokenShards(dir.file("nope.bin"), 65536, 0),
                        ContainsSubstring("cannot open token shard '" + dir.file("nope.bin") +
                                          "': No such file or directory"));
    check_hint_last([&] { TokenShards(dir.file("nope.bin"), 65536, 0); });
  }
}

TEST_CASE("token shards: a shard shorter than one window and bad requests are refused") {
  TempDir dir;
  write_token_shard(dir.file("big.bin"), numbered(0, 100));
  write_token_shard(dir.file("small.bin"), numbered(1, 10));
  const TokenShards shards({dir.file("big.bin"), dir.file("small.bin")}, 65536, 0);
  CHECK(shards.batch(0, 2, 9).rows == 2);  // 10 tokens hold one window of 9 + 1
  REQUIRE_THROWS_WITH(shards.batch(0, 1, 10),
                      ContainsSubstring("token shard '" + dir.file("small.bin") +
                                        "' has 10 tokens, fewer than the seq_len + 1 = 11"));
  REQUIRE_THROWS_WITH(shards.batch(0, 1, 10), ContainsSubstring("use seq_len <= 9"));
  check_hint_last([&] { shards.batch(0, 1, 10); });
  REQUIRE_THROWS_WITH(shards.batch(0, 1, 0), ContainsSubstring("seq_len is 0"));
  REQUIRE_THROWS_WITH(shards.batch(-3, 1, 4), ContainsSubstring("must be >= 0"));
  REQUIRE_THROWS_WITH(TokenShards(std::vector<std::string>{}, 65536, 0),
                      ContainsSubstring("no files given"));
  REQUIRE_THROWS_WITH(TokenShards(dir.file("big.bin"), 0, 0),
                      ContainsSubstring("vocab_size is 0; it must be 1..65536"));
}

TEST_CASE("token shards: a file that changes under the reader is an error naming it, never a signal") {
  using namespace std::chrono_literals;
  TempDir dir;
  const int T = 8;
  const std::vector<uint16_t> tokens = numbered(0, 801);  // 100 windows of 8
  const std::string path = dir.file("live.bin");
  const std::string other = dir.file("other.bin");
  auto fresh = [&] {
    write_token_shard(path, tokens);
    write_token_shard(other, numbered(1, 801));
    // Sibling shards: a batch touches both, and only the changed one may be blamed.
    return TokenShards(std::vector<std::string>{path, other}, 65536, 3);
  };
  auto expect_changed = [&](const TokenShards& shards, const std::string& what) {
    // Every window of the epoch, so the changed file's windows are surely read.
    try {
      (void)shards.batch(0, 200, T);
      FAIL("no error for: " + what);
    } catch (const zero::Error& e) {
      CHECK_THAT(e.message(), ContainsSubstring("token shard '" + path + "' changed while it was being read"));
      CHECK_THAT(e.message(), ContainsSubstring(what));
      CHECK_THAT(e.message(), ContainsSubstring("HINT: "));
      CHECK_THAT(e.message(), ContainsSubstring("--resume"));
    }
  };

  SECTION("truncated to the header: mmap would have raised SIGBUS here") {
    const TokenShards shards = fresh();
    CHECK(shards.batch(0, 200, T).rows == 200);
    REQUIRE(::truncate(path.c_str(), 1024) == 0);
    expect_changed(shards, "truncated");
  }
  SECTION("truncated in the middle") {
    const TokenShards shards = fresh();
    REQUIRE(::truncate(path.c_str(), 1024 + 2 * 700) == 0);
    expect_changed(shards, "it had 2626 bytes when opened and has 2424 now (it was truncated)");
    // The same, through an ordered (evaluation) read and a whole-shard read.
    REQUIRE_THROWS_WITH(shards.ordered_batch(0, 200, T), ContainsSubstring("changed while it was being read"));
    REQUIRE_THROWS_WITH(shards.shard_tokens(0), ContainsSubstring("changed while it was being read"));
  }
  SECTION("appended to") {
    const TokenShards shards = fresh();
    std::ofstream(path, std::ios::binary | std::ios::app).write("\0\0", 2);
    expect_changed(shards, "(it was appended to)");
  }
  SECTION("rewritten in place, same size") {
    const TokenShards shards = fresh();
    // Past the file system's timestamp granularity (a clock tick of a few ms), so that the
    // rewrite gets a new modification time; see token_shards.hpp.
    std::this_thread::sleep_for(50ms);
    {
      std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
      f.seekp(1024);
      f.write("\x07\x00", 2);
    }
    expect_changed(shards, "rewritten in place");
  }
  SECTION("replaced by rename, and deleted") {
    const TokenShards shards = fresh();
    write_token_shard(path, tokens);  // same contents, another file
    expect_changed(shards, "another file was put in its place");
    REQUIRE(::unlink(path.c_str()) == 0);
    expect_changed(shards, "deleted or renamed");
  }
  SECTION("unchanged files read the same after any number of checks") {
    const TokenShards shards = fresh();
    const TokenBatch a = shards.batch(0, 200, T);
    CHECK(shards.batch(0, 200, T).inputs == a.inputs);
    // The other shard changing does not affect a batch that reads only this one, in file order.
    REQUIRE(::truncate(other.c_str(), 1024) == 0);
    const TokenBatch first = shards.ordered_batch(0, 100, T);
    for (int r = 0; r < 100; ++r) CHECK(first.inputs[static_cast<size_t>(r) * T] == r * T);
    REQUIRE_THROWS_WITH(shards.ordered_batch(100, 1, T), ContainsSubstring("'" + other + "' changed"));
  }
}

TEST_CASE("token shards: ordered_batch reads the windows in file order, without the seed") {
  TempDir dir;
  const int lengths[] = {13, 9, 25};  // T = 4: 3, 2 and 6 windows
  std::vector<std::string> paths;
  for (int s = 0; s < 3; ++s) {
    paths.push_back(dir.file("o" + std::to_string(s) + ".bin"));
    write_token_shard(paths.back(), numbered(s, lengths[s]));
  }
  const TokenShards a(paths, 65536, 1), b(paths, 65536, 2);
  REQUIRE(a.windows_per_epoch(4) == 11);
  const TokenBatch all = a.ordered_batch(0, 11, 4);
  CHECK(all.inputs == b.ordered_batch(0, 11, 4).inputs);  // the seed plays no part
  const int shard_of[] = {0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2}, first_of[] = {0, 4, 8, 0, 4, 0, 4, 8, 12, 16, 20};
  for (int w = 0; w < 11; ++w) {
    CHECK(all.inputs[static_cast<size_t>(w) * 4] == shard_of[w] * 1000 + first_of[w]);
    CHECK(all.targets[static_cast<size_t>(w) * 4 + 3] == shard_of[w] * 1000 + first_of[w] + 4);
  }
  const TokenBatch tail = a.ordered_batch(9, 2, 4);
  CHECK(std::vector<int32_t>(all.inputs.begin() + 36, all.inputs.end()) == tail.inputs);
  REQUIRE_THROWS_WITH(a.ordered_batch(10, 2, 4), ContainsSubstring("not within the 11 windows"));
}
