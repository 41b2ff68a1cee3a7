// Saving and loading through the building blocks of save() (begin_save, write_rank_file,
// commit_save) from one process: round trips, re-slicing to other world sizes and to pieces that
// straddle the saved ones, stage-0-style saves, latest(), overwriting a tag, and what crashes at
// each step of the protocol leave behind. Corrupt files are corruption_test.cpp's.
//
// Values are exact small integers plus 0.5 (helpers.hpp): every comparison is exact, and an
// element that was never written stays NaN and fails.
#include "runtime/checkpoint/checkpoint.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <filesystem>

#include "runtime/checkpoint/layout.hpp"
#include "tests/checkpoint/helpers.hpp"

using namespace zero::checkpoint;
using namespace zero::checkpoint::test;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

// Loads `pieces` of every array and checks each value against the save's (with `shift`).
void check_pieces(const std::string& dir, const std::string& tag,
                  const std::vector<ParamInfo>& params, const std::vector<Piece>& pieces,
                  float shift = 0.0f) {
  const Loaded l = load_pieces(dir, tag, params, pieces);
  for (size_t a = 0; a < array_names().size(); ++a)
    REQUIRE(l.values[a] == values_for(pieces, static_cast<int>(a), shift));
}

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

}  // namespace

TEST_CASE("checkpoint: round trip at one rank; metadata, arrays and world size come back") {
  TempDir dir;
  const auto params = model_params();
  FakeSave s = sliced(params, 1);
  s.metadata = R"({ "step": 7,  "stage": 2, "scaler": {"scale": 65536.0} })";
  s.block_elems = kDefaultBlockElems;
  s.run(dir.path, "step7");

  CHECK(entries(dir.path) == std::vector<std::string>{"latest", "step7"});
  CHECK(entries(dir / "step7") ==
        std::vector<std::string>{"COMPLETE", "manifest.json", "rank_00000.bin"});
  const std::vector<Piece> all = slicing(params, 1, 0);
  const Loaded l = load_pieces(dir.path, "step7", params, all);
  for (size_t a = 0; a < 3; ++a) CHECK(l.values[a] == values_for(all, static_cast<int>(a)));
  // Compact, keys in the saved order.
  CHECK(l.result.metadata == R"({"step":7,"stage":2,"scaler":{"scale":65536.0}})");
  CHECK(l.result.saved_world_size == 1);

  const Info info = read_info(dir.path, "step7");
  CHECK(info.world_size == 1);
  CHECK(info.params == params);
  CHECK(info.arrays == array_names());
  CHECK(info.save_id == s.save_id);
  CHECK(info.metadata == l.result.metadata);
  CHECK(latest(dir.path) == "step7");

  // The pieces in another order, and only some arrays, in another order.
  std::vector<Piece> reversed(all.rbegin(), all.rend());
  const Loaded r = load_pieces(dir.path, "step7", params, reversed, {"exp_avg_sq", "master"});
  CHECK(r.values[0] == values_for(reversed, 2));
  CHECK(r.values[1] == values_for(reversed, 0));
  // No pieces at all (a rank with nothing to load) is a valid load.
  CHECK(load_pieces(dir.path, "step7", params, {}).result.saved_world_size == 1);
}

TEST_CASE("checkpoint: saved by 4 ranks, loaded with the slicings of 1, 2, 3 and 4 ranks") {
  TempDir dir;
  const auto params = model_params();
  sliced(params, 4).run(dir.path, "t");
  for (int world : {1, 2, 3, 4, 5})
    for (int r = 0; r < world; ++r) {
      INFO("world " << world << " rank " << r);
      const Loaded l = load_pieces(dir.path, "t", params, slicing(params, world, r));
      CHECK(l.result.saved_world_size == 4);
      for (size_t a = 0; a < 3; ++a)
        REQUIRE(l.values[a] == values_for(slicing(params, world, r), static_cast<int>(a)));
    }
}

TEST_CASE("checkpoint: wanted pieces straddle saved pieces and checksum blocks") {
  TempDir dir;
  const auto params = model_params();
  // Saved as 4 ranks of many small pieces dealt round-robin (chunk 9), blocks of 5 elements.
  FakeSave s;
  s.params = params;
  s.world = 4;
  s.pieces = [&](int r) { return dealt(params, 4, r, 9); };
  s.run(dir.path, "t");
  // Wanted: chunks of 4 and 13 elements (never aligned with 9 or 5), the contiguous slicing of 3
  // ranks, single elements, whole parameters; every element of the model is read at least once.
  for (int world : {1, 2, 3}) {
    for (int r = 0; r < world; ++r) {
      check_pieces(dir.path, "t", params, dealt(params, world, r, 4));
      check_pieces(dir.path, "t", params, dealt(params, world, r, 13));
      check_pieces(dir.path, "t", params, slicing(params, world, r));
    }
  }
  check_pieces(dir.path, "t", params, {{0, 443, 1}, {0, 0, 1}, {1, 83, 1}, {3, 0, 1}});
  check_pieces(dir.path, "t", params, {{0, 0, 444}, {11, 0, 5}, {1, 10, 74}});
  // The same element twice in one request is read twice.
  check_pieces(dir.path, "t", params, {{0, 5, 20}, {0, 10, 20}});
}

