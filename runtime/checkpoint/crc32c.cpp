#include "runtime/checkpoint/crc32c.hpp"

#include <array>
#include <bit>
#include <cstring>

namespace zero::checkpoint {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the checkpoint code reads little-endian words straight from memory");

constexpr uint32_t kPoly = 0x82F63B78u;  // CRC-32C, reflected

// Table k maps a byte that is followed by k more bytes of the 8-byte word to its contribution.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
    t[0][i] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (size_t i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xffu];
  return t;
}

constexpr Tables kTables = make_tables();

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t bytes) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  // Slicing-by-8: eight table look-ups per 8 bytes instead of eight dependent shifts.
  while (bytes >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = kTables[7][w & 0xff] ^ kTables[6][(w >> 8) & 0xff] ^ kTables[5][(w >> 16) & 0xff] ^
        kTables[4][(w >> 24) & 0xff] ^ kTables[3][(w >> 32) & 0xff] ^ kTables[2][(w >> 40) & 0xff] ^
        kTables[1][(w >> 48) & 0xff] ^ kTables[0][w >> 56];
    p += 8;
    bytes -= 8;
  }
  while (bytes-- > 0) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xffu];
  return ~c;
}

}  // namespace zero::checkpoint
