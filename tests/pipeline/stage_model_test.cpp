// A stage's view of a model (runtime/pipeline/stage_model.hpp): for a tiny GPT cut every way
// into 1, 2 and 3 stages, each view holds exactly the parameters its Units use, in canonical
// order, the tied wte on the first and last stage; with one stage, an Engine over the view trains
// bitwise like one over the model; with two stages, the two views chained forward and backward
// give the model's loss and gradients bitwise (wte's as the sum of the two views').
//
// Why bitwise, not a tolerance: the adapters forward to the same Units on equal parameter
// values, so every kernel sees the same inputs in the same order. The one new operation is the
// sum of wte's two gradients. In the whole model the head's backward adds its contribution to a
// zeroed gradient (exact: 0 + h = h) and the embedding's backward then adds its own once per row
// of wte (one rounding: h + e; cpu::embedding_backward sums a row's positions before adding). In
// the views each stage's gradient holds one contribution exactly, so their fp32 sum h + e, in
// either order (fp32 addition is commutative), is that same rounding. With several micro-batches
// per step it would not be: the model adds h1 + e1 + h2 + e2 in that order, the views
// (h1 + h2) + (e1 + e2), which differ by roundings (the pipeline's tied-gradient sum).
#include "runtime/pipeline/stage_model.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <catch2/reporters/catch_reporter_event_listener.hpp>
#include <catch2/reporters/catch_reporter_registrars.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "collectives/communicator.hpp"
#include "core/device.hpp"
#include "core/error.hpp"
#include "core/world.hpp"
#include "models/gpt.hpp"
#include "models/gpt_flops.hpp"
#include "models/ops.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/models/model_runner.hpp"

using namespace zero;
using namespace zero::pipeline;
using Catch::Matchers::ContainsSubstring;

namespace {

const models::GptShape kTiny = *models::gpt_preset("tiny");
constexpr int64_t kB = 2, kT = 16;  // micro-batch: 2 sequences of 16 tokens (of tiny's 64)

struct Env {
  std::unique_ptr<Device> device = make_device(DeviceKind::cpu);
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<models::Ops> ops = models::make_ops(*device, *stream);
  Model make() { return models::make_gpt({kTiny, ScalarType::f32, ScalarType::f32}, *ops); }
};

StageCut cut_by(PartitionMethod method, const Model& model, int stages) {
  UnitCosts costs{.parameters = unit_parameter_counts(model), .flops = {}};
  for (const auto& f : models::gpt_unit_flops(kTiny, kTiny.seq_len)) costs.flops.push_back(f.total());
  return cut_stages(method, costs, stages);
}

int param_index(const Model& model, const std::string& name) {
  for (size_t p = 0; p < model.params.size(); ++p)
    if (model.params[p].name == name) return static_cast<int>(p);
  FAIL("no parameter " << name);
  return -1;
}

// Tokens and next-token targets of micro-batch `index` (a learnable pattern; any ids would do).
void batch_ids(int64_t index, std::vector<int32_t>& tok, std::vector<int32_t>& tgt) {
  tok.resize(kB * kT);
  tgt.resize(kB * kT);
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<int32_t>((index * 7 + static_cast<int64_t>(i) * 3) % kTiny.vocab_size);
    tgt[i] = (tok[i] * 5 + 1) % kTiny.vocab_size;
  }
}

// ---- MPI for the Engine: a world of one, finalised once after the last test case ----------

coll::Communicator& world_comm(Device& device) {
  static std::unique_ptr<coll::Communicator> comm;
  if (!comm) {
    if (!World::initialized()) World::init(nullptr, nullptr);
    comm = coll::make_mpi_communicator(World::get().comm(), device);
  }
  return *comm;
}

class FinalizeMpi : public Catch::EventListenerBase {
 public:
  using Catch::EventListenerBase::EventListenerBase;
  void testRunEnded(const Catch::TestRunStats&) override {
    if (World::initialized()) World::get().finalize();
  }
};
CATCH_REGISTER_LISTENER(FinalizeMpi)