TEST_CASE("checkpoint: a stage-0-style save (rank 0 owns all) reloads sliced, and back") {
  TempDir dir;
  const auto params = model_params();
  FakeSave s;
  s.params = params;
  s.world = 4;
  s.pieces = [&](int r) { return r == 0 ? slicing(params, 1, 0) : std::vector<Piece>{}; };
  s.run(dir.path, "s0");
  for (int r = 0; r < 3; ++r) check_pieces(dir.path, "s0", params, slicing(params, 3, r));
  // No pieces: the 128-byte header and the array names (36 bytes), padded to 64: no data.
  CHECK(fs::file_size(dir / "s0/rank_00003.bin") == 192);
  // And a sliced save reloads as stage 0 on rank 0.
  sliced(params, 3).run(dir.path, "s3");
  check_pieces(dir.path, "s3", params, slicing(params, 1, 0));
}

TEST_CASE("checkpoint: commit refuses pieces that do not tile the model, and bad requests") {
  TempDir dir;
  const auto params = model_params();
  FakeSave s = sliced(params, 2);
  auto rs = s.ranks();
  // Rank 1 forgets its last piece: the elements nobody saved are named.
  std::string tmp = begin_save(dir.path, "t");
  write_rank_file(tmp, 0, 2, 1, rs[0].request);
  SaveRequest short1 = rs[1].request;
  short1.pieces = short1.pieces.first(short1.pieces.size() - 1);
  write_rank_file(tmp, 1, 2, 1, short1);
  CHECK_THROWS_WITH(commit_save(dir.path, "t", 2, 1, rs[0].request),
                    ContainsSubstring("parameter 'head.b' (5 elements): elements [0, 5) are saved "
                                      "by no rank") &&
                        ContainsSubstring("HINT: every element must belong to exactly one rank"));
  CHECK_FALSE(fs::exists(dir / "t"));
  CHECK_FALSE(latest(dir.path).has_value());
  // Both ranks claim everything.
  tmp = begin_save(dir.path, "t");
  write_rank_file(tmp, 0, 2, 1, sliced(params, 1).ranks()[0].request);
  write_rank_file(tmp, 1, 2, 1, sliced(params, 1).ranks()[0].request);
  CHECK_THROWS_WITH(commit_save(dir.path, "t", 2, 1, rs[0].request),
                    ContainsSubstring("are saved by rank 0 and by rank 1"));
  // A rank file of another save id, or a missing one (rank 0 cannot see it).
  tmp = begin_save(dir.path, "t");
  write_rank_file(tmp, 0, 2, 1, rs[0].request);
  write_rank_file(tmp, 1, 2, 2, rs[1].request);
  CHECK_THROWS_WITH(commit_save(dir.path, "t", 2, 1, rs[0].request),
                    ContainsSubstring("rank_00001.bin") && ContainsSubstring("another save") &&
                        ContainsSubstring("its temporary directory '" + tmp + "' was removed"));
  CHECK_FALSE(fs::exists(tmp));  // a failed commit leaves nothing behind
  tmp = begin_save(dir.path, "t");
  write_rank_file(tmp, 0, 2, 1, rs[0].request);
  CHECK_THROWS_WITH(commit_save(dir.path, "t", 2, 1, rs[0].request),
                    ContainsSubstring("rank 0 does not see it") &&
                        ContainsSubstring("filesystem every rank shares"));
  CHECK(entries(dir.path).empty());
  tmp = begin_save(dir.path, "t");
  // A rank whose temporary directory does not exist (a node-local dir on another host).
  CHECK_THROWS_WITH(write_rank_file(dir / "elsewhere", 1, 2, 1, rs[1].request),
                    ContainsSubstring("does not exist on the host of rank 1") &&
                        ContainsSubstring("filesystem every rank shares"));
  // Malformed requests.
  SaveRequest bad = rs[0].request;
  const std::vector<Piece> outside{{0, 440, 10}};
  bad.pieces = outside;
  CHECK_THROWS_WITH(write_rank_file(tmp, 0, 2, 1, bad),
                    ContainsSubstring("lies outside parameter 'wte' of 444 elements"));
  bad = rs[0].request;
  bad.metadata = "{step: 1}";
  CHECK_THROWS_WITH(commit_save(dir.path, "t", 2, 1, bad),
                    ContainsSubstring("metadata is not JSON"));
  for (const char* tag : {"", ".hidden", "a/b", "latest", "sp ace"})
    CHECK_THROWS_WITH(begin_save(dir.path, tag), ContainsSubstring("invalid checkpoint tag"));
}

