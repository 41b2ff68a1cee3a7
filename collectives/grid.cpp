#include "collectives/grid.hpp"

#include "core/error.hpp"

namespace zero::coll {

std::string_view to_string(Axis a) noexcept {
  switch (a) {
    case Axis::pipeline: return "pipeline";
    case Axis::tensor: return "tensor";
    case Axis::data: break;
  }
  return "data";
}

int GridShape::size(Axis a) const noexcept {
  switch (a) {
    case Axis::pipeline: return pipeline;
    case Axis::tensor: return tensor;
    case Axis::data: break;
  }
  return data;
}

int GridCoord::on(Axis a) const noexcept {
  switch (a) {
    case Axis::pipeline: return pipeline;
    case Axis::tensor: return tensor;
    case Axis::data: break;
  }
  return data;
}

namespace {

constexpr const char* kKeysHint =
    "set zero_train.parallel.pipeline and zero_train.parallel.tensor (or DeepSpeed's "
    "pipeline.stages) so that pipeline x tensor divides the number of ranks, or launch a "
    "multiple of pipeline x tensor ranks (mpirun -np)";

std::string sizes_text(long long data, long long pipeline, long long tensor) {
  return std::to_string(data) + " data x " + std::to_string(pipeline) + " pipeline x " +
         std::to_string(tensor) + " tensor";
}

}  // namespace

GridShape grid_shape_for(int world_size, int pipeline, int tensor) {
  ZERO_REQUIRE(world_size >= 1, "process grid: world size " + std::to_string(world_size) +
                                    " (expected >= 1)");
  if (pipeline < 1 || tensor < 1)
    ZERO_FAIL("process grid: pipeline " + std::to_string(pipeline) + " and tensor " +
              std::to_string(tensor) + " must both be >= 1 (world size " +
              std::to_string(world_size) + ")\nHINT: " + kKeysHint);
  const long long model = static_cast<long long>(pipeline) * tensor;
  if (world_size % model != 0)
    ZERO_FAIL("process grid: " + std::to_string(world_size) + " ranks cannot be arranged as " +
              "data x " + std::to_string(pipeline) + " pipeline x " + std::to_string(tensor) +
              " tensor: pipeline x tensor = " + std::to_string(model) +
              " does not divide the world size " + std::to_string(world_size) + "\nHINT: " +
              kKeysHint);
  return {static_cast<int>(world_size / model), pipeline, tensor};
}

void check_grid(const GridShape& s, int world_size) {
  if (s.data < 1 || s.pipeline < 1 || s.tensor < 1 || s.world() != world_size)
    ZERO_FAIL("process grid " + sizes_text(s.data, s.pipeline, s.tensor) + " = " +
              std::to_string(s.world()) + " ranks does not match the world size " +
              std::to_string(world_size) + "; every size must be >= 1 and their product the "
              "world size\nHINT: " + kKeysHint);
}

GridCoord grid_coord(const GridShape& s, int rank) {
  ZERO_REQUIRE(rank >= 0 && rank < s.world(),
               "process grid: rank " + std::to_string(rank) + " outside a grid of " +
                   std::to_string(s.world()) + " ranks");
  return {(rank / s.tensor) % s.data, rank / (s.tensor * s.data), rank % s.tensor};
}

int grid_rank(const GridShape& s, const GridCoord& c) {
  ZERO_REQUIRE(c.data >= 0 && c.data < s.data && c.pipeline >= 0 && c.pipeline < s.pipeline &&
                   c.tensor >= 0 && c.tensor < s.tensor,
               "process grid: coordinate (d " + std::to_string(c.data) + ", p " +
                   std::to_string(c.pipeline) + ", t " + std::to_string(c.tensor) +
                   ") outside " + sizes_text(s.data, s.pipeline, s.tensor));
  return c.tensor + s.tensor * (c.data + s.data * c.pipeline);
}

std::vector<int> axis_group(const GridShape& s, int rank, Axis axis) {
  GridCoord c = grid_coord(s, rank);
  std::vector<int> ranks;
  const int n = s.size(axis);
  ranks.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    switch (axis) {
      case Axis::data: c.data = i; break;
      case Axis::pipeline: c.pipeline = i; break;
      case Axis::tensor: c.tensor = i; break;
    }
    ranks.push_back(grid_rank(s, c));
  }
  return ranks;
}

ProcessGrid::ProcessGrid(Communicator& world, const GridShape& shape)
    : shape_(shape), world_rank_(world.rank()) {
  check_grid(shape, world.size());  // same outcome on every rank: no split is left waiting
  coord_ = grid_coord(shape, world_rank_);
  const GridCoord& c = coord_;
  const int D = shape.data, T = shape.tensor;
  // Each split's color names the group (the two coordinates its members share, as one number);
  // its key is the coordinate along the axis, so the rank in the new communicator is that
  // coordinate. Every rank makes the three calls in the same order (split is collective).
  tensor_ = world.split(c.data + D * c.pipeline, c.tensor);
  data_ = world.split(c.tensor + T * c.pipeline, c.data);
  pipeline_ = world.split(c.tensor + T * c.data, c.pipeline);
  ZERO_REQUIRE(tensor_ && data_ && pipeline_, "process grid: a split returned no communicator");
  ZERO_REQUIRE(tensor_->size() == shape.tensor && data_->size() == D &&
                   pipeline_->size() == shape.pipeline && tensor_->rank() == c.tensor &&
                   data_->rank() == c.data && pipeline_->rank() == c.pipeline,
               "process grid: the axis communicators do not match the grid " + describe());
}

Communicator& ProcessGrid::axis(Axis a) noexcept {
  switch (a) {
    case Axis::pipeline: return *pipeline_;
    case Axis::tensor: return *tensor_;
    case Axis::data: break;
  }
  return *data_;
}

std::optional<int> ProcessGrid::prev_stage() const noexcept {
  if (first_stage()) return std::nullopt;
  return coord_.pipeline - 1;
}

std::optional<int> ProcessGrid::next_stage() const noexcept {
  if (last_stage()) return std::nullopt;
  return coord_.pipeline + 1;
}

std::string ProcessGrid::describe() const {
  return "grid " + sizes_text(shape_.data, shape_.pipeline, shape_.tensor) + "; rank " +
         std::to_string(world_rank_) + " = (d " + std::to_string(coord_.data) + ", p " +
         std::to_string(coord_.pipeline) + ", t " + std::to_string(coord_.tensor) + ")";
}

}  // namespace zero::coll
