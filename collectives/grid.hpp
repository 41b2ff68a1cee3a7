// The process grid: the world of W ranks as data x pipeline x tensor, each rank's coordinate
// and one communicator per axis (docs/pipeline.md, "The grid").
//
// Placement. Tensor varies fastest, then data, then pipeline (outermost):
//
//   rank = t + T * (d + D * p)          t in [0, T), d in [0, D), p in [0, P), W = D * P * T
//   t = rank % T,   d = (rank / T) % D,   p = rank / (T * D)
//
// so consecutive ranks (one host's GPUs, as launchers number them) form a tensor group first,
// which talks the most (an all-reduce in every layer, forward and backward), then a stage's
// data-parallel group (a reduce-scatter per step); the pipeline axis, which only sends one
// micro-batch's boundary activations between neighbours, crosses hosts. This is Megatron's
// default order and DeepSpeed's PipeModelDataParallelTopology.
//
// Axis communicators. The `tensor` communicator of a rank holds the ranks that share its (d, p)
// and differ in t; `data` those that share (p, t); `pipeline` those that share (d, t). A rank's
// index in each is its coordinate on that axis (rank in tensor() == t, and so on), so pipeline
// stage s of this rank's pipeline is rank s of pipeline().
//
// Thread-safety and lifetime: a ProcessGrid is built and used by one thread at a time; its
// communicators follow Communicator's rules. The world communicator it was split from may be
// destroyed first (split results are independent communicators).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/communicator.hpp"

namespace zero::coll {

enum class Axis { data, pipeline, tensor };
std::string_view to_string(Axis a) noexcept;

// The sizes of the three axes. World size = data * pipeline * tensor.
struct GridShape {
  int data = 1;
  int pipeline = 1;
  int tensor = 1;

  long long world() const noexcept {
    return static_cast<long long>(data) * pipeline * tensor;
  }
  int size(Axis a) const noexcept;
  bool operator==(const GridShape&) const = default;
};

// A rank's place in the grid.
struct GridCoord {
  int data = 0;
  int pipeline = 0;
  int tensor = 0;

  int on(Axis a) const noexcept;
  bool operator==(const GridCoord&) const = default;
};

// The shape for `world_size` ranks with `pipeline` stages and `tensor` slices: data =
// world_size / (pipeline * tensor). Throws zero::Error when a size is below 1 or pipeline x
// tensor does not divide the world, naming the three sizes, the world size and the config keys
// (zero_train.parallel.pipeline, zero_train.parallel.tensor).
GridShape grid_shape_for(int world_size, int pipeline, int tensor);

// Checks that `shape` has every size >= 1 and multiplies to `world_size`; throws zero::Error
// naming the three sizes, the world size and the config keys otherwise.
void check_grid(const GridShape& shape, int world_size);

// The formula above, both ways. `rank` must be in [0, shape.world()), `c` inside the shape.
GridCoord grid_coord(const GridShape& shape, int rank);
int grid_rank(const GridShape& shape, const GridCoord& c);

// The world ranks of the group on `axis` that `rank` belongs to, in the order of the axis
// coordinate (the i-th entry is the rank whose coordinate on `axis` is i).
std::vector<int> axis_group(const GridShape& shape, int rank, Axis axis);

class ProcessGrid {
 public:
  // Splits `world` into the three axis communicators (three Communicator::split calls, each
  // collective over `world`: every rank of `world` must call this with the same shape). Throws
  // zero::Error (before any split, on every rank alike) when the shape does not match
  // world.size().
  ProcessGrid(Communicator& world, const GridShape& shape);

  const GridShape& shape() const noexcept { return shape_; }
  const GridCoord& coord() const noexcept { return coord_; }
  int world_rank() const noexcept { return world_rank_; }

  // The communicator of this rank's group on each axis (its rank there = the coordinate).
  Communicator& data() noexcept { return *data_; }
  Communicator& pipeline() noexcept { return *pipeline_; }
  Communicator& tensor() noexcept { return *tensor_; }
  Communicator& axis(Axis a) noexcept;

  // Pipeline neighbours, as ranks in pipeline(): the previous stage (none on the first) and the
  // next stage (none on the last). Activations go to next_stage(), their gradients come back
  // from it.
  std::optional<int> prev_stage() const noexcept;
  std::optional<int> next_stage() const noexcept;
  bool first_stage() const noexcept { return coord_.pipeline == 0; }
  bool last_stage() const noexcept { return coord_.pipeline == shape_.pipeline - 1; }

  // "grid 2 data x 2 pipeline x 1 tensor; rank 3 = (d 1, p 1, t 0)", for the start-up report.
  std::string describe() const;

 private:
  GridShape shape_;
  GridCoord coord_;
  int world_rank_;
  std::unique_ptr<Communicator> data_, pipeline_, tensor_;
};

}  // namespace zero::coll