TEST_CASE("checkpoint: latest names the newest complete checkpoint") {
  TempDir dir;
  const auto params = model_params(1);
  CHECK_FALSE(latest(dir / "missing").has_value());
  CHECK_FALSE(latest(dir.path).has_value());
  sliced(params, 2).run(dir.path, "a");
  CHECK(latest(dir.path) == "a");
  sliced(params, 2).run(dir.path, "b");
  CHECK(latest(dir.path) == "b");
  CHECK(find_newest(dir.path)->note.empty());  // latest agrees: nothing to say
  // latest names an older checkpoint (the save of b could not update it): the newest committed
  // wins, and the note says which and why.
  write_bytes(dir / "latest", {'a', '\n'});
  CHECK(latest(dir.path) == "b");
  CHECK_THAT(find_newest(dir.path)->note,
             ContainsSubstring("taking 'b', the newest complete checkpoint") &&
                 ContainsSubstring("names 'a', but 'b' was committed after it"));
  // latest names a deleted checkpoint, then there is no latest file: the newest committed wins.
  fs::remove_all(dir / "a");
  CHECK(latest(dir.path) == "b");
  CHECK_THAT(find_newest(dir.path)->note,
             ContainsSubstring("names 'a', which cannot be loaded: it does not exist"));
  fs::remove(dir / "latest");
  CHECK(latest(dir.path) == "b");
  CHECK_THAT(find_newest(dir.path)->note, ContainsSubstring("there is no latest file"));
  // An incomplete directory is never a candidate.
  fs::remove(dir / "b/COMPLETE");
  CHECK_FALSE(latest(dir.path).has_value());
  CHECK_THROWS_WITH(load_pieces(dir.path, "b", params, {}),
                    ContainsSubstring("is incomplete: it has no COMPLETE marker") &&
                        ContainsSubstring(dir / "b"));
  CHECK_THROWS_WITH(load_pieces(dir.path, "zzz", params, {}),
                    ContainsSubstring("no checkpoint 'zzz'") &&
                        ContainsSubstring("holds no complete checkpoint"));
}

TEST_CASE("checkpoint: find_newest skips a newer checkpoint whose manifest is damaged") {
  TempDir dir;
  const auto params = model_params(1);
  sliced(params, 2).run(dir.path, "a");
  sliced(params, 2).run(dir.path, "b");
  // b's manifest changed after its save: its marker's checksum no longer matches.
  std::vector<char> m = read_bytes(dir / "b/manifest.json");
  m[m.size() / 2] ^= 1;
  write_bytes(dir / "b/manifest.json", m);
  const std::optional<Newest> n = find_newest(dir.path);
  REQUIRE(n.has_value());
  CHECK(n->tag == "a");
  CHECK_THAT(n->note, ContainsSubstring("names 'b', which is damaged") &&
                          ContainsSubstring("does not match the checksum in its marker") &&
                          ContainsSubstring("newer 'b' is damaged"));
  check_pieces(dir.path, n->tag, params, slicing(params, 1, 0));
}

TEST_CASE("checkpoint: overwriting a tag replaces it whole, at another world size") {
  TempDir dir;
  const auto params = model_params();
  sliced(params, 4).run(dir.path, "t");
  check_pieces(dir.path, "t", params, slicing(params, 1, 0));
  FakeSave again = sliced(params, 2, /*shift=*/100.0f);
  again.save_id = 42;
  again.run(dir.path, "t");
  check_pieces(dir.path, "t", params, slicing(params, 3, 1), 100.0f);
  CHECK(read_info(dir.path, "t").world_size == 2);
  CHECK(read_info(dir.path, "t").save_id == 42);
  // Nothing of the old one or of the replacement is left: no rank_00002/3, no dot-directories.
  CHECK(entries(dir / "t") ==
        std::vector<std::string>{"COMPLETE", "manifest.json", "rank_00000.bin", "rank_00001.bin"});
  CHECK(entries(dir.path) == std::vector<std::string>{"latest", "t"});
  CHECK(latest(dir.path) == "t");
}

