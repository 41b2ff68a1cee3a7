// The partitioner: the one place that knows where every parameter element lives in the flat
// buffers and which rank owns it. Everything else (stage strategies, the optimizer shard,
// checkpoints) asks it. Deterministic: every rank computes the same layout from the same model.
//
// One flat buffer per GROUP. Group u holds the parameters whose first user is Unit u (a tied
// parameter lives in the group of the first Unit that uses it: wte with the embedding), in the
// model's table order, so a Unit's parameters are one contiguous region that stage 3 gathers
// with one all-gather (as FSDP's per-module flat parameters).
//
//   group g on N ranks (offsets in elements of any dtype: the same layout serves the 16-bit
//   parameters, the gradients and the fp32 master/Adam shards)
//
//   0         a (aligned)      b (aligned)                                    padded_numel
//   | p_first  |pad| p_second   |pad| ...  | p_last |           tail pad               |
//   |<---- shard 0 ---->|<---- shard 1 ---->|<---- shard 2 ---->| ... |<-- shard N-1 -->|
//
//   - every parameter starts at a multiple of kAlignElems (64 elements: 128 bytes in 16-bit,
//     256 in fp32), so vector kernels and copies never see a misaligned parameter;
//   - padded_numel is a multiple of N * kAlignElems, never refused: each rank's shard is
//     padded_numel / N elements and starts aligned; padding is zero and stays zero;
//   - a parameter may straddle shards: Piece records, for one rank and group, which elements of
//     which parameter fall into its shard (param offset, shard offset, count).
//
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/unit.hpp"

namespace zero {

class Partition {
 public:
  static constexpr int64_t kAlignElems = 64;

  struct Location {
    int group = -1;       // the group holding the parameter
    int64_t offset = 0;   // first element within the group's flat buffer (aligned)
    int64_t numel = 0;
  };
  struct Group {
    int unit = -1;              // the Unit whose parameters these are (first user)
    std::vector<int> params;    // parameter ids, in layout order
    int64_t used_numel = 0;     // end of the last parameter (alignment gaps included)
    int64_t padded_numel = 0;   // multiple of world_size * kAlignElems
    int64_t shard_numel = 0;    // padded_numel / world_size
  };
  // Elements [param_offset, param_offset + count) of parameter `param` sit at
  // [shard_offset, shard_offset + count) of one rank's shard of one group.
  struct Piece {
    int param = -1;
    int64_t param_offset = 0;
    int64_t shard_offset = 0;
    int64_t count = 0;
  };

  // Throws zero::Error for world_size < 1 or a model whose Units name unknown parameters.
  Partition(const Model& model, int world_size);

  int world_size() const noexcept { return world_size_; }
  int group_count() const noexcept { return static_cast<int>(groups_.size()); }
  const Group& group(int g) const { return groups_.at(static_cast<size_t>(g)); }
  const Location& location(int param) const { return locations_.at(static_cast<size_t>(param)); }
  // The groups a Unit needs present to run: its own and those of tied parameters it uses,
  // ascending.
  std::span<const int> unit_groups(int unit) const { return unit_groups_.at(static_cast<size_t>(unit)); }

  // Where group g's shard of `rank` starts in the group's flat buffer.
  int64_t shard_begin(int group, int rank) const;
  // The pieces of parameters in `rank`'s shard of `group`, in shard order.
  std::vector<Piece> pieces(int rank, int group) const;

  // Totals over all groups: what one rank holds at 1/N, and the full padded model.
  int64_t shard_numel_total() const noexcept { return shard_total_; }
  int64_t padded_numel_total() const noexcept { return padded_total_; }
  int64_t parameter_numel() const noexcept { return param_total_; }
  // Where group g's shard starts inside the rank's concatenation of all its shards (group order):
  // the layout of the optimizer state partition.
  int64_t shard_concat_offset(int group) const { return shard_concat_.at(static_cast<size_t>(group)); }

  // A table: group, unit, parameters, padded size, shard size, padding share.
  std::string describe(const Model& model) const;

 private:
  int world_size_;
  std::vector<Group> groups_;
  std::vector<Location> locations_;
  std::vector<std::vector<int>> unit_groups_;
  std::vector<int64_t> shard_concat_;
  int64_t shard_total_ = 0, padded_total_ = 0, param_total_ = 0;
};

}  // namespace zero
