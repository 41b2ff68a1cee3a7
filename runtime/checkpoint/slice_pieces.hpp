// A tensor-parallel shard's elements as pieces of the whole parameter, for checkpoints
// (docs/checkpoint-format.md, "Tensor-parallel checkpoints"). A checkpoint stores WHOLE
// parameters (param_table lists whole shapes), so a rank holding shard `slice` of a parameter
// saves and loads its elements as pieces of the whole parameter; any other degree then re-slices
// them like any other pieces.
//
// The layout (ParamSlice, core/unit.hpp): the whole parameter is row-major over
// [outer..., full[dim], inner...]; along `dim` it is `blocks` equal blocks, each cut into `degree`
// pieces of w = full[dim] / (blocks * degree). The shard holds piece `rank` of every block, so in
// shard order its elements are runs of L = w * inner consecutive whole elements, run k (k over
// outer rows and blocks, block fastest) starting at (k * full[dim] / blocks + rank * w) * inner:
// equally spaced, S = full[dim] / blocks * inner apart. A shard range is therefore at most three
// pieces: a partial first run, the whole runs as one strided piece (repeat = their number,
// stride S), a partial last run.
//
//   whole row (blocks 3, degree 2):  | q0 q1 | k0 k1 | v0 v1 |   rank 1 holds q1 k1 v1, ...
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>
#include <vector>

#include "core/unit.hpp"
#include "runtime/checkpoint/checkpoint.hpp"

namespace zero::checkpoint {

// Pieces of the WHOLE parameter `param` (its index in the parameter table) whose elements, in
// order, are the shard's elements [shard_offset, shard_offset + count) in shard (row-major)
// order: an engine passes its shard arrays unchanged as the save's or load's arrays. Unsliced
// (TensorSplit::none) and replicated parameters, and sliced ones at degree 1, map to the one
// contiguous piece [shard_offset, + count). Empty when count is 0. Throws zero::Error when the
// slice is inconsistent (rank outside degree, dim outside the shape, full[dim] not divisible
// by blocks x degree) or the range lies outside the shard (numel full.numel() / degree).
std::vector<Piece> whole_pieces(const ParamSlice& slice, int param, int64_t shard_offset,
                                int64_t count);

}  // namespace zero::checkpoint