TEST_CASE("checkpoint: a crash mid-save leaves the previous checkpoint latest and loadable") {
  TempDir dir;
  const auto params = model_params();
  sliced(params, 2).run(dir.path, "old");
  FakeSave next = sliced(params, 2, 100.0f);
  const auto rs = next.ranks();

  SECTION("crash while the ranks write their files (a new tag)") {
    const std::string tmp = begin_save(dir.path, "new");
    write_rank_file(tmp, 0, 2, 9, rs[0].request);
    // Rank 1's file is half written when the job dies.
    write_rank_file(tmp, 1, 2, 9, rs[1].request);
    std::vector<char> bytes = read_bytes(tmp + "/rank_00001.bin");
    bytes.resize(bytes.size() / 2);
    write_bytes(tmp + "/rank_00001.bin", bytes);
    CHECK(latest(dir.path) == "old");
    check_pieces(dir.path, "old", params, slicing(params, 3, 2));
    CHECK_THROWS_WITH(load_pieces(dir.path, "new", params, {}),
                      ContainsSubstring("no checkpoint 'new'"));
    // The next save of that tag clears the leftovers.
    next.run(dir.path, "new");
    check_pieces(dir.path, "new", params, slicing(params, 1, 0), 100.0f);
    CHECK(entries(dir.path) == std::vector<std::string>{"latest", "new", "old"});
  }
  SECTION("crash after the manifest, before the marker, while overwriting the same tag") {
    const std::string tmp = begin_save(dir.path, "old");
    write_rank_file(tmp, 0, 2, 9, rs[0].request);
    write_rank_file(tmp, 1, 2, 9, rs[1].request);
    fs::copy_file(dir / "old/manifest.json", tmp + "/manifest.json");
    CHECK(latest(dir.path) == "old");
    check_pieces(dir.path, "old", params, slicing(params, 1, 0));  // the old values
    // Unsealed: the start-up tidying removes it and keeps the complete one.
    CHECK(clean_leftovers(dir.path).size() == 1);
    CHECK(entries(dir.path) == std::vector<std::string>{"latest", "old"});
    check_pieces(dir.path, "old", params, slicing(params, 1, 0));
  }
  SECTION("crash after the marker, before the rename") {
    next.run(dir.path, "staged");
    fs::rename(dir / "staged", detail::tmp_dir(dir.path, "new"));
    write_bytes(dir / "latest", {'o', 'l', 'd', '\n'});
    CHECK(latest(dir.path) == "old");  // a complete temporary directory is still never loaded
    CHECK_THROWS_WITH(load_pieces(dir.path, "new", params, {}),
                      ContainsSubstring("no checkpoint 'new'"));
    // The start-up tidying installs it: it is sealed, and the only copy of its tag.
    const std::vector<std::string> done = clean_leftovers(dir.path);
    REQUIRE(done.size() == 1);
    CHECK_THAT(done[0], ContainsSubstring("installed") && ContainsSubstring(".new.tmp"));
    CHECK(latest(dir.path) == "new");
    check_pieces(dir.path, "new", params, slicing(params, 1, 0), 100.0f);
    CHECK(entries(dir.path) == std::vector<std::string>{"latest", "new", "old"});
  }
  SECTION("crash after the rename, before latest was updated") {
    next.run(dir.path, "new");
    write_bytes(dir / "latest", {'o', 'l', 'd', '\n'});  // as it was before the rename
    // The newer complete checkpoint is not skipped because latest lags behind it.
    CHECK(latest(dir.path) == "new");
    CHECK_THAT(find_newest(dir.path)->note, ContainsSubstring("names 'old', but 'new'"));
    check_pieces(dir.path, "old", params, slicing(params, 1, 0));
    check_pieces(dir.path, "new", params, slicing(params, 1, 0), 100.0f);
  }
  SECTION("crash between the two renames of a replacement (filesystems that cannot swap)") {
    // The state: the old checkpoint moved aside to .old.old, the new one complete in .old.tmp.
    next.run(dir.path, "staged");
    fs::rename(dir / "old", detail::old_dir(dir.path, "old"));
    fs::rename(dir / "staged", detail::tmp_dir(dir.path, "old"));
    write_bytes(dir / "latest", {'o', 'l', 'd', '\n'});
    CHECK(latest(dir.path) == "old");
    check_pieces(dir.path, "old", params, slicing(params, 3, 0));  // the previous values
    // The next save of the tag first puts the previous checkpoint back, then replaces it.
    const std::string tmp = begin_save(dir.path, "old");
    CHECK(fs::exists(dir / "old/COMPLETE"));
    CHECK_FALSE(fs::exists(detail::old_dir(dir.path, "old")));
    write_rank_file(tmp, 0, 2, 9, rs[0].request);
    write_rank_file(tmp, 1, 2, 9, rs[1].request);
    commit_save(dir.path, "old", 2, 9, rs[0].request);
    check_pieces(dir.path, "old", params, slicing(params, 3, 0), 100.0f);
    CHECK(entries(dir.path) == std::vector<std::string>{"latest", "old"});
  }
}
