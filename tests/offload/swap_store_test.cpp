// The swap store (offload/swap_store.hpp): tensors of odd sizes round-trip through both
// back-ends; files and directories are gone after the store; ranks get their own directories;
// a directory in use, left-overs of a crash, and every nvme_path failure (missing, not a
// directory, read-only, full, no O_DIRECT).
#include "offload/swap_store.hpp"

#include <sys/mount.h>
#include <sys/stat.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "tests/offload/scratch_dir.hpp"

using namespace zero::offload;
using Catch::Matchers::ContainsSubstring;
using zero::test::ScratchDir;
using zero::test::ScratchMount;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<char, decltype(&std::free)> aligned(size_t bytes) {
  return {static_cast<char*>(std::aligned_alloc(kAioAlignment, SwapStore::padded(bytes))),
          &std::free};
}

std::unique_ptr<AioEngine> make_engine(AioBackend b) {
  AioOptions opt;
  opt.backend = b;
  opt.block_size = 64 << 10;
  try {
    return std::make_unique<AioEngine>(opt);
  } catch (const zero::Error& e) {
    if (b == AioBackend::io_uring) SKIP("io_uring unavailable here: " << e.what());
    throw;
  }
}

// Tensors of odd sizes written together, read back together, then removed one by one.
void round_trip(AioEngine& io, const std::string& nvme_path, bool expect_direct) {
  SwapStore store(io, nvme_path, 0);
  CHECK(store.direct() == expect_direct);
  const std::vector<size_t> sizes = {1, 4095, 4096, 4097, 12345, 1'234'567};
  std::mt19937_64 rng(11);
  std::vector<std::unique_ptr<char, decltype(&std::free)>> src, dst;
  std::vector<AioHandle> hs;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string name = "group" + std::to_string(i) + ".exp_avg";
    store.create(name, sizes[i]);
    src.push_back(aligned(sizes[i]));
    dst.push_back(aligned(sizes[i]));
    for (size_t k = 0; k < sizes[i]; ++k) src.back().get()[k] = static_cast<char>(rng());
    std::memset(dst.back().get(), 0, SwapStore::padded(sizes[i]));
    hs.push_back(store.write(name, src.back().get()));
  }
  uint64_t padded_sum = 0;
  for (size_t s : sizes) padded_sum += SwapStore::padded(s);
  CHECK(store.bytes_on_drive() == padded_sum);
  for (AioHandle h : hs) io.wait(h);
  hs.clear();
  for (size_t i = 0; i < sizes.size(); ++i)
    hs.push_back(store.read("group" + std::to_string(i) + ".exp_avg", dst[i].get()));
  for (AioHandle h : hs) io.wait(h);
  for (size_t i = 0; i < sizes.size(); ++i) {
    CAPTURE(sizes[i]);
    REQUIRE(std::memcmp(src[i].get(), dst[i].get(), sizes[i]) == 0);
  }
  // A range inside a tensor: its second 4 KiB block.
  std::memset(dst[5].get(), 0, 4096);
  io.wait(store.read("group5.exp_avg", dst[5].get(), 4096, 4096));
  CHECK(std::memcmp(dst[5].get(), src[5].get() + 4096, 4096) == 0);

  store.remove("group0.exp_avg");
  CHECK_FALSE(store.contains("group0.exp_avg"));
  CHECK_FALSE(fs::exists(store.directory() + "/group0.exp_avg.swp"));
  CHECK(fs::exists(store.directory() + "/group1.exp_avg.swp"));
}

}  // namespace

TEST_CASE("swap store round trip through io_uring", "[swap]") {
  ScratchDir dir;
  auto io = make_engine(AioBackend::io_uring);
  round_trip(*io, dir.path, true);
}

TEST_CASE("swap store round trip through the thread back-end", "[swap]") {
  ScratchDir dir;
  auto io = make_engine(AioBackend::threads);
  round_trip(*io, dir.path, true);
}

TEST_CASE("swap files and directories are removed with the store", "[swap]") {
  ScratchDir dir;
  AioEngine io;
  std::string where;
  {
    SwapStore store(io, dir.path, 3);
    where = store.directory();
    CHECK(where == dir.path + "/zero-swap/rank3");
    store.create("a", 100);
    store.create("b", 10000);
    CHECK(fs::exists(where + "/a.swp"));
    CHECK(fs::exists(where + "/b.swp"));
  }
  CHECK_FALSE(fs::exists(where));
  CHECK_FALSE(fs::exists(dir.path + "/zero-swap"));
  CHECK(fs::is_empty(dir.path));
}

