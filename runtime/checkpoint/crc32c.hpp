// Checksums of the checkpoint formats (docs/checkpoint-format.md).
//
//   crc32c(data)      CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and
//                     final xor 0xFFFFFFFF), the checksum of iSCSI, ext4 and LevelDB. Check value:
//                     crc32c("123456789") = 0xE3069283. Software slicing-by-8 (~2-3 GB/s on one
//                     core), so no CPU feature is needed to read a file another machine wrote.
//   crc32c_extend     continues a running CRC: crc32c_extend(crc32c(a), b) == crc32c(a ++ b).
//   hash64(data)      FNV-1a, 64 bits: identifies a parameter table, never guards data.
//
// Thread-safety: pure functions (the slicing tables are constants built at compile time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace zero::checkpoint {

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t bytes) noexcept;

inline uint32_t crc32c(const void* data, size_t bytes) noexcept {
  return crc32c_extend(0, data, bytes);
}
inline uint32_t crc32c(std::string_view s) noexcept { return crc32c(s.data(), s.size()); }

// FNV-1a over bytes, continuing from `h` (start with kHash64Seed).
inline constexpr uint64_t kHash64Seed = 0xcbf29ce484222325ull;
constexpr uint64_t hash64(uint64_t h, std::span<const unsigned char> bytes) noexcept {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace zero::checkpoint
