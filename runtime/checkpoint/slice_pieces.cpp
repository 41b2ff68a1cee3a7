#include "runtime/checkpoint/slice_pieces.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace zero::checkpoint {

std::vector<Piece> whole_pieces(const ParamSlice& slice, int param, int64_t shard_offset,
                                int64_t count) {
  const std::string where = "checkpoint: parameter " + std::to_string(param) + "'s shard range [" +
                            std::to_string(shard_offset) + ", + " + std::to_string(count) + ")";
  ZERO_REQUIRE(shard_offset >= 0 && count >= 0, where + " is negative");
  if (slice.split == TensorSplit::replicated)
    ZERO_REQUIRE(count <= slice.full.numel() - shard_offset,
                 where + " lies outside the replicated parameter " + slice.full.str());
  if (count == 0) return {};
  if (slice.split != TensorSplit::sliced) return {Piece{param, shard_offset, count}};

  const Shape& full = slice.full;
  ZERO_REQUIRE(slice.degree >= 1 && slice.rank >= 0 && slice.rank < slice.degree &&
                   slice.dim >= 0 && slice.dim < full.rank() && slice.blocks >= 1 &&
                   full[slice.dim] % (static_cast<int64_t>(slice.blocks) * slice.degree) == 0,
               where + ": the slice (rank " + std::to_string(slice.rank) + " of " +
                   std::to_string(slice.degree) + ", dimension " + std::to_string(slice.dim) +
                   ", " + std::to_string(slice.blocks) + " block(s)) does not fit the shape " +
                   full.str());
  ZERO_REQUIRE(count <= full.numel() / slice.degree - shard_offset,
               where + " lies outside the shard of " +
                   std::to_string(full.numel() / slice.degree) + " elements");
  if (slice.degree == 1) return {Piece{param, shard_offset, count}};

  int64_t inner = 1;  // whole elements per step along dim
  for (int d = slice.dim + 1; d < full.rank(); ++d) inner *= full[d];
  const int64_t block_len = full[slice.dim] / slice.blocks;   // a block's extent along dim
  const int64_t width = block_len / slice.degree;              // the shard's part of a block
  const int64_t run = width * inner;                           // L: elements of one run
  const int64_t stride = block_len * inner;                    // S: from one run to the next
  const int64_t base = slice.rank * width * inner;             // run 0's first element
  const auto start = [&](int64_t k) { return base + k * stride; };

  std::vector<Piece> out;
  int64_t at = shard_offset;
  const int64_t end = shard_offset + count;
  if (at % run != 0) {  // a partial first run
    const int64_t n = std::min(run - at % run, end - at);
    out.push_back({param, start(at / run) + at % run, n});
    at += n;
  }
  if (const int64_t whole = (end - at) / run; whole > 0) {  // whole runs, one strided piece
    Piece p{param, start(at / run), run};
    if (whole > 1) {
      p.repeat = whole;
      p.stride = stride;
    }
    out.push_back(p);
    at += whole * run;
  }
  if (at < end) out.push_back({param, start(at / run), end - at});  // a partial last run
  return out;
}

}  // namespace zero::checkpoint
