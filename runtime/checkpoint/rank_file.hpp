// The binary rank file of a checkpoint (private to runtime/checkpoint; the byte layout is in
// docs/checkpoint-format.md, "Rank files"): one saving rank's pieces and, for each named fp32
// array, its values in piece order, in CRC-32C-checked blocks.
//
// The writer streams the caller's arrays to the file without copying them; the reader checks
// the fixed header and the table once (read_rank_header) and then reads any element range of
// any array, verifying every block it touches (read_array_range).
//
// Thread-safety: reading one open file from several threads is fine (pread); a RankFileHeader
// is an immutable value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/file_io.hpp"

namespace zero::checkpoint::detail {

inline constexpr char kRankMagic[8] = {'Z', 'E', 'R', 'O', 'C', 'K', 'P', 'T'};
inline constexpr uint32_t kRankHeaderBytes = 128;  // the fixed header
inline constexpr uint32_t kDataAlign = 64;         // arrays start at multiples of this
// A piece in the table: version 1 has u32 param, u32 zero, u64 offset, u64 count; version 2
// (written when the file holds a strided piece) adds u64 repeat, u64 stride (0 when repeat is 1).
inline constexpr uint32_t kPieceEntryBytesV1 = 24;
inline constexpr uint32_t kPieceEntryBytesV2 = 40;

// The identity of a parameter table: FNV-1a over each parameter's name and dimensions.
uint64_t param_table_hash(std::span<const ParamInfo> params);

struct RankFileHeader {
  uint32_t version = 0;  // 1, or 2 when a piece is strided
  int rank = 0;
  int world_size = 0;
  uint32_t block_elems = 0;
  uint64_t save_id = 0;
  uint64_t param_hash = 0;
  uint64_t numel = 0;  // elements per array = sum of piece lengths
  std::vector<Piece> pieces;
  std::vector<std::string> arrays;
  std::vector<std::vector<uint32_t>> block_crc;  // [array][block]
  uint64_t data_offset = 0;                      // first array's first byte
  uint64_t array_stride = 0;                     // bytes from one array to the next
  uint64_t file_bytes = 0;                       // the file's exact size

  uint64_t blocks() const noexcept { return numel == 0 ? 0 : (numel - 1) / block_elems + 1; }
};

// The exact size of the rank file write_rank_file_at writes for these pieces and array names.
uint64_t rank_file_bytes(std::span<const Piece> pieces, std::span<const std::string> array_names,
                         uint32_t block_elems);

// Writes the file at `path` (created or truncated), fsyncs and closes it, in format version
// pieces_version(pieces). The pieces and arrays must have been validated (pieces_error; arrays
// hold sum(lengths) floats).
void write_rank_file_at(const std::string& path, int rank, int world_size, uint64_t save_id,
                        uint64_t param_hash, std::span<const Piece> pieces,
                        std::span<const ConstArray> arrays, uint32_t block_elems);

// Reads and checks the fixed header and the table of an open rank file: magic, version, the two
// checksums, the table's internal consistency and the file's size. Errors name the file.
RankFileHeader read_rank_header(const io::File& file);

// The last blocks read_array_range read and verified from one file: a run that starts in the
// block where the previous one ended reuses it instead of reading and checking it again. Clear
// it (or use a fresh one) for every file.
struct BlockCache {
  std::vector<char> bytes;
  size_t array = SIZE_MAX;
  uint64_t first = 0, last = 0;  // elements [first, last) of `array` are in `bytes`
  void clear() noexcept { array = SIZE_MAX; }
};

// Elements [first, first + count) of array `array` into `out`, reading and CRC-checking the
// blocks that hold them, at most about 16 MiB at a time through `cache`.
void read_array_range(const io::File& file, const RankFileHeader& h, size_t array, uint64_t first,
                      uint64_t count, float* out, BlockCache& cache);

}  // namespace zero::checkpoint::detail
