// safetensors: the writer's bytes against the format as specified (a hand-built file), round
// trips of odd shapes with bit-exact values, F16/BF16 widening, every malformed file, and (when
// python3 exists) an independent reader in a few lines of standard-library Python.
#include "runtime/checkpoint/safetensors.hpp"

#include <sys/wait.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>

#include "tests/checkpoint/helpers.hpp"

using namespace zero::checkpoint;
using namespace zero::checkpoint::test;
using Catch::Matchers::ContainsSubstring;

namespace {

// A file from its parts: u64 LE header length, the header text as given, the data bytes.
std::vector<char> file_bytes(const std::string& header, const std::vector<unsigned char>& data,
                             uint64_t length_override = 0) {
  const uint64_t n = length_override ? length_override : header.size();
  std::vector<char> b(8);
  std::memcpy(b.data(), &n, 8);
  b.insert(b.end(), header.begin(), header.end());
  b.insert(b.end(), data.begin(), data.end());
  return b;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("safetensors: a tiny tensor is written byte for byte as the format specifies") {
  TempDir dir;
  const float v[2] = {1.0f, -2.0f};
  const TensorRef t{"a", {2}, v};
  write_safetensors(dir / "a.safetensors", std::span(&t, 1));
  // 8-byte little-endian length (88), the compact JSON header (85 bytes) padded with 3 spaces to
  // a multiple of 8, then the data: 1.0f = 0x3f800000, -2.0f = 0xc0000000, little-endian.
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  REQUIRE(json.size() == 85);
  std::vector<char> want = {88, 0, 0, 0, 0, 0, 0, 0};
  want.insert(want.end(), json.begin(), json.end());
  want.insert(want.end(), {' ', ' ', ' '});
  for (int c : {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0})
    want.push_back(static_cast<char>(c));
  CHECK(read_bytes(dir / "a.safetensors") == want);
  // No temporary file is left beside it.
  CHECK(std::distance(std::filesystem::directory_iterator(dir.path), {}) == 1);
}

TEST_CASE("safetensors: round trip of odd shapes, scalars, empty tensors and special values") {
  TempDir dir;
  std::vector<float> w(3 * 5 * 7);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.37f - 11.0f;
  w[0] = -0.0f;
  w[1] = std::numeric_limits<float>::infinity();
  w[2] = std::numeric_limits<float>::denorm_min();
  uint32_t nan_bits = 0x7fa00001u;  // a signalling NaN with a payload: copied, never converted
  std::memcpy(&w[3], &nan_bits, 4);
  const std::vector<float> scalar{42.5f}, one{-1.0f};
  const std::vector<TensorRef> tensors{{"h.0.w", {3, 5, 7}, w.data()},
                                       {"scalar", {}, scalar.data()},
                                       {"empty", {0, 4}, nullptr},
                                       {"one", {1}, one.data()}};
  write_safetensors(dir / "m.safetensors", tensors, {{"step", "9"}});

  const SafetensorsFile f = read_safetensors(dir / "m.safetensors");
  CHECK(f.metadata ==
        std::vector<std::pair<std::string, std::string>>{{"format", "pt"}, {"step", "9"}});
  REQUIRE(f.tensors.size() == 4);
  // In data order: w [0, 420), scalar [420, 424), empty [424, 424), one [424, 428).
  std::vector<std::string> names;
  for (const NamedTensor& t : f.tensors) names.push_back(t.name);
  CHECK(names == std::vector<std::string>{"h.0.w", "scalar", "empty", "one"});
  CHECK(f.tensors[0].shape == std::vector<int64_t>{3, 5, 7});
  CHECK(f.tensors[0].dtype == "F32");
  CHECK(same_bits(f.tensors[0].data, w));
  for (const NamedTensor& t : f.tensors) {
    if (t.name == "scalar") CHECK((t.shape.empty() && same_bits(t.data, scalar)));
    if (t.name == "empty") CHECK((t.shape == std::vector<int64_t>{0, 4} && t.data.empty()));
    if (t.name == "one") CHECK(same_bits(t.data, one));
  }
  uint64_t n = 0;
  const std::vector<char> bytes = read_bytes(dir / "m.safetensors");
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);
  CHECK(bytes.size() == 8 + n + (105 + 1 + 0 + 1) * 4);

  // Overwriting is atomic and complete: the new contents replace the old.
  write_safetensors(dir / "m.safetensors", std::span(tensors).subspan(3));
  CHECK(read_safetensors(dir / "m.safetensors").tensors.size() == 1);
}

TEST_CASE("safetensors: F16 and BF16 tensors are widened exactly") {
  TempDir dir;
  const std::string header = R"({"h":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]}})";
  // F16 1.0, -2.0, 0.5, +inf; BF16 1.0, -3.0, the smallest subnormal (2^-133). Little-endian.
  const std::vector<unsigned char> data{0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38, 0x00,
                                        0x7c, 0x80, 0x3f, 0x40, 0xc0, 0x01, 0x00};
  write_bytes(dir / "x.safetensors", file_bytes(header, data));
  const SafetensorsFile f = read_safetensors(dir / "x.safetensors");
  REQUIRE(f.tensors.size() == 2);
  CHECK(f.metadata.empty());
  CHECK(f.tensors[0].name == "h");
  CHECK(f.tensors[0].dtype == "F16");
  CHECK(f.tensors[0].data ==
        std::vector<float>{1.0f, -2.0f, 0.5f, std::numeric_limits<float>::infinity()});
  CHECK(f.tensors[1].dtype == "BF16");
  CHECK(f.tensors[1].data == std::vector<float>{1.0f, -3.0f, std::ldexp(1.0f, -133)});
}

TEST_CASE("safetensors: every malformed file is an error naming the file (and the tensor)") {
  TempDir dir;
  const std::string path = dir / "bad.safetensors";
  const auto fails = [&](const std::vector<char>& bytes, const std::string& what) {
    write_bytes(path, bytes);
    CHECK_THROWS_WITH(
        read_safetensors(path),
        ContainsSubstring("safetensors file '" + path + "'") && ContainsSubstring(what));
  };
  const auto t = [](const std::string& name, const std::string& body) {
    return "\"" + name + "\":{" + body + "}";
  };
  const std::vector<unsigned char> d8(8, 0), d12(12, 0), d20(20, 0);
  const std::string a8 = t("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])");

  fails({1, 2, 3, 4, 5}, "truncated: 5 bytes");
  fails(file_bytes("{}", {}, 100), "truncated: the header length says 100 bytes");
  fails(file_bytes("{}", {}, 200'000'000), "exceeds the format's limit of 100000000 bytes");
  fails(file_bytes("[]", {}), "does not start with '{'");
  fails(file_bytes("{\"a\":", {}), "not valid JSON");
  fails(file_bytes("{" + a8 + "," + a8 + "}", d8), "repeats the key 'a'");
  fails(file_bytes(R"({"__metadata__":[]})", {}), "\"__metadata__\" is not an object");
  fails(file_bytes(R"({"__metadata__":{"k":1}})", {}), "value of 'k' is not a string");
  fails(file_bytes(R"({"a":1})", {}), "tensor 'a' is not a JSON object");
  fails(file_bytes("{" + t("a", R"("shape":[2],"data_offsets":[0,8])") + "}", d8),
        "tensor 'a' has no string \"dtype\"");
  fails(file_bytes("{" + t("a", R"("dtype":"F32","shape":"2","data_offsets":[0,8])") + "}", d8),
        "tensor 'a' has no array \"shape\"");
  fails(file_bytes("{" + t("a", R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])") + "}", d8),
        "tensor 'a' has an invalid shape [-2]");
  fails(file_bytes("{" + t("a", R"("dtype":"F32","shape":[2],"data_offsets":[0])") + "}", d8),
        "tensor 'a' has no \"data_offsets\" [begin, end]");
  fails(file_bytes("{" + t("a", R"("dtype":"F32","shape":[2],"data_offsets":[-1,7])") + "}", d8),
        "are not non-negative integers");
  fails(file_bytes("{" + t("a", R"("dtype":"F32","shape":[0],"data_offsets":[8,0])") + "}", d8),
        "tensor 'a' has \"data_offsets\" [8,0] whose begin is past its end");
  fails(file_bytes("{" + t("a", R"("dtype":"F32","shape":[3],"data_offsets":[0,8])") + "}", d8),
        "tensor 'a' has \"data_offsets\" [0,8] spanning 8 bytes, but shape [3] of F32 needs 12");
  fails(file_bytes("{" + a8 + "}", {0, 0, 0, 0}),
        "tensor 'a' has \"data_offsets\" [0,8] past the end of the 4-byte data buffer");
  fails(
      file_bytes(
          "{" + a8 + "," + t("b", R"("dtype":"F32","shape":[2],"data_offsets":[4,12])") + "}", d12),
      "tensor 'b' overlaps tensor 'a'");
  fails(file_bytes(
            "{" + a8 + "," + t("b", R"("dtype":"F32","shape":[2],"data_offsets":[12,20])") + "}",
            d20),
        "bytes [8, 12) of the data buffer belong to no tensor");
  fails(file_bytes("{" + a8 + "}", d12), "4 bytes after the last tensor belong to no tensor");
  // A well-formed tensor of a dtype we do not convert.
  write_bytes(
      path,
      file_bytes("{" + t("ids", R"("dtype":"I64","shape":[1],"data_offsets":[0,8])") + "}", d8));
  CHECK_THROWS_WITH(read_safetensors(path),
                    ContainsSubstring(path) &&
                        ContainsSubstring("tensor 'ids' has dtype \"I64\"; this reader converts "
                                          "only F32, F16 and BF16 to fp32"));
  CHECK_THROWS_WITH(read_safetensors(dir / "missing.safetensors"),
                    ContainsSubstring("cannot open safetensors file") &&
                        ContainsSubstring("missing.safetensors"));
}

