// A full disk at each step of a commit (save.cpp, commit_save), for real: a small tmpfs mounted
// in a private mount namespace of this test process, filled with a filler file and then given
// back exactly as many pages as the step before the failing one needs (tmpfs counts whole
// pages, and its directories take none). Each failure must name the file and the system's
// error, leave no temporary directory, and keep every earlier checkpoint loadable; a failed
// update of `latest` keeps the new checkpoint, which find_newest then takes.
// Skipped where the process may not create a mount namespace (not root, no CAP_SYS_ADMIN).
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/layout.hpp"
#include "tests/checkpoint/helpers.hpp"

using namespace zero::checkpoint;
using namespace zero::checkpoint::test;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kPage = 4096;  // tmpfs allocates whole pages (x86-64, arm64 with 4K pages)

// A tmpfs of `bytes` at a fresh directory, in this process's own mount namespace. `error` is set
// (and nothing mounted) where that is not permitted.
struct SmallFs {
  TempDir where;
  std::string path, error;
  explicit SmallFs(uint64_t bytes) {
    static std::string ns_error = [] {
      if (::unshare(CLONE_NEWNS) != 0) return "unshare(CLONE_NEWNS): " + std::string(std::strerror(errno));
      // Mounts made here must not propagate back to the host's namespace.
      if (::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
        return "making / private: " + std::string(std::strerror(errno));
      return std::string();
    }();
    error = ns_error;
    path = where / "fs";
    fs::create_directories(path);
    const std::string opts = "size=" + std::to_string(bytes);
    if (error.empty() && ::mount("zero-test", path.c_str(), "tmpfs", 0, opts.c_str()) != 0)
      error = "mounting a tmpfs: " + std::string(std::strerror(errno));
  }
  ~SmallFs() {
    if (error.empty()) ::umount2(path.c_str(), MNT_DETACH);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }

  // Fills the filesystem, then frees `pages` pages of the filler.
  void fill_leaving(uint64_t pages) const {
    const std::string filler = path + "/filler";
    const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    std::vector<char> chunk(16 * kPage, 'f');
    uint64_t total = 0;
    for (;;) {
      const ssize_t w = ::write(fd, chunk.data(), chunk.size());
      if (w > 0) total += static_cast<uint64_t>(w);
      if (w < 0) {
        REQUIRE(errno == ENOSPC);
        break;
      }
    }
    REQUIRE(total >= pages * kPage);
    REQUIRE(::ftruncate(fd, static_cast<off_t>(total - pages * kPage)) == 0);
    ::close(fd);
  }
};

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

FakeSave sliced(const std::vector<ParamInfo>& params, int world, float shift) {
  FakeSave s;
  s.params = params;
  s.world = world;
  s.pieces = [params, world](int r) { return slicing(params, world, r); };
  s.shift = shift;
  return s;
}

}  // namespace

TEST_CASE("disk full: each step of a commit fails cleanly, and earlier checkpoints stay") {
  SmallFs disk(1 << 20);
  if (!disk.error.empty()) SKIP("cannot mount a small filesystem here: " + disk.error);
  const auto params = model_params(1);
  const std::string dir = disk / "ck";
  sliced(params, 2, 0.0f).run(dir, "old");
  // The manifest and the marker of this model take one page each; the fills below rely on it.
  REQUIRE(fs::file_size(dir + "/old/manifest.json") < kPage);

  FakeSave next = sliced(params, 2, 100.0f);
  const auto rs = next.ranks();
  const std::string tmp = begin_save(dir, "new");
  write_rank_file(tmp, 0, 2, 7, rs[0].request);
  write_rank_file(tmp, 1, 2, 7, rs[1].request);
  const auto old_is_intact = [&] {
    const Loaded l = load_pieces(dir, "old", params, slicing(params, 1, 0));
    CHECK(l.values[0] == values_for(slicing(params, 1, 0), 0));
  };

  SECTION("no room for the manifest") {
    disk.fill_leaving(0);
    CHECK_THROWS_WITH(commit_save(dir, "new", 2, 7, rs[0].request),
                      ContainsSubstring("failed while sealing it") &&
                          ContainsSubstring(tmp + "/manifest.json") &&
                          ContainsSubstring("No space left on device") &&
                          ContainsSubstring("was removed; every earlier checkpoint is untouched"));
    CHECK(entries(dir) == std::vector<std::string>{"latest", "old"});
    CHECK(latest(dir) == "old");
    old_is_intact();
  }
  SECTION("room for the manifest, none for the marker") {
    disk.fill_leaving(1);
    CHECK_THROWS_WITH(commit_save(dir, "new", 2, 7, rs[0].request),
                      ContainsSubstring(tmp + "/COMPLETE") &&
                          ContainsSubstring("No space left on device"));
    CHECK(entries(dir) == std::vector<std::string>{"latest", "old"});
    old_is_intact();
  }
  SECTION("room for the checkpoint, none for the new latest file") {
    disk.fill_leaving(2);
    CHECK_THROWS_WITH(commit_save(dir, "new", 2, 7, rs[0].request),
                      ContainsSubstring("the checkpoint '" + dir + "/new' is complete") &&
                          ContainsSubstring("could not be updated") &&
                          ContainsSubstring("No space left on device") &&
                          ContainsSubstring("HINT"));
    // The new checkpoint stays (it is whole); latest still names the old one; no temporary file.
    CHECK(entries(dir) == std::vector<std::string>{"latest", "new", "old"});
    CHECK(read_bytes(dir + "/latest") == std::vector<char>{'o', 'l', 'd', '\n'});
    const std::optional<Newest> n = find_newest(dir);
    REQUIRE(n.has_value());
    CHECK(n->tag == "new");
    CHECK_THAT(n->note, ContainsSubstring("names 'old', but 'new' was committed after it"));
    const Loaded l = load_pieces(dir, "new", params, slicing(params, 1, 0));
    CHECK(l.values[0] == values_for(slicing(params, 1, 0), 0, 100.0f));
    old_is_intact();
  }
  // Nothing of the failed commit is left for the start-up tidying either.
  CHECK(clean_leftovers(dir).empty());
}

TEST_CASE("disk full: the start-up probe and free space see a full and a read-only filesystem") {
  SmallFs disk(256 * 1024);
  if (!disk.error.empty()) SKIP("cannot mount a small filesystem here: " + disk.error);
  const std::string dir = disk / "ck";
  probe_writable(dir);
  const Space before = free_space(dir);
  CHECK(before.available == 256 * 1024);  // tmpfs: every page is available, none reserved
  disk.fill_leaving(0);
  CHECK(free_space(dir).available == 0);
  CHECK_THROWS_WITH(probe_writable(dir), ContainsSubstring("cannot write a file in the checkpoint "
                                                           "directory '" + dir + "'") &&
                                             ContainsSubstring("No space left on device"));
  CHECK(entries(dir).empty());  // the probe file went with the failure
  fs::remove(disk / "filler");
  REQUIRE(::mount(nullptr, disk.path.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) == 0);
  CHECK_THROWS_WITH(probe_writable(dir), ContainsSubstring("cannot create a file") &&
                                             ContainsSubstring("Read-only file system") &&
                                             ContainsSubstring("HINT"));
}
