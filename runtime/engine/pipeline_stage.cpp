#include "runtime/engine/pipeline_stage.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "runtime/pipeline/stage_partition.hpp"

namespace zero::engine {

PipelineStage make_pipeline_stage(Model& model, const pipeline::StageCut& cut, coll::Communicator& pipe) {
  ZERO_REQUIRE(cut.stages() == pipe.size(),
               "pipeline stage set-up: the cut has " + std::to_string(cut.stages()) +
                   " stages but the pipeline communicator has " + std::to_string(pipe.size()) + " ranks");
  const int s = pipe.rank();
  PipelineStage out;
  out.view = pipeline::stage_model(model, cut, s);
  // Tied parameters: every one must be held by the same stages (one communicator for them).
  const std::vector<pipeline::TiedParameter> tied = pipeline::tied_parameters(model, cut);
  std::vector<int> holders;
  for (const pipeline::TiedParameter& t : tied) {
    if (holders.empty()) holders = t.stages;
    ZERO_REQUIRE(t.stages == holders,
                 "pipeline stage set-up: parameter " + model.params[static_cast<size_t>(t.param)].name +
                     " is used on other stages than parameter " +
                     model.params[static_cast<size_t>(tied.front().param)].name +
                     "; only one set of stages sharing tied parameters is supported: choose "
                     "another partition");
  }
  const bool holds = std::find(holders.begin(), holders.end(), s) != holders.end();
  out.tied_comm = pipe.split(holds ? 0 : -1, s);
  PipelinePlace& pl = out.place;
  pl.pipe = &pipe;
  pl.stage = s;
  pl.stages = pipe.size();
  pl.to_original = out.view.to_original;
  if (holds) {
    for (const pipeline::TiedParameter& t : tied) {
      auto it = std::find(pl.to_original.begin(), pl.to_original.end(), t.param);
      pl.tied.push_back(static_cast<int>(it - pl.to_original.begin()));
    }
    pl.tied_comm = out.tied_comm.get();
    pl.owns_tied = s == holders.front();
  }
  return out;
}

}  // namespace zero::engine