TEST_CASE("safetensors: the writer refuses what it cannot write, naming the tensor") {
  TempDir dir;
  const float v[2] = {1, 2};
  const auto fails = [&](std::vector<TensorRef> ts, const std::string& what) {
    CHECK_THROWS_WITH(write_safetensors(dir / "w.safetensors", ts),
                      ContainsSubstring("w.safetensors") && ContainsSubstring(what));
  };
  fails({{"a", {2}, v}, {"a", {1}, v}}, "tensor 'a' appears twice");
  fails({{"__metadata__", {2}, v}}, "invalid tensor name '__metadata__'");
  fails({{"", {2}, v}}, "invalid tensor name ''");
  fails({{"a", {2, -1}, v}}, "tensor 'a' has an invalid shape [2, -1]");
  fails({{"a", {2}, nullptr}}, "tensor 'a' has no data");
  CHECK_FALSE(std::filesystem::exists(dir / "w.safetensors"));
}

TEST_CASE("safetensors: an independent reader (python3 json + struct) reads what we write") {
  if (std::system("python3 -c 'import json, struct' > /dev/null 2>&1") != 0)
    SKIP("python3 is not available");
  TempDir dir;
  const std::vector<float> a{-1.0f, -0.75f, -0.5f, 0.25f, 1.5f, 1024.0f},
      b{3.0f, 0.125f, -8.0f, 0.0f};
  const std::vector<TensorRef> ts{{"a", {2, 3}, a.data()}, {"b.bias", {4}, b.data()}};
  write_safetensors(dir / "p.safetensors", ts, {{"k", "v"}});
  const std::string script = R"(import json, struct, sys
data = open(sys.argv[1], 'rb').read()
(n,) = struct.unpack('<Q', data[:8])
assert n % 8 == 0, n
header = json.loads(data[8:8 + n])
assert header['__metadata__'] == {'format': 'pt', 'k': 'v'}, header['__metadata__']
buf = data[8 + n:]
want = {'a': ([2, 3], [-1.0, -0.75, -0.5, 0.25, 1.5, 1024.0]), 'b.bias': ([4], [3.0, 0.125, -8.0, 0.0])}
assert sorted(k for k in header if k != '__metadata__') == sorted(want)
for name, (shape, values) in want.items():
    t = header[name]
    assert t['dtype'] == 'F32' and t['shape'] == shape, t
    begin, end = t['data_offsets']
    got = list(struct.unpack('<%df' % len(values), buf[begin:end]))
    assert got == values, (name, got)
assert max(t['data_offsets'][1] for k, t in header.items() if k != '__metadata__') == len(buf)
print('python reader ok')
)";
  write_bytes(dir / "check.py", {script.begin(), script.end()});
  const std::string cmd = "python3 " + dir / "check.py" + " " + dir / "p.safetensors" + " > " +
                          dir / "out.txt" + " 2>&1";
  const int status = std::system(cmd.c_str());
  const std::vector<char> out = read_bytes(dir / "out.txt");
  INFO(std::string(out.begin(), out.end()));
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_THAT(std::string(out.begin(), out.end()), ContainsSubstring("python reader ok"));
}