// Ranks sharing nvme_path: the one that made zero-swap may finish first; the last one removes it.
TEST_CASE("zero-swap goes with the last store even when its maker leaves first", "[swap]") {
  ScratchDir dir;
  AioEngine io;
  auto maker = std::make_unique<SwapStore>(io, dir.path, 0);
  {
    SwapStore other(io, dir.path, 1);
    other.create("a", 100);
    maker.reset();
    CHECK(fs::exists(dir.path + "/zero-swap/rank1/a.swp"));
  }
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("ranks sharing nvme_path get their own directories", "[swap]") {
  ScratchDir dir;
  AioEngine io;
  SwapStore r0(io, dir.path, 0), r1(io, dir.path, 1);
  CHECK(r0.directory() != r1.directory());
  r0.create("w", 4096);
  r1.create("w", 4096);  // the same name on another rank: its own file
  auto a = aligned(4096), b = aligned(4096);
  std::memset(a.get(), 'a', 4096);
  std::memset(b.get(), 'b', 4096);
  io.wait(r0.write("w", a.get()));
  io.wait(r1.write("w", b.get()));
  io.wait(r0.read("w", b.get()));
  CHECK(b.get()[4095] == 'a');
}

TEST_CASE("a second store on the same rank directory is refused", "[swap]") {
  ScratchDir dir;
  AioEngine io;
  SwapStore first(io, dir.path, 0);
  CHECK_THROWS_WITH(SwapStore(io, dir.path, 0),
                    ContainsSubstring("in use by another process") &&
                        ContainsSubstring(first.directory()));
}

TEST_CASE("files left by a crashed run are removed at start", "[swap]") {
  ScratchDir dir;
  fs::create_directories(dir.path + "/zero-swap/rank0");
  std::ofstream(dir.path + "/zero-swap/rank0/old.exp_avg.swp") << "left over";
  AioEngine io;
  SwapStore store(io, dir.path, 0);
  CHECK_FALSE(fs::exists(dir.path + "/zero-swap/rank0/old.exp_avg.swp"));
}

TEST_CASE("a missing nvme_path is an error naming it", "[swap]") {
  ScratchDir dir;
  AioEngine io;
  const std::string missing = dir.path + "/no/such/dir";
  CHECK_THROWS_WITH(SwapStore(io, missing, 0),
                    ContainsSubstring(missing) && ContainsSubstring("does not exist") &&
                        ContainsSubstring("mkdir -p"));
  CHECK_THROWS_WITH(SwapStore(io, "", 0), ContainsSubstring("nvme_path is empty"));
}

TEST_CASE("an nvme_path that is a file is an error naming it", "[swap]") {
  ScratchDir dir;
  const std::string file = dir.path + "/plain";
  std::ofstream(file) << "x";
  AioEngine io;
  CHECK_THROWS_WITH(SwapStore(io, file, 0),
                    ContainsSubstring(file) && ContainsSubstring("not a directory") &&
                        ContainsSubstring("point nvme_path at a directory"));
}

// chmod does not stop root, so a read-only tmpfs stands for a read-only drive.
TEST_CASE("a read-only nvme_path is an error naming it", "[swap]") {
  ScratchMount m("tmpfs", "size=1m", MS_RDONLY);
  if (!m.mounted) SKIP(m.why);
  AioEngine io;
  CHECK_THROWS_WITH(SwapStore(io, m.path(), 0),
                    ContainsSubstring(m.path() + "/zero-swap") && ContainsSubstring("EROFS") &&
                        ContainsSubstring("writable"));
}

TEST_CASE("a drive too small for a tensor fails at create with ENOSPC", "[swap]") {
  ScratchMount m("tmpfs", "size=1m");
  if (!m.mounted) SKIP(m.why);
  AioEngine io;
  SwapStore store(io, m.path(), 0);
  store.create("small", 100 << 10);
  CHECK_THROWS_WITH(store.create("big", 4 << 20),
                    ContainsSubstring(store.directory() + "/big.swp") &&
                        ContainsSubstring("ENOSPC") && ContainsSubstring("What to do"));
  CHECK_FALSE(store.contains("big"));
  CHECK_FALSE(fs::exists(store.directory() + "/big.swp"));
}

// ramfs has no O_DIRECT: the store falls back to buffered I/O and still round-trips.
TEST_CASE("a file system without O_DIRECT falls back to buffered I/O", "[swap]") {
  ScratchMount m("ramfs", "");
  if (!m.mounted) SKIP(m.why);
  AioEngine io;
  round_trip(io, m.path(), false);
}

TEST_CASE("bad tensor names and unknown tensors are errors", "[swap]") {
  ScratchDir dir;
  AioEngine io;
  SwapStore store(io, dir.path, 0);
  CHECK_THROWS_WITH(store.create("../escape", 10), ContainsSubstring("not usable as a file name"));
  CHECK_THROWS_WITH(store.create(".hidden", 10), ContainsSubstring("not usable as a file name"));
  store.create("t", 10);
  CHECK_THROWS_WITH(store.create("t", 10), ContainsSubstring("already exists"));
  auto buf = aligned(4096);
  CHECK_THROWS_WITH(store.read("nope", buf.get()), ContainsSubstring("no tensor 'nope'"));
  CHECK_THROWS_WITH(store.read("t", buf.get(), 4096, 4096), ContainsSubstring("past the end"));
}
