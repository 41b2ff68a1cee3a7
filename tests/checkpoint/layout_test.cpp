// The directory layout: tag rules, dot-names of temporary and replaced directories, the marker's
// text, and which directory a tag resolves to after an interrupted replacement.
#include "runtime/checkpoint/layout.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>

#include "runtime/checkpoint/checkpoint.hpp"
#include "tests/checkpoint/helpers.hpp"

using namespace zero::checkpoint;
using namespace zero::checkpoint::detail;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

TEST_CASE("layout: tags are plain names; temporary names are hidden dot-names beside them") {
  for (const char* ok : {"a", "global_step100", "v1.2-rc+3=x", "A_b.c"})
    CHECK_NOTHROW(check_tag(ok));
  for (const std::string& bad : std::vector<std::string>{
           "", ".x", "..", "a/b", "latest", "with space", "x\n", std::string(201, 'a')})
    CHECK_THROWS_WITH(check_tag(bad),
                      ContainsSubstring("invalid checkpoint tag") && ContainsSubstring("HINT"));
  CHECK(join("d", "x") == "d/x");
  CHECK(join("d/", "x") == "d/x");
  CHECK(tmp_dir("d", "t") == "d/.t.tmp");
  CHECK(old_dir("d", "t") == "d/.t.old");
  CHECK(rank_file_name(3) == "rank_00003.bin");
  CHECK(rank_file_name(123456) == "rank_123456.bin");
}

TEST_CASE("layout: the marker round-trips; a malformed one is an error naming it") {
  zero::checkpoint::test::TempDir dir;
  CHECK_FALSE(read_marker(dir.path).has_value());
  const Marker m{0x00c0ffee, 1712345678901234567ull};
  const std::string text = marker_text(m);
  CHECK(text ==
        "zero-checkpoint complete\nmanifest_crc32c 00c0ffee\ncommitted_unix_ns "
        "1712345678901234567\n");
  zero::checkpoint::test::write_bytes(dir / "COMPLETE", {text.begin(), text.end()});
  const auto back = read_marker(dir.path);
  REQUIRE(back.has_value());
  CHECK(back->manifest_crc == m.manifest_crc);
  CHECK(back->committed_ns == m.committed_ns);
  const std::string bad = "zero-checkpoint complete\nmanifest_crc32c C0FFEE\n";
  zero::checkpoint::test::write_bytes(dir / "COMPLETE", {bad.begin(), bad.end()});
  CHECK_THROWS_WITH(read_marker(dir.path),
                    ContainsSubstring(dir / "COMPLETE") && ContainsSubstring("malformed"));
}

TEST_CASE(
    "layout: resolve falls back to .<tag>.old only when <tag> is missing and it is complete") {
  zero::checkpoint::test::TempDir dir;
  CHECK(resolve(dir.path, "t") == dir / "t");
  fs::create_directory(dir / ".t.old");
  CHECK(resolve(dir.path, "t") == dir / "t");  // no marker: not a recovery candidate
  const std::string text = marker_text({1, 2});
  zero::checkpoint::test::write_bytes(dir / ".t.old/COMPLETE", {text.begin(), text.end()});
  CHECK(resolve(dir.path, "t") == dir / ".t.old");
  fs::create_directory(dir / "t");
  CHECK(resolve(dir.path, "t") == dir / "t");
}

TEST_CASE("layout: install replaces dir/<tag> by swapping names or by two renames") {
  for (bool swap : {true, false}) {
    INFO("swap " << swap);
    zero::checkpoint::test::TempDir dir;
    const auto put = [&](const std::string& d, const std::string& text) {
      fs::create_directories(dir / d);
      zero::checkpoint::test::write_bytes(dir / d + "/f", {text.begin(), text.end()});
    };
    const auto get = [&](const std::string& d) {
      const auto b = zero::checkpoint::test::read_bytes(dir / d + "/f");
      return std::string(b.begin(), b.end());
    };
    put(".t.tmp", "first");
    install(dir.path, "t", swap);  // nothing to replace: a plain rename
    CHECK(get("t") == "first");
    put(".t.tmp", "second");
    install(dir.path, "t", swap);
    CHECK(get("t") == "second");
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(dir.path))
      left.push_back(e.path().filename().string());
    CHECK(left == std::vector<std::string>{"t"});  // neither .t.tmp nor .t.old remains
  }
}
