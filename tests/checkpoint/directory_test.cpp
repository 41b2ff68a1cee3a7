// The checkpoint directory before a run relies on it (directory.cpp): a save's size against the
// files a save really writes, the writability probe, the free space, and the tidying of what
// interrupted or failed saves left (which never loses the newest complete copy of a tag).
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/layout.hpp"
#include "runtime/checkpoint/rank_file.hpp"
#include "tests/checkpoint/helpers.hpp"

using namespace zero::checkpoint;
using namespace zero::checkpoint::test;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

FakeSave sliced(const std::vector<ParamInfo>& params, int world, float shift = 0.0f) {
  FakeSave s;
  s.params = params;
  s.world = world;
  s.pieces = [params, world](int r) { return slicing(params, world, r); };
  s.shift = shift;
  return s;
}

// The value every element of array 0 of parameter 0 was saved with in dir/tag.
float first_value(const std::string& dir, const std::string& tag,
                  const std::vector<ParamInfo>& params) {
  return load_pieces(dir, tag, params, {{0, 0, 1}}).values[0][0];
}

}  // namespace

TEST_CASE("directory: save_bytes is each rank file's exact size; the sum bounds the checkpoint") {
  TempDir dir;
  const auto params = model_params();
  for (int world : {1, 3}) {
    INFO("world " << world);
    FakeSave s = sliced(params, world);
    s.run(dir.path, "t" + std::to_string(world));
    const auto rs = s.ranks();
    uint64_t bound = 0, rank_files = 0, all = 0;
    for (int r = 0; r < world; ++r) {
      const std::string file = dir / ("t" + std::to_string(world)) + "/" + rank_file_name(r);
      const uint64_t have = fs::file_size(file);
      rank_files += have;
      const SaveRequest& req = rs[static_cast<size_t>(r)].request;
      CHECK(detail::rank_file_bytes(req.pieces, array_names(), req.block_elems) == have);
      const uint64_t b = save_bytes(req, r);
      CHECK(b > have);
      CHECK(b - have < 64 * 1024);  // the manifest allowance: small next to real arrays
      bound += b;
    }
    for (const auto& e : fs::directory_iterator(dir / ("t" + std::to_string(world))))
      all += fs::file_size(e.path());
    all += fs::file_size(dir / "latest");
    CHECK(all <= bound);
    CHECK(all > rank_files);
  }
}

TEST_CASE("directory: probe_writable creates the directory and leaves nothing behind") {
  TempDir dir;
  const std::string d = dir / "a/b/c";
  probe_writable(d);
  CHECK(fs::is_directory(d));
  CHECK(entries(d).empty());
  // A path under a regular file cannot be a directory: the error names it.
  write_bytes(dir / "file", {'x'});
  CHECK_THROWS_WITH(probe_writable(dir / "file/sub"),
                    ContainsSubstring("cannot create the directory") &&
                        ContainsSubstring(dir / "file/sub") && ContainsSubstring("HINT"));
  const Space sp = free_space(d);
  CHECK(sp.block > 0);
  CHECK(sp.available > 0);
  CHECK_THROWS_WITH(free_space(dir / "missing"), ContainsSubstring(dir / "missing"));
}

TEST_CASE("directory: clean_leftovers keeps the newest complete copy of every tag") {
  TempDir dir;
  const auto params = model_params(1);
  sliced(params, 2, 0.0f).run(dir.path, "keep");

  SECTION("an unsealed temporary directory is removed") {
    fs::create_directories(detail::tmp_dir(dir.path, "next"));
    write_bytes(detail::tmp_dir(dir.path, "next") + "/rank_00000.bin", {'x'});
    const auto done = clean_leftovers(dir.path);
    REQUIRE(done.size() == 1);
    CHECK_THAT(done[0], ContainsSubstring("removed") && ContainsSubstring(".next.tmp"));
    CHECK(entries(dir.path) == std::vector<std::string>{"keep", "latest"});
  }
  SECTION("a sealed copy older than dir/<tag> (left by a swap) is removed") {
    sliced(params, 2, 100.0f).run(dir.path, "newer");  // committed after "keep"
    fs::rename(dir / "keep", dir / "older");
    fs::rename(dir / "newer", dir / "keep");             // dir/keep: the newer one
    fs::rename(dir / "older", detail::tmp_dir(dir.path, "keep"));
    CHECK(clean_leftovers(dir.path).size() == 1);
    CHECK(entries(dir.path) == std::vector<std::string>{"keep", "latest"});
    CHECK(first_value(dir.path, "keep", params) == value(0, 0, 0) + 100.0f);
  }
  SECTION("a sealed copy newer than dir/<tag> (killed before its swap) replaces it") {
    sliced(params, 2, 100.0f).run(dir.path, "staged");
    fs::rename(dir / "staged", detail::tmp_dir(dir.path, "keep"));
    const auto done = clean_leftovers(dir.path);
    REQUIRE(done.size() == 1);
    CHECK_THAT(done[0], ContainsSubstring("installed"));
    CHECK(entries(dir.path) == std::vector<std::string>{"keep", "latest"});
    CHECK(first_value(dir.path, "keep", params) == value(0, 0, 0) + 100.0f);
  }
  SECTION("between the two renames of a replacement: the sealed new copy wins, .old goes") {
    sliced(params, 2, 100.0f).run(dir.path, "staged");
    fs::rename(dir / "keep", detail::old_dir(dir.path, "keep"));
    fs::rename(dir / "staged", detail::tmp_dir(dir.path, "keep"));
    CHECK(clean_leftovers(dir.path).size() == 2);
    CHECK(entries(dir.path) == std::vector<std::string>{"keep", "latest"});
    CHECK(first_value(dir.path, "keep", params) == value(0, 0, 0) + 100.0f);
  }
  SECTION("between the two renames, the new copy unsealed: the previous one is put back") {
    fs::rename(dir / "keep", detail::old_dir(dir.path, "keep"));
    fs::create_directories(detail::tmp_dir(dir.path, "keep"));
    const auto done = clean_leftovers(dir.path);
    REQUIRE(done.size() == 2);
    CHECK_THAT(done[1], ContainsSubstring("put") && ContainsSubstring("back"));
    CHECK(entries(dir.path) == std::vector<std::string>{"keep", "latest"});
    CHECK(first_value(dir.path, "keep", params) == value(0, 0, 0));
  }
  SECTION("temporary files of latest and probes go; other names stay") {
    write_bytes(dir / "latest.tmp.123.0", {'k'});
    write_bytes(dir / ".zero-probe.host.1.0", {});
    fs::create_directories(dir / ".git");       // a dot-name that is no tag's
    fs::create_directories(dir / ".x y.tmp");   // not a valid tag: not ours
    fs::create_directories(dir / "notes");      // no marker: not a checkpoint, not ours
    CHECK(clean_leftovers(dir.path).size() == 2);
    CHECK(entries(dir.path) ==
          std::vector<std::string>{".git", ".x y.tmp", "keep", "latest", "notes"});
  }
  CHECK(latest(dir.path) == "keep");
}
