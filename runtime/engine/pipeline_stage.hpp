// Setting up one pipeline stage's Engine: the stage's view of the model, and the PipelinePlace
// (engine.hpp) that tells the Engine its neighbours and its tied parameters.
//
//   auto st = engine::make_pipeline_stage(model, cut, grid.pipeline());
//   Engine e(st.view.model, dev, compute, grid.data(), options, st.place);
//   e.pipeline_step(pipeline::one_f_one_b(P, M, st.place.stage), next);
//
// Ownership: the result owns the view and the tied communicator; `model` and `pipe` must
// outlive it, and it must outlive the Engine built from it. Collective over `pipe` (one split
// for the tied communicator): every stage calls it with the same cut.
#pragma once

#include <memory>

#include "collectives/communicator.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/pipeline/stage_model.hpp"

namespace zero::engine {

struct PipelineStage {
  pipeline::StageModel view;
  std::unique_ptr<coll::Communicator> tied_comm;  // null when this stage holds no tied parameter
  PipelinePlace place;
};

// Stage pipe.rank() of `cut` (cut.stages() == pipe.size()). Throws zero::Error when the sizes
// disagree, or when tied parameters are held by different sets of stages (one tied group is
// supported: a GPT's wte on the first and last stage).
PipelineStage make_pipeline_stage(Model& model, const pipeline::StageCut& cut, coll::Communicator& pipe);

}  // namespace zero::engine
