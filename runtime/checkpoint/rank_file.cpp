#include "runtime/checkpoint/rank_file.hpp"

#include <algorithm>
#include <bit>
#include <cstring>

#include "runtime/checkpoint/crc32c.hpp"
#include "runtime/checkpoint/pieces.hpp"
#include "core/error.hpp"

namespace zero::checkpoint::detail {

static_assert(std::endian::native == std::endian::little,
              "rank files are little-endian and written straight from memory");

namespace {

// Offsets of the fixed header's fields (docs/checkpoint-format.md, "Rank files").
enum Field : size_t {
  kMagic = 0,
  kVersion = 8,
  kHeaderBytes = 12,
  kRank = 16,
  kWorldSize = 20,
  kPieceCount = 24,
  kArrayCount = 28,
  kBlockElems = 32,
  kSaveId = 40,
  kParamHash = 48,
  kNumel = 56,
  kTableBytes = 64,
  kDataOffset = 72,
  kTableCrc = 80,
  kHeaderCrc = 124,
};

constexpr uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

void put32(std::vector<unsigned char>& b, size_t at, uint32_t v) { std::memcpy(&b[at], &v, 4); }
void put64(std::vector<unsigned char>& b, size_t at, uint64_t v) { std::memcpy(&b[at], &v, 8); }
void append32(std::vector<unsigned char>& b, uint32_t v) {
  b.resize(b.size() + 4);
  put32(b, b.size() - 4, v);
}
void append64(std::vector<unsigned char>& b, uint64_t v) {
  b.resize(b.size() + 8);
  put64(b, b.size() - 8, v);
}
uint32_t get32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t get64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint64_t piece_entry_bytes(uint32_t version) {
  return version >= 2 ? kPieceEntryBytesV2 : kPieceEntryBytesV1;
}

// Bytes of the table for these counts and names.
uint64_t table_bytes_for(uint64_t pieces, uint32_t version, uint64_t name_bytes, uint64_t arrays,
                         uint64_t blocks) {
  return pieces * piece_entry_bytes(version) + align_up(name_bytes, 4) + arrays * blocks * 4;
}

[[noreturn]] void corrupt(const io::File& f, const std::string& what) {
  ZERO_FAIL("checkpoint rank file " + io::quote(f.path()) + ": " + what +
            "\nHINT: the file is damaged or not from this checkpoint; restore it from a copy or "
            "load an earlier checkpoint");
}

}  // namespace

uint64_t param_table_hash(std::span<const ParamInfo> params) {
  uint64_t h = kHash64Seed;
  const auto mix = [&h](const void* p, size_t n) {
    h = hash64(h, {static_cast<const unsigned char*>(p), n});
  };
  const uint64_t count = params.size();
  mix(&count, 8);
  for (const ParamInfo& p : params) {
    const uint64_t len = p.name.size(), rank = p.shape.size();
    mix(&len, 8);
    mix(p.name.data(), p.name.size());
    mix(&rank, 8);
    for (int64_t d : p.shape) mix(&d, 8);
  }
  return h;
}

uint64_t rank_file_bytes(std::span<const Piece> pieces, std::span<const std::string> array_names,
                         uint32_t block_elems) {
  ZERO_REQUIRE(block_elems > 0, "checkpoint: block_elems must be > 0");
  const uint64_t numel = total_count(pieces);
  const uint64_t blocks = numel == 0 ? 0 : (numel - 1) / block_elems + 1;
  uint64_t name_bytes = 0;
  for (const std::string& n : array_names) name_bytes += 4 + n.size();
  const uint64_t table = table_bytes_for(pieces.size(), pieces_version(pieces), name_bytes,
                                         array_names.size(), blocks);
  return align_up(kRankHeaderBytes + table, kDataAlign) +
         array_names.size() * align_up(numel * sizeof(float), kDataAlign);
}

void write_rank_file_at(const std::string& path, int rank, int world_size, uint64_t save_id,
                        uint64_t param_hash, std::span<const Piece> pieces,
                        std::span<const ConstArray> arrays, uint32_t block_elems) {
  ZERO_REQUIRE(block_elems > 0, "checkpoint: block_elems must be > 0");
  const uint64_t numel = total_count(pieces);
  const uint64_t blocks = numel == 0 ? 0 : (numel - 1) / block_elems + 1;
  // Version 1 unless a piece is strided: a checkpoint without tensor-parallel slicing stays
  // readable by builds that predate strided pieces.
  const uint32_t version = pieces_version(pieces);

  // The block checksums come first: the table that holds them precedes the data.
  std::vector<unsigned char> table;
  for (const Piece& p : pieces) {
    append32(table, static_cast<uint32_t>(p.param));
    append32(table, 0);
    append64(table, static_cast<uint64_t>(p.offset));
    append64(table, static_cast<uint64_t>(p.count));
    if (version < 2) continue;
    append64(table, static_cast<uint64_t>(p.repeat));
    append64(table, p.strided() ? static_cast<uint64_t>(p.stride) : 0);
  }
  uint64_t name_bytes = 0;
  for (const ConstArray& a : arrays) {
    append32(table, static_cast<uint32_t>(a.name.size()));
    table.insert(table.end(), a.name.begin(), a.name.end());
    name_bytes += 4 + a.name.size();
  }
  table.resize(table.size() + (align_up(name_bytes, 4) - name_bytes), 0);
  for (const ConstArray& a : arrays)
    for (uint64_t b = 0; b < blocks; ++b) {
      const uint64_t first = b * block_elems;
      const uint64_t n = std::min<uint64_t>(block_elems, numel - first);
      append32(table, crc32c(a.data + first, n * sizeof(float)));
    }
  ZERO_REQUIRE(
      table.size() == table_bytes_for(pieces.size(), version, name_bytes, arrays.size(), blocks),
      "checkpoint: rank file table size mismatch");

  const uint64_t data_offset = align_up(kRankHeaderBytes + table.size(), kDataAlign);
  std::vector<unsigned char> head(kRankHeaderBytes, 0);
  std::memcpy(&head[kMagic], kRankMagic, 8);
  put32(head, kVersion, version);
  put32(head, kHeaderBytes, kRankHeaderBytes);
  put32(head, kRank, static_cast<uint32_t>(rank));
  put32(head, kWorldSize, static_cast<uint32_t>(world_size));
  put32(head, kPieceCount, static_cast<uint32_t>(pieces.size()));
  put32(head, kArrayCount, static_cast<uint32_t>(arrays.size()));
  put32(head, kBlockElems, block_elems);
  put64(head, kSaveId, save_id);
  put64(head, kParamHash, param_hash);
  put64(head, kNumel, numel);
  put64(head, kTableBytes, table.size());
  put64(head, kDataOffset, data_offset);
  put32(head, kTableCrc, crc32c(table.data(), table.size()));
  put32(head, kHeaderCrc, crc32c(head.data(), kHeaderCrc));
  head.insert(head.end(), table.begin(), table.end());
  head.resize(data_offset, 0);

  io::File f = io::File::create(path, "checkpoint rank file",
                                "the checkpoint directory must be writable by every rank");
  f.write_all(head.data(), head.size());
  static constexpr unsigned char kZeros[kDataAlign] = {};
  const uint64_t bytes = numel * sizeof(float);
  for (const ConstArray& a : arrays) {
    if (bytes > 0) f.write_all(a.data, bytes);
    f.write_all(kZeros, align_up(bytes, kDataAlign) - bytes);
  }
  f.sync();
  f.close();
}

RankFileHeader read_rank_header(const io::File& f) {
  RankFileHeader h;
  h.file_bytes = f.size();
  if (h.file_bytes < kRankHeaderBytes)
    corrupt(f, "truncated: " + std::to_string(h.file_bytes) + " bytes, shorter than the " +
                   std::to_string(kRankHeaderBytes) + "-byte header");
  unsigned char head[kRankHeaderBytes];
  f.pread_exact(head, sizeof head, 0, "the header");
  if (std::memcmp(head + kMagic, kRankMagic, 8) != 0)
    corrupt(f, "does not start with the magic \"ZEROCKPT\": it is not a zero checkpoint rank file");
  h.version = get32(head + kVersion);
  if (h.version > kFormatVersion)
    ZERO_FAIL("checkpoint rank file " + io::quote(f.path()) + " has format version " +
              std::to_string(h.version) + ", newer than this build reads (" +
              std::to_string(kFormatVersion) +
              ")\nHINT: load it with the newer zero build that wrote it");
  if (h.version == 0) corrupt(f, "has the invalid format version 0");
  if (get32(head + kHeaderCrc) != crc32c(head, kHeaderCrc)) corrupt(f, "header checksum mismatch");
  if (get32(head + kHeaderBytes) != kRankHeaderBytes)
    corrupt(f, "header size " + std::to_string(get32(head + kHeaderBytes)) + ", expected " +
                   std::to_string(kRankHeaderBytes));
  h.rank = static_cast<int>(get32(head + kRank));
  h.world_size = static_cast<int>(get32(head + kWorldSize));
  const uint64_t piece_count = get32(head + kPieceCount);
  const uint64_t array_count = get32(head + kArrayCount);
  h.block_elems = get32(head + kBlockElems);
  h.save_id = get64(head + kSaveId);
  h.param_hash = get64(head + kParamHash);
  h.numel = get64(head + kNumel);
  const uint64_t table_bytes = get64(head + kTableBytes);
  h.data_offset = get64(head + kDataOffset);
  if (h.block_elems == 0) corrupt(f, "block size 0 in the header");
  if (h.rank < 0 || h.world_size <= 0 || h.rank >= h.world_size)
    corrupt(f, "rank " + std::to_string(h.rank) + " of world size " + std::to_string(h.world_size) +
                   " in the header");
  if (table_bytes > h.file_bytes - kRankHeaderBytes)
    corrupt(f, "truncated: the table needs " + std::to_string(table_bytes) + " bytes after the " +
                   "header, the file has " + std::to_string(h.file_bytes) + " in all");
  if (h.numel > (uint64_t{1} << 61)) corrupt(f, "element count " + std::to_string(h.numel));

  std::vector<unsigned char> table(table_bytes);
  f.pread_exact(table.data(), table.size(), kRankHeaderBytes, "the table");
  if (get32(head + kTableCrc) != crc32c(table.data(), table.size()))
    corrupt(f, "table checksum mismatch");

  // The table: pieces, array names, block checksums; every length checked before it is used.
  size_t at = 0;
  const auto need = [&](uint64_t n, const char* what) {
    if (n > table.size() - at) corrupt(f, std::string("the table is too short for ") + what);
  };
  const uint64_t entry = piece_entry_bytes(h.version);
  need(piece_count * entry, "its pieces");
  uint64_t sum = 0;
  h.pieces.reserve(piece_count);
  for (uint64_t i = 0; i < piece_count; ++i, at += entry) {
    Piece p{static_cast<int>(get32(&table[at])), static_cast<int64_t>(get64(&table[at + 8])),
            static_cast<int64_t>(get64(&table[at + 16]))};
    if (h.version >= 2) {
      p.repeat = static_cast<int64_t>(get64(&table[at + 24]));
      p.stride = p.repeat == 1 ? 0 : static_cast<int64_t>(get64(&table[at + 32]));
    }
    int64_t length = 0;
    if (p.param < 0 || p.offset < 0 || p.count <= 0 || p.repeat < 1 ||
        (p.strided() && p.stride < p.count) || __builtin_mul_overflow(p.repeat, p.count, &length))
      corrupt(f, "piece " + std::to_string(i) + " is invalid");
    sum += static_cast<uint64_t>(length);
    if (sum > (uint64_t{1} << 61)) corrupt(f, "its pieces hold more than 2^61 elements");
    h.pieces.push_back(p);
  }
  if (sum != h.numel)
    corrupt(f, "its pieces hold " + std::to_string(sum) + " elements, the header says " +
                   std::to_string(h.numel));
  uint64_t name_bytes = 0;
  for (uint64_t a = 0; a < array_count; ++a) {
    need(4, "its array names");
    const uint32_t len = get32(&table[at]);
    at += 4;
    need(len, "its array names");
    h.arrays.emplace_back(reinterpret_cast<const char*>(&table[at]), len);
    at += len;
    name_bytes += 4 + uint64_t{len};
  }
  const uint64_t blocks = h.blocks();
  const uint64_t needed = table_bytes_for(piece_count, h.version, name_bytes, array_count, blocks);
  if (table_bytes != needed)
    corrupt(f, "the table has " + std::to_string(table_bytes) + " bytes, its contents need " +
                   std::to_string(needed));
  at = static_cast<size_t>(piece_count * entry + align_up(name_bytes, 4));
  h.block_crc.assign(array_count, std::vector<uint32_t>(blocks));
  for (uint64_t a = 0; a < array_count; ++a)
    for (uint64_t b = 0; b < blocks; ++b, at += 4) h.block_crc[a][b] = get32(&table[at]);

  if (h.data_offset != align_up(kRankHeaderBytes + table_bytes, kDataAlign))
    corrupt(f, "data offset " + std::to_string(h.data_offset) + " in the header, expected " +
                   std::to_string(align_up(kRankHeaderBytes + table_bytes, kDataAlign)));
  h.array_stride = align_up(h.numel * sizeof(float), kDataAlign);
  const uint64_t expected = h.data_offset + array_count * h.array_stride;
  if (h.file_bytes != expected)
    corrupt(f, std::string(h.file_bytes < expected ? "truncated: " : "wrong size: ") +
                   std::to_string(h.file_bytes) + " bytes, its header and table say " +
                   std::to_string(expected));
  return h;
}

void read_array_range(const io::File& f, const RankFileHeader& h, size_t array, uint64_t first,
                      uint64_t count, float* out, BlockCache& cache) {
  ZERO_REQUIRE(array < h.arrays.size() && first + count <= h.numel,
               "checkpoint: read_array_range outside the array");
  if (count == 0) return;
  const uint64_t B = h.block_elems;
  // Blocks per read: about 16 MiB, at least one block.
  const uint64_t batch = std::max<uint64_t>(1, (uint64_t{16} << 20) / (B * sizeof(float)));
  const uint64_t base = h.data_offset + array * h.array_stride;
  const uint64_t last_block = (first + count - 1) / B;
  for (uint64_t b0 = first / B; b0 <= last_block; b0 += batch) {
    const uint64_t b1 = std::min(last_block + 1, b0 + batch);    // blocks [b0, b1)
    const uint64_t e0 = b0 * B, e1 = std::min(b1 * B, h.numel);  // their elements
    if (cache.array != array || e0 < cache.first || e1 > cache.last) {
      cache.array = SIZE_MAX;  // invalid until the new blocks are verified
      cache.bytes.resize(static_cast<size_t>((e1 - e0) * sizeof(float)));
      f.pread_exact(cache.bytes.data(), cache.bytes.size(), base + e0 * sizeof(float),
                    "array '" + h.arrays[array] + "'");
      for (uint64_t b = b0; b < b1; ++b) {
        const uint64_t s = b * B, e = std::min((b + 1) * B, h.numel);
        const char* p = cache.bytes.data() + (s - e0) * sizeof(float);
        if (crc32c(p, (e - s) * sizeof(float)) != h.block_crc[array][b])
          corrupt(f, "checksum mismatch in array '" + h.arrays[array] + "', block " +
                         std::to_string(b) + " (elements [" + std::to_string(s) + ", " +
                         std::to_string(e) + "))");
      }
      cache.array = array;
      cache.first = e0;
      cache.last = e1;
    }
    // The wanted part of these blocks.
    const uint64_t c0 = std::max(first, e0), c1 = std::min(first + count, e1);
    std::memcpy(out + (c0 - first), cache.bytes.data() + (c0 - cache.first) * sizeof(float),
                (c1 - c0) * sizeof(float));
  }
}

}  // namespace zero::checkpoint::detail
