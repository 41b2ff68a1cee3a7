// The whole model as a checkpoint sees it, from one pipeline stage's Engine: the parameter table
// of the WHOLE model and where this rank sits. A stage's Engine holds only its view of the model
// (pipeline::stage_model), whose parameter i is the whole model's parameter to_original[i]; a
// checkpoint is always saved under the whole model's table (docs/checkpoint-format.md,
// "Pipeline checkpoints"), so that any loader, pipelined or not, at any depth, re-slices it.
// No stage knows the other stages' parameters, so the table is assembled from every rank's view.
// Internal to runtime/engine (engine_checkpoint.cpp).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "collectives/communicator.hpp"
#include "core/unit.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/engine.hpp"

namespace zero::engine {

struct CheckpointLayout {
  std::vector<checkpoint::ParamInfo> table;  // the whole model's, in its canonical order
  // For the manifest's metadata, information only (loading never reads it):
  // {"stages": P, "data_parallel": D, "cut": [0, u_1, ..., U]} (Unit boundaries of the stages).
  nlohmann::json info;
};

// Collective over `host_comm`, which must be the whole grid (every stage's every data-parallel
// rank: data_size x place.stages ranks; cpu). Every rank contributes its view's parameters under
// their whole-model indices; the union must name every index from 0 to the largest exactly
// once, with one name and shape per index. Every rank computes the same result from the same
// gathered bytes, so a failure (a view that disagrees, a parameter no stage uses, a host_comm
// that is not the grid) throws the same zero::Error on every rank. `what` prefixes messages.
CheckpointLayout pipeline_layout(const Model& view, const PipelinePlace& place, int data_rank,
                                 int data_size, coll::Communicator& host_comm, const std::string& what);

}  // namespace zero::engine
