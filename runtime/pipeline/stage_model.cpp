#include "runtime/pipeline/stage_model.hpp"

#include <memory>
#include <string>
#include <utility>

#include "core/error.hpp"

namespace zero::pipeline {

namespace {

// One stage Unit seen through the view: the original Unit does all the work; only the indices it
// reports change, so the engine looks its parameters up in the view's table.
class StageUnit final : public Unit {
 public:
  StageUnit(Unit& inner, std::vector<int> ids) : inner_(inner), ids_(std::move(ids)) {}

  const std::string& name() const noexcept override { return inner_.name(); }
  std::span<const int> param_ids() const noexcept override { return ids_; }
  bool checkpointable() const noexcept override { return inner_.checkpointable(); }
  void forward(UnitContext& ctx) override { inner_.forward(ctx); }
  void backward(UnitContext& ctx) override { inner_.backward(ctx); }
  bool splits_backward() const noexcept override { return inner_.splits_backward(); }
  void backward_input(UnitContext& ctx) override { inner_.backward_input(ctx); }
  void backward_weight(UnitContext& ctx) override { inner_.backward_weight(ctx); }

 private:
  Unit& inner_;
  std::vector<int> ids_;  // inner_.param_ids(), each mapped to its index in the view's table
};

void check_cut(const Model& model, const StageCut& cut, int stage) {
  const auto units = static_cast<int>(model.units.size());
  ZERO_REQUIRE(cut.units() == units && cut.stages() >= 1,
               "stage model of " + model.name + ": the cut covers " + std::to_string(cut.units()) +
                   " Units in " + std::to_string(cut.stages()) + " stages but the model has " +
                   std::to_string(units) + " Units; cut this model's Units (cut_stages)");
  ZERO_REQUIRE(stage >= 0 && stage < cut.stages(),
               "stage model of " + model.name + ": stage " + std::to_string(stage) +
                   " does not exist; the cut has stages 0.." + std::to_string(cut.stages() - 1));
}

}  // namespace

std::vector<int> stage_param_ids(const Model& model, const StageCut& cut, int stage) {
  check_cut(model, cut, stage);
  const auto num_params = static_cast<int>(model.params.size());
  std::vector<bool> used(model.params.size(), false);
  for (int u = cut.begin(stage); u < cut.end(stage); ++u) {
    const Unit& unit = *model.units[static_cast<size_t>(u)];
    for (int p : unit.param_ids()) {
      ZERO_REQUIRE(p >= 0 && p < num_params,
                   "stage model of " + model.name + ": Unit " + unit.name() + " names parameter " +
                       std::to_string(p) + " but the model has " + std::to_string(num_params));
      used[static_cast<size_t>(p)] = true;
    }
  }
  // Ascending original index: the view keeps the canonical order, so its engine lays out and
  // initialises the parameters as the whole model's would.
  std::vector<int> ids;
  for (int p = 0; p < num_params; ++p)
    if (used[static_cast<size_t>(p)]) ids.push_back(p);
  return ids;
}

StageModel stage_model(Model& model, const StageCut& cut, int stage) {
  StageModel view;
  view.to_original = stage_param_ids(model, cut, stage);
  std::vector<int> to_view(model.params.size(), -1);
  for (size_t i = 0; i < view.to_original.size(); ++i) {
    const int p = view.to_original[i];
    to_view[static_cast<size_t>(p)] = static_cast<int>(i);
    view.model.params.push_back(model.params[static_cast<size_t>(p)]);
  }
  view.model.sharded_activations = model.sharded_activations;
  view.model.name = model.name + " stage " + std::to_string(stage) + " of " +
                    std::to_string(cut.stages());
  for (int u = cut.begin(stage); u < cut.end(stage); ++u) {
    Unit& unit = *model.units[static_cast<size_t>(u)];
    std::vector<int> ids;
    for (int p : unit.param_ids()) ids.push_back(to_view[static_cast<size_t>(p)]);
    view.model.units.push_back(std::make_unique<StageUnit>(unit, std::move(ids)));
  }
  return view;
}

}  // namespace zero::pipeline
