// Every way a checkpoint can be damaged or mismatched gives an error that names the file (and,
// where there is one, the parameter or array) and says what to do; damage outside the bytes a
// load needs does not stop it. Byte offsets are docs/checkpoint-format.md's rank-file layout.
#include "runtime/checkpoint/checkpoint.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstring>
#include <filesystem>

#include "runtime/checkpoint/crc32c.hpp"
#include "runtime/checkpoint/layout.hpp"
#include "tests/checkpoint/helpers.hpp"

using namespace zero::checkpoint;
using namespace zero::checkpoint::test;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

// A checkpoint "t" of model_params() saved by 2 ranks (blocks of 5 elements).
struct Saved {
  TempDir dir;
  std::vector<ParamInfo> params = model_params();
  std::string rank1 = dir / "t/rank_00001.bin";
  std::string manifest = dir / "t/manifest.json";
  Saved() {
    FakeSave s;
    s.params = params;
    s.world = 2;
    s.pieces = [p = params](int r) { return slicing(p, 2, r); };
    s.run(dir.path, "t");
  }
  Loaded load_all(const std::vector<ParamInfo>& model) const {
    return load_pieces(dir.path, "t", model, slicing(model, 1, 0));
  }
  Loaded load_all() const { return load_all(params); }
  // Edits the manifest and re-seals it in the marker, as a tool that rewrote it would.
  void rewrite_manifest(const std::string& from, const std::string& to) const {
    const std::vector<char> b = read_bytes(manifest);
    std::string text(b.begin(), b.end());
    const size_t at = text.find(from);
    REQUIRE(at != std::string::npos);
    text.replace(at, from.size(), to);
    write_bytes(manifest, {text.begin(), text.end()});
    const std::string marker = detail::marker_text({crc32c(text), 1});
    write_bytes(dir / "t/COMPLETE", {marker.begin(), marker.end()});
  }
};

void flip(const std::string& path, size_t offset) {
  std::vector<char> b = read_bytes(path);
  REQUIRE(offset < b.size());
  b[offset] = static_cast<char>(b[offset] ^ 0x10);
  write_bytes(path, b);
}

uint64_t data_offset(const std::string& path) {
  const std::vector<char> b = read_bytes(path);
  uint64_t v;
  std::memcpy(&v, b.data() + 72, 8);
  return v;
}

}  // namespace

TEST_CASE("corruption: damaged rank files are named, with what is wrong") {
  Saved s;
  REQUIRE(s.load_all().values[0] == values_for(slicing(s.params, 1, 0), 0));  // intact first

  SECTION("truncated") {
    std::vector<char> b = read_bytes(s.rank1);
    b.resize(b.size() - 10);
    write_bytes(s.rank1, b);
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring("rank_00001.bin") &&
                                        ContainsSubstring("truncated") &&
                                        ContainsSubstring("HINT"));
  }
  SECTION("shorter than the header") {
    std::vector<char> b = read_bytes(s.rank1);
    b.resize(50);
    write_bytes(s.rank1, b);
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring("rank_00001.bin") &&
                                        ContainsSubstring("truncated: 50 bytes, shorter than the "
                                                          "128-byte header"));
  }
  SECTION("a flipped data byte is a checksum error; blocks not read do not matter") {
    // Element 7 of rank 1's first array: block 1 of 'master' (blocks of 5 elements).
    flip(s.rank1, data_offset(s.rank1) + 7 * 4 + 1);
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring("rank_00001.bin") &&
                                        ContainsSubstring("checksum mismatch in array 'master', "
                                                          "block 1 (elements [5, 10))"));
    // Rank 1's file starts at wte element 362 (725 elements / 2): wte[362, 367) is its block 0.
    const std::vector<Piece> block0{{0, 362, 5}}, block1{{0, 367, 1}};
    CHECK(load_pieces(s.dir.path, "t", s.params, block0).values[0] == values_for(block0, 0));
    CHECK_THROWS_WITH(load_pieces(s.dir.path, "t", s.params, block1),
                      ContainsSubstring("checksum mismatch"));
    // The other arrays are intact.
    const auto all = slicing(s.params, 1, 0);
    CHECK(load_pieces(s.dir.path, "t", s.params, all, {"exp_avg"}).values[0] == values_for(all, 1));
  }
  SECTION("a flipped table byte") {
    flip(s.rank1, 130);
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring("rank_00001.bin") &&
                                        ContainsSubstring("table checksum mismatch"));
  }
  SECTION("a flipped header byte") {
    flip(s.rank1, 16);  // the rank field
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring("rank_00001.bin") &&
                                        ContainsSubstring("header checksum mismatch"));
  }
  SECTION("wrong magic") {
    flip(s.rank1, 0);
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring("rank_00001.bin") &&
                                        ContainsSubstring("does not start with the magic"));
  }
  SECTION("a newer format version") {
    std::vector<char> b = read_bytes(s.rank1);
    b[8] = 3;
    write_bytes(s.rank1, b);
    CHECK_THROWS_WITH(s.load_all(),
                      ContainsSubstring("rank_00001.bin") &&
                          ContainsSubstring("format version 3, newer than this build reads (2)") &&
                          ContainsSubstring("HINT: load it with the newer zero build"));
  }
  SECTION("a missing rank file") {
    fs::remove(s.rank1);
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring("cannot open checkpoint rank file") &&
                                        ContainsSubstring("rank_00001.bin") &&
                                        ContainsSubstring("manifest lists it (rank 1)"));
    // A rank that needs only rank 0's file still loads.
    const std::vector<Piece> first{{0, 0, 100}};
    CHECK(load_pieces(s.dir.path, "t", s.params, first).values[2] == values_for(first, 2));
  }
  SECTION("a rank file of another save") {
    FakeSave other;
    other.params = s.params;
    other.world = 2;
    other.pieces = [p = s.params](int r) { return slicing(p, 2, r); };
    other.save_id = 77;
    other.run(s.dir.path, "other");
    fs::copy_file(s.dir / "other/rank_00001.bin", s.rank1, fs::copy_options::overwrite_existing);
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring("rank_00001.bin") &&
                                        ContainsSubstring("does not match the manifest: its save "
                                                          "id differs"));
  }
}

