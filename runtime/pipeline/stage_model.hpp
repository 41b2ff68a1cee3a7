// One pipeline stage's part of a model, as a Model of its own: what lets the existing ZeRO
// Engine (runtime/engine/engine.hpp) run over a stage's Units alone, with the stage's
// data-parallel communicator, unchanged (docs/pipeline.md, "A stage's model").
//
// The view of stage s of a cut (stage_partition.hpp) holds
//   params  the parameters the stage's Units [cut.begin(s), cut.end(s)) use (the union of their
//           param_ids), in the original model's canonical order, each ParamSpec copied
//           unchanged (name, shape, type, weight decay, initialisation): so
//           init_param_values gives every copy the value the whole model's parameter has, and a
//           tied parameter (a GPT's wte) appears in the view of every stage that uses it;
//   units   one adapter per stage Unit, in order, forwarding name(), checkpointable(),
//           forward(), backward(), splits_backward(), backward_input() and backward_weight() to
//           the original Unit, and reporting param_ids() remapped into the view's params (the
//           same order as the original Unit's: ctx.params and ctx.grads are unchanged).
// The view BORROWS the original Units: the original Model (and whatever its Units borrow, such
// as the Ops) must outlive the view. Building a view allocates no device memory and runs
// nothing; the adapters are as thread-safe as the Units they forward to.
//
// to_original[i] is the original index of the view's parameter i (strictly ascending): the map
// a checkpoint of the stage (by index; the names are the original ones anyway) and the sum of a
// tied parameter's gradients across stages need.
#pragma once

#include <vector>

#include "core/unit.hpp"
#include "runtime/pipeline/stage_partition.hpp"

namespace zero::pipeline {

struct StageModel {
  Model model;                   // the view; model.name: the original's + " stage 1 of 2"
  std::vector<int> to_original;  // view parameter index -> original parameter index
};

// The original indices of the parameters stage `stage` uses, ascending and distinct (exactly
// StageModel::to_original). Throws zero::Error when the cut does not cover the model's Units
// (cut.units() != model.units.size()), `stage` is outside [0, cut.stages()), or a Unit names a
// parameter outside the table; the message names the model, the numbers and the Unit.
std::vector<int> stage_param_ids(const Model& model, const StageCut& cut, int stage);

// The view of stage `stage` (0-based: "stage 0 of 2" is the first); the errors above. `model`
// must outlive the result.
StageModel stage_model(Model& model, const StageCut& cut, int stage);

}  // namespace zero::pipeline
