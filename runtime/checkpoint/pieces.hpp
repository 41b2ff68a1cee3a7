// Parameter tables and pieces (private to runtime/checkpoint): the checks every request goes
// through, and Coverage, which knows where every saved element of a checkpoint lives: for each
// parameter, the saved pieces' contiguous runs (a strided piece contributes one per repeat)
// sorted by offset, each with the rank file holding it and its position in that file's arrays.
// Building it checks that the runs tile every parameter exactly once (sort, then one pass: no
// pairwise comparison of pieces); a wanted piece, strided or not, is then resolved into the
// saved runs that hold it (re-slicing), a binary search per wanted run.
//
// Thread-safety: pure functions; a Coverage is immutable after build().
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.hpp"

namespace zero::checkpoint::detail {

// Empty, or what is wrong with the table: an empty or repeated name, a negative dimension, more
// than 2^56 elements in one parameter.
std::string param_table_error(std::span<const ParamInfo> params);
// Empty, or what is wrong with the first bad piece: unknown parameter, count <= 0, repeat < 1,
// overlapping runs (repeat > 1 and stride < count), a run outside the parameter, a length
// (repeat * count) or an end that overflows. `params` must have passed param_table_error.
std::string pieces_error(std::span<const ParamInfo> params, std::span<const Piece> pieces);
// Sum of the pieces' lengths: the length of every array.
uint64_t total_count(std::span<const Piece> pieces) noexcept;
// The format version of a rank file (or manifest) holding these pieces: 1 when none is strided
// (the original format, byte for byte), else 2.
uint32_t pieces_version(std::span<const Piece> pieces) noexcept;
// "[768, 3072]".
std::string shape_text(const std::vector<int64_t>& shape);

class Coverage {
 public:
  // files[f] = the pieces of rank file f, in its array order (the caller checked them with
  // pieces_error). Returns an empty string, or what is wrong: the first element range of a
  // parameter saved by no file or by two ("parameter 'x' elements [5, 8) ..."). Time
  // O(R log R) and memory O(R) for R runs in all (adjacent runs of one file that are adjacent
  // in its arrays too are merged into one).
  std::string build(std::span<const ParamInfo> params, std::span<const std::vector<Piece>> files);

  struct Run {
    int file = 0;
    uint64_t src = 0;  // first element within the file's arrays
    uint64_t count = 0;
    uint64_t dst = 0;  // first element within the wanted piece
  };
  // The saved runs that together hold `want` (which passed pieces_error), in the order of its
  // elements; dst counts over all of want's runs (run r of a strided want starts at r * count).
  std::vector<Run> locate(const Piece& want) const;

 private:
  struct Saved {
    int64_t offset = 0, count = 0;
    int file = 0;
    uint64_t pos = 0;
  };
  // Appends the runs holding [offset, offset + count) of parameter `param`, dst from `dst`.
  void locate_run(int param, int64_t offset, int64_t count, uint64_t dst,
                  std::vector<Run>& out) const;
  std::vector<std::vector<Saved>> by_param_;  // sorted by offset, tiling the parameter
};

}  // namespace zero::checkpoint::detail