TEST_CASE("corruption: damaged markers and manifests are named") {
  Saved s;
  SECTION("no marker") {
    fs::remove(s.dir / "t/COMPLETE");
    CHECK_THROWS_WITH(s.load_all(),
                      ContainsSubstring(s.dir / "t") &&
                          ContainsSubstring("is incomplete: it has no COMPLETE marker"));
  }
  SECTION("a malformed marker") {
    write_bytes(s.dir / "t/COMPLETE", {'x'});
    CHECK_THROWS_WITH(s.load_all(),
                      ContainsSubstring("t/COMPLETE") && ContainsSubstring("malformed"));
  }
  SECTION("a manifest changed after the save") {
    flip(s.manifest, 40);
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring(s.manifest) &&
                                        ContainsSubstring("does not match the checksum"));
  }
  SECTION("a missing manifest") {
    fs::remove(s.manifest);
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring("cannot open checkpoint manifest") &&
                                        ContainsSubstring(s.manifest));
  }
  SECTION("a newer manifest version") {
    s.rewrite_manifest("\"version\": 1", "\"version\": 3");
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring(s.manifest) &&
                                        ContainsSubstring("format version 3, newer than this "
                                                          "build reads (2)"));
  }
  SECTION("wrong manifest magic") {
    s.rewrite_manifest("\"zero-checkpoint\"", "\"zero-chekpoint\"");
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring(s.manifest) &&
                                        ContainsSubstring("not a zero checkpoint manifest"));
  }
  SECTION("a manifest without a field") {
    s.rewrite_manifest("\"world_size\"", "\"world_sizes\"");
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring(s.manifest) &&
                                        ContainsSubstring("has no field 'world_size'"));
  }
  SECTION("a manifest whose pieces leave a gap") {
    // Rank 0's first piece (wte, offset 0) claims to start at 1.
    s.rewrite_manifest("[\n     0,\n     0,\n     362", "[\n     0,\n     1,\n     361");
    s.rewrite_manifest("\"numel\": 362", "\"numel\": 361");
    CHECK_THROWS_WITH(s.load_all(), ContainsSubstring(s.manifest) &&
                                        ContainsSubstring("is inconsistent: parameter 'wte' (444 "
                                                          "elements): elements [0, 1) are saved by "
                                                          "no rank"));
  }
}

TEST_CASE("corruption: a model that does not match the checkpoint is told what differs") {
  Saved s;
  const std::string hint = "HINT: pass the model the checkpoint was trained with";
  SECTION("a renamed parameter") {
    auto model = s.params;
    model[0].name = "tok";
    CHECK_THROWS_WITH(s.load_all(model),
                      ContainsSubstring(s.manifest) &&
                          ContainsSubstring("parameter 0 is 'wte' in the checkpoint and 'tok' in "
                                            "the model") &&
                          ContainsSubstring(hint));
  }
  SECTION("another width") {
    CHECK_THROWS_WITH(s.load_all(model_params(3, 8)),
                      ContainsSubstring(s.manifest) &&
                          ContainsSubstring("parameter 'h.0.w' has shape [12, 7] in the "
                                            "checkpoint and [12, 8] in the model") &&
                          ContainsSubstring(hint));
  }
  SECTION("another depth") {
    CHECK_THROWS_WITH(s.load_all(model_params(6)),
                      ContainsSubstring(s.manifest) &&
                          ContainsSubstring("the checkpoint has 3 layers ('h.<i>.' parameters), "
                                            "the model 6") &&
                          ContainsSubstring(hint));
  }
  SECTION("an extra parameter") {
    auto model = s.params;
    model.push_back({"extra", {2}});
    CHECK_THROWS_WITH(s.load_all(model),
                      ContainsSubstring("the checkpoint has 12 parameters, the model 13; the first "
                                        "extra one is 'extra' (model)"));
  }
  SECTION("an array that was not saved") {
    CHECK_THROWS_WITH(load_pieces(s.dir.path, "t", s.params, {}, {"master", "momentum"}),
                      ContainsSubstring(s.dir / "t") &&
                          ContainsSubstring("has no array 'momentum'; it holds 'master', "
                                            "'exp_avg', 'exp_avg_sq'"));
  }
  SECTION("a wanted piece outside its parameter") {
    CHECK_THROWS_WITH(load_pieces(s.dir.path, "t", s.params, {{11, 3, 3}}),
                      ContainsSubstring("lies outside parameter 'head.b' of 5 elements"));
  }
}