// ---- Driving one view's Units on the cpu backend, holding its parameters and gradients ----

class ViewRunner {
 public:
  // Parameters initialised from the view's own specs (what an engine over the view does).
  ViewRunner(const Model& view, models::Ops& ops, test::ModelRunner& io, uint64_t seed)
      : view_(view), ops_(ops) {
    for (const ParamSpec& p : view.params) {
      std::vector<float> init(static_cast<size_t>(p.numel()));
      init_param_values(p, seed, 0, p.numel(), init.data());
      params_.push_back(Tensor::empty(ops.device(), p.shape, p.type, MemCategory::parameters));
      io.write(params_.back(), std::vector<double>(init.begin(), init.end()));
      grads_.push_back(Tensor::zeros(ops.device(), ops.stream(), p.shape, p.type,
                                     MemCategory::gradients));
    }
    ops.stream().synchronize();
  }

  // The stage's Units forward from `input` (empty on the first stage); the last Unit's output
  // (its loss on the last stage is in loss()).
  Tensor forward(const Batch& batch, Tensor input) {
    ctx_.clear();
    ctx_.resize(view_.units.size());
    for (size_t u = 0; u < view_.units.size(); ++u) {
      UnitContext& c = ctx_[u];
      c.batch = &batch;
      c.input = input;
      c.params = pick(params_, u);
      view_.units[u]->forward(c);
      input = c.output;
    }
    ops_.stream().synchronize();
    return input;
  }
  const Tensor& loss() const { return ctx_.back().loss; }

  // Joint backward (split = false) or every Unit's B then every W; returns the first Unit's
  // grad_input, what the previous stage's backward takes as grad_output.
  Tensor backward(Tensor grad_output, bool split) {
    for (size_t u = view_.units.size(); u-- > 0;) {
      UnitContext& c = ctx_[u];
      c.params = pick(params_, u);
      c.grads = pick(grads_, u);
      c.grad_output = grad_output;
      if (split) {
        view_.units[u]->backward_input(c);
      } else {
        view_.units[u]->backward(c);
      }
      grad_output = c.grad_input;
    }
    if (split)
      for (size_t u = view_.units.size(); u-- > 0;) view_.units[u]->backward_weight(ctx_[u]);
    ctx_.clear();
    ops_.stream().synchronize();
    ops_.check_errors();
    return grad_output;
  }
  const Tensor& grad(size_t i) const { return grads_.at(i); }

 private:
  std::vector<Tensor> pick(const std::vector<Tensor>& all, size_t unit) const {
    std::vector<Tensor> out;
    for (int p : view_.units[unit]->param_ids()) out.push_back(all.at(static_cast<size_t>(p)));
    return out;
  }
  const Model& view_;
  models::Ops& ops_;
  std::vector<Tensor> params_, grads_;
  std::vector<UnitContext> ctx_;
};

std::vector<uint32_t> bits(const std::vector<double>& v) {
  std::vector<uint32_t> out;
  for (double d : v) {
    const auto f = static_cast<float>(d);  // exact: the values were fp32
    uint32_t b = 0;
    std::memcpy(&b, &f, 4);
    out.push_back(b);
  }
  return out;
}

}  // namespace

