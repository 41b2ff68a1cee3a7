// manifest.json: what is written parses back to the same manifest; each structural defect is
// reported with the JSON path of the field and the file's name.
#include "runtime/checkpoint/manifest.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

using namespace zero::checkpoint;
using namespace zero::checkpoint::detail;
using Catch::Matchers::ContainsSubstring;

namespace {

Manifest sample() {
  Manifest m;
  m.tag = "step9";
  m.save_id = 0xfedcba9876543210ull;  // above 2^63: must survive JSON
  m.world_size = 2;
  m.params = {{"w", {3, 4}}, {"s", {}}, {"e", {0}}};
  m.arrays = {"master", "exp_avg"};
  m.files = {{0, "rank_00000.bin", 1000, 7, {{0, 0, 7}}},
             {1, "rank_00001.bin", 1100, 6, {{0, 7, 5}, {1, 0, 1}}}};
  m.metadata = R"({"step":9,"note":"ünïcode"})";
  return m;
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("manifest: round trip, 64-bit save id as hex, metadata kept compact and in order") {
  const Manifest m = sample();
  const std::string text = manifest_to_json(m);
  CHECK_THAT(text, ContainsSubstring("\"save_id\": \"fedcba9876543210\""));
  CHECK_THAT(text, ContainsSubstring("\"magic\": \"zero-checkpoint\""));
  const Manifest b = parse_manifest(text, "m.json");
  CHECK(b.version == 1);  // no strided piece: the original format
  CHECK(b.tag == m.tag);
  CHECK(b.save_id == m.save_id);
  CHECK(b.world_size == 2);
  CHECK(b.params == m.params);
  CHECK(b.arrays == m.arrays);
  REQUIRE(b.files.size() == 2);
  CHECK(b.files[1].pieces == m.files[1].pieces);
  CHECK(b.files[1].bytes == 1100);
  CHECK(b.files[1].numel == 6);
  CHECK(b.metadata == m.metadata);
}

TEST_CASE("manifest: structural defects name the file and the field") {
  const std::string text = manifest_to_json(sample());
  const auto fails = [](const std::string& t, const std::string& what) {
    CHECK_THROWS_WITH(
        parse_manifest(t, "dir/m.json"),
        ContainsSubstring("checkpoint manifest 'dir/m.json'") && ContainsSubstring(what));
  };
  fails("{", "not valid JSON");
  fails("[1]", "not a JSON object");
  fails(replaced(text, "\"tag\"", "\"tags\""), "has no field 'tag'");
  fails(replaced(text, "\"world_size\": 2", "\"world_size\": 3"),
        "lists 2 rank files for world size 3");
  fails(replaced(text, "\"world_size\": 2", "\"world_size\": \"2\""),
        "'world_size' is not an integer");
  fails(replaced(text, "\"save_id\": \"fedcba9876543210\"", "\"save_id\": \"xyz\""),
        "'save_id' is not 16 lower-case hex");
  fails(replaced(text, "\"rank_00001.bin\"", "\"../x.bin\""),
        "files[1].file is not a plain file name");
  fails(replaced(text, "\"rank\": 1", "\"rank\": 0"), "files[1].rank is not 1");
  fails(replaced(text, "\"numel\": 6", "\"numel\": 5"),
        "files[1] has pieces of 6 elements but numel 5");
  fails(replaced(text, "\"version\": 1", "\"version\": 0"), "'version' is 0, outside [1, ");
  fails(replaced(text, "\"version\": 1", "\"version\": 3"),
        "format version 3, newer than this build reads (2)");
  // A piece past its parameter's end, and one naming no parameter.
  fails(replaced(text, "     7,\n     5\n", "     7,\n     6\n"),
        "files[1].pieces[0][2] is 6, outside [1, 5]");
  fails(replaced(text, "     1,\n     0,\n     1\n", "     3,\n     0,\n     1\n"),
        "files[1].pieces[1][0] is 3, outside [0, 2]");
  fails(replaced(text, "\"shape\": [\n    3,", "\"shape\": [\n    -3,"),
        "params[0].shape[0] is -3");
}

TEST_CASE("manifest: json_error accepts any JSON value and explains the rest") {
  CHECK(json_error("{}").empty());
  CHECK(json_error(" [1, 2] ").empty());
  CHECK(json_error("\"text\"").empty());
  CHECK_FALSE(json_error("").empty());
  CHECK_FALSE(json_error("{'a': 1}").empty());
  CHECK_FALSE(json_error("{} {}").empty());
}

TEST_CASE("manifest: strided pieces are written as five integers under version 2") {
  Manifest m = sample();
  // w [3, 4]: columns [1, 3) of every row as one strided piece, the rest as plain ones.
  m.version = 2;
  m.files[0].pieces = {{0, 1, 2, 3, 4}, {0, 0, 1}};
  m.files[0].numel = 7;
  m.files[1].pieces = {{0, 3, 2, 2, 4}, {0, 11, 1}, {1, 0, 1}};
  m.files[1].numel = 6;
  const std::string text = manifest_to_json(m);
  CHECK_THAT(text, ContainsSubstring("\"version\": 2"));
  const Manifest b = parse_manifest(text, "m.json");
  CHECK(b.version == 2);
  CHECK(b.files[0].pieces == m.files[0].pieces);
  CHECK(b.files[1].pieces == m.files[1].pieces);
  CHECK(b.files[0].pieces[1].stride == 0);

  const auto fails = [](const std::string& t, const std::string& what) {
    CHECK_THROWS_WITH(
        parse_manifest(t, "dir/m.json"),
        ContainsSubstring("checkpoint manifest 'dir/m.json'") && ContainsSubstring(what));
  };
  // A version 1 manifest has no strided pieces: a reader of version 1 would misread them.
  fails(replaced(text, "\"version\": 2", "\"version\": 1"),
        "files[0].pieces[0] is not [param, offset, count]");
  // stride < count: runs overlap.
  fails(replaced(text, "     3,\n     4\n", "     3,\n     1\n"),
        "files[0].pieces[0][4] is 1, outside [2, 12]");
  // The last run [1 + 3 * 4, + 2) leaves w's 12 elements.
  fails(replaced(text, "     3,\n     4\n", "     4,\n     4\n"),
        "files[0].pieces[0] is invalid: piece 0 {param 0, offset 1, count 2, repeat 4, stride "
        "4}: its last run starts at 13, outside parameter 'w' of 12 elements");
  // repeat 1 is written as a plain piece, so a five-integer piece has repeat >= 2.
  fails(replaced(text, "     3,\n     4\n", "     1,\n     4\n"),
        "files[0].pieces[0][3] is 1, outside [2, 12]");

  // A strided piece under version 1 is a bug of the writer, not a file to write.
  m.version = 1;
  CHECK_THROWS_WITH(manifest_to_json(m), ContainsSubstring("must be version 2"));
}
