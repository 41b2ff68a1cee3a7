// CRC-32C against published check values and a bit-at-a-time reference; FNV-1a's known values.
#include "runtime/checkpoint/crc32c.hpp"

#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <string>
#include <vector>

using namespace zero::checkpoint;

namespace {

// The definition, one bit at a time: reflected polynomial 0x82F63B78, init and final xor ~0.
uint32_t reference(const unsigned char* p, size_t n) {
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

}  // namespace

TEST_CASE("crc32c: the check value and the RFC 3720 (iSCSI) test vectors") {
  CHECK(crc32c(std::string_view("123456789")) == 0xE3069283u);
  CHECK(crc32c(nullptr, 0) == 0u);
  std::vector<unsigned char> b(32, 0x00);
  CHECK(crc32c(b.data(), b.size()) == 0x8A9136AAu);
  b.assign(32, 0xff);
  CHECK(crc32c(b.data(), b.size()) == 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) b[static_cast<size_t>(i)] = static_cast<unsigned char>(i);
  CHECK(crc32c(b.data(), b.size()) == 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) b[static_cast<size_t>(i)] = static_cast<unsigned char>(31 - i);
  CHECK(crc32c(b.data(), b.size()) == 0x113FDB5Cu);
}

TEST_CASE(
    "crc32c: slicing-by-8 equals the bitwise definition at every length and alignment; "
    "extend chains") {
  std::vector<unsigned char> buf(300);
  uint32_t s = 12345;
  for (unsigned char& c : buf) c = static_cast<unsigned char>((s = s * 1103515245u + 12345u) >> 16);
  for (size_t start = 0; start < 9; ++start)
    for (size_t n = 0; n + start <= buf.size(); n += 7) {
      const uint32_t want = reference(buf.data() + start, n);
      REQUIRE(crc32c(buf.data() + start, n) == want);
      const size_t cut = n / 3;
      REQUIRE(crc32c_extend(crc32c(buf.data() + start, cut), buf.data() + start + cut, n - cut) ==
              want);
    }
}

TEST_CASE("hash64: FNV-1a 64 known values") {
  const auto h = [](std::string_view s) {
    return hash64(kHash64Seed, {reinterpret_cast<const unsigned char*>(s.data()), s.size()});
  };
  CHECK(h("") == 0xcbf29ce484222325ull);
  CHECK(h("a") == 0xaf63dc4c8601ec8cull);
  CHECK(h("foobar") == 0x85944171f73967e8ull);
}