TEST_CASE("stage model: each view holds exactly its Units' parameters, in canonical order") {
  Env env;
  Model model = env.make();
  const int wte = param_index(model, "wte.weight");
  for (PartitionMethod method :
       {PartitionMethod::uniform, PartitionMethod::parameters, PartitionMethod::flops}) {
    for (int stages = 1; stages <= 3; ++stages) {
      CAPTURE(method_name(method), stages);
      const StageCut cut = cut_by(method, model, stages);
      std::vector<int> holders(model.params.size(), 0);
      for (int s = 0; s < stages; ++s) {
        CAPTURE(s);
        StageModel view = stage_model(model, cut, s);
        REQUIRE(view.model.name ==
                model.name + " stage " + std::to_string(s) + " of " + std::to_string(stages));
        REQUIRE(view.to_original == stage_param_ids(model, cut, s));
        // Exactly the parameters the stage's Units use (computed here from the original Units),
        // ascending.
        std::vector<int> used;
        for (int u = cut.begin(s); u < cut.end(s); ++u)
          for (int p : model.units[static_cast<size_t>(u)]->param_ids()) used.push_back(p);
        std::sort(used.begin(), used.end());
        used.erase(std::unique(used.begin(), used.end()), used.end());
        REQUIRE(view.to_original == used);
        // Specs copied unchanged.
        REQUIRE(view.model.params.size() == view.to_original.size());
        for (size_t i = 0; i < view.to_original.size(); ++i) {
          const ParamSpec& a = view.model.params[i];
          const ParamSpec& b = model.params[static_cast<size_t>(view.to_original[i])];
          REQUIRE(a.name == b.name);
          REQUIRE(a.shape == b.shape);
          REQUIRE(a.type == b.type);
          REQUIRE(a.weight_decay == b.weight_decay);
          REQUIRE(a.init == b.init);
          REQUIRE(a.init_std == b.init_std);
          ++holders[static_cast<size_t>(view.to_original[i])];
        }
        // The adapters: the stage's Units in order, each forwarding its properties, with
        // param_ids that map back to the original Unit's, in the same order.
        REQUIRE(static_cast<int>(view.model.units.size()) == cut.size(s));
        for (int u = cut.begin(s); u < cut.end(s); ++u) {
          const Unit& orig = *model.units[static_cast<size_t>(u)];
          const Unit& adapted = *view.model.units[static_cast<size_t>(u - cut.begin(s))];
          REQUIRE(adapted.name() == orig.name());
          REQUIRE(adapted.checkpointable() == orig.checkpointable());
          REQUIRE(adapted.splits_backward() == orig.splits_backward());
          std::vector<int> back;
          for (int p : adapted.param_ids()) back.push_back(view.to_original.at(static_cast<size_t>(p)));
          const std::span<const int> ids = orig.param_ids();
          REQUIRE(back == std::vector<int>(ids.begin(), ids.end()));
        }
        const bool has_wte =
            std::find(view.to_original.begin(), view.to_original.end(), wte) != view.to_original.end();
        REQUIRE(has_wte == (s == 0 || s == stages - 1));
      }
      // Every parameter is on some stage; only wte is on two (when there are two or more).
      for (size_t p = 0; p < model.params.size(); ++p) {
        CAPTURE(model.params[p].name);
        REQUIRE(holders[p] == (static_cast<int>(p) == wte && stages > 1 ? 2 : 1));
      }
    }
  }
}

TEST_CASE("stage model: a cut of another model or a missing stage is a clear error") {
  Env env;
  Model model = env.make();
  REQUIRE_THROWS_WITH(stage_model(model, cut_uniform(3, 2), 0),
                      ContainsSubstring("covers 3 Units") && ContainsSubstring("model has 4 Units"));
  REQUIRE_THROWS_WITH(stage_model(model, cut_uniform(4, 2), 2),
                      ContainsSubstring("stage 2 does not exist") && ContainsSubstring("0..1"));
  REQUIRE_THROWS_AS(stage_param_ids(model, cut_uniform(4, 2), -1), Error);
}

