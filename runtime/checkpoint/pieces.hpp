// Parameter tables and pieces (private to runtime/checkpoint): the checks every request goes
// through, and Coverage, which knows where every saved element of a checkpoint lives: for each
// parameter, the saved pieces sorted by offset, each with the rank file holding it and its
// position in that file's arrays. Building it checks that the pieces tile every parameter
// exactly once; a wanted piece is then resolved into the saved runs that hold it (re-slicing).
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
// Empty, or what is wrong with the first bad piece: unknown parameter, count <= 0, outside the
// parameter. `params` must have passed param_table_error.
std::string pieces_error(std::span<const ParamInfo> params, std::span<const Piece> pieces);
// Sum of the pieces' counts: the length of every array.
uint64_t total_count(std::span<const Piece> pieces) noexcept;
// "[768, 3072]".
std::string shape_text(const std::vector<int64_t>& shape);

class Coverage {
 public:
  // files[f] = the pieces of rank file f, in its array order (the caller checked that each is
  // inside its parameter). Returns an empty string, or what is wrong: the first element range
  // of a parameter saved by no file or by two ("parameter 'x' elements [5, 8) ...").
  std::string build(std::span<const ParamInfo> params, std::span<const std::vector<Piece>> files);

  struct Run {
    int file = 0;
    uint64_t src = 0;  // first element within the file's arrays
    uint64_t count = 0;
    uint64_t dst = 0;  // first element within the wanted piece
  };
  // The saved runs that together hold `want` (which lies inside its parameter), in order.
  std::vector<Run> locate(const Piece& want) const;

 private:
  struct Saved {
    int64_t offset = 0, count = 0;
    int file = 0;
    uint64_t pos = 0;
  };
  std::vector<std::vector<Saved>> by_param_;  // sorted by offset, tiling the parameter
};

}  // namespace zero::checkpoint::detail