TEST_CASE("stage model: with one stage an Engine over the view trains bitwise like the model") {
  Env env;
  coll::Communicator& comm = world_comm(*env.device);
  for (int zero_stage : {0, 3}) {
    CAPTURE(zero_stage);
    Model model = env.make();
    Model twin = env.make();  // the same Units, viewed
    StageModel view = stage_model(twin, cut_uniform(4, 1), 0);
    EngineOptions o;
    o.stage = zero_stage;
    o.adam.weight_decay = 0.01f;
    o.seed = 3;
    o.lr = [](int64_t) { return 1e-2f; };
    Engine a(model, *env.device, *env.stream, comm, o);
    Engine b(view.model, *env.device, *env.stream, comm, o);
    auto next = [&](int64_t step) {
      return [&env, step](int) {
        std::vector<int32_t> tok, tgt;
        batch_ids(step, tok, tgt);
        Batch batch;
        batch.inputs = Tensor::empty(*env.device, Shape{kB, kT}, ScalarType::i32, MemCategory::activations);
        batch.targets = Tensor::empty(*env.device, Shape{kB, kT}, ScalarType::i32, MemCategory::activations);
        std::memcpy(batch.inputs.data(), tok.data(), tok.size() * 4);
        std::memcpy(batch.targets.data(), tgt.data(), tgt.size() * 4);
        return batch;
      };
    };
    for (int64_t step = 0; step < 3; ++step) {
      const double la = a.step(next(step)).loss;
      const double lb = b.step(next(step)).loss;
      REQUIRE(la == lb);
    }
    for (size_t i = 0; i < view.to_original.size(); ++i) {
      CAPTURE(view.model.params[i].name);
      REQUIRE(a.parameter(view.to_original[i]) == b.parameter(static_cast<int>(i)));
    }
  }
}

TEST_CASE("stage model: two views chained give the model's loss and gradients bitwise") {
  Env env;
  Model model = env.make();
  const StageCut cut = cut_uniform(4, 2);  // [embedding, h.0] | [h.1, head]
  StageModel first = stage_model(model, cut, 0);
  StageModel last = stage_model(model, cut, 1);
  REQUIRE(tied_parameters(model, cut) ==
          std::vector<TiedParameter>{{param_index(model, "wte.weight"), {0, 1}}});

  constexpr uint64_t kSeed = 9;
  test::ModelRunner whole(model, *env.ops, kSeed);
  std::vector<int32_t> tok, tgt;
  batch_ids(4, tok, tgt);
  const Batch batch = whole.make_batch(Shape{kB, kT}, tok, Shape{kB, kT}, tgt);
  const double ref_loss = whole.forward_backward(batch);
  std::vector<std::vector<uint32_t>> ref_grads;
  for (size_t p = 0; p < model.params.size(); ++p) ref_grads.push_back(bits(whole.grad(p)));

  for (bool split : {false, true}) {
    CAPTURE(split);
    ViewRunner r0(first.model, *env.ops, whole, kSeed);
    ViewRunner r1(last.model, *env.ops, whole, kSeed);
    const Tensor boundary = r0.forward(batch, Tensor());
    r1.forward(batch, boundary);
    REQUIRE(bits(whole.read(r1.loss())) == bits({ref_loss}));
    const Tensor dboundary = r1.backward(Tensor(), split);
    REQUIRE(dboundary.defined());
    r0.backward(dboundary, split);

    // Each original parameter's gradient: the one view's, or (wte) the fp32 sum of the two.
    std::vector<std::vector<double>> from_views(model.params.size());
    for (const auto* v : {&first, &last}) {
      ViewRunner& r = v == &first ? r0 : r1;
      for (size_t i = 0; i < v->to_original.size(); ++i) {
        const std::vector<double> g = whole.read(r.grad(i));
        std::vector<double>& sum = from_views[static_cast<size_t>(v->to_original[i])];
        if (sum.empty()) {
          sum = g;
        } else {
          for (size_t e = 0; e < g.size(); ++e)
            sum[e] = static_cast<double>(static_cast<float>(sum[e]) + static_cast<float>(g[e]));
        }
      }
    }
    for (size_t p = 0; p < model.params.size(); ++p) {
      CAPTURE(model.params[p].name);
      REQUIRE(bits(from_views[p]) == ref_grads[p]);
    }
  }
}
