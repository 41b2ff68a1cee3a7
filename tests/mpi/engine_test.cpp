// The ZeRO engine's central promise: switching stage or world size does not change training.
// Every rank also trains a reference on a world of its own: stage 0, one rank, W times the
// gradient accumulation, seeing the same micro-batches (rank r's m-th micro-batch of a step is
// the reference's (r * GA + m)-th). Then the losses and the final parameters are compared.
//
// Bitwise or bounded (why): the collectives add ranks in rank order in fp32 and round once, and
// a Unit adds its fp32 contribution to an fp32 gradient with one rounding, so with fp32
// parameters, one micro-batch per rank, no tied parameters and clipping inactive, the reduced
// gradient is exactly the reference's sequential sum at every stage, and so is everything after
// it: bitwise. With accumulation (the sums associate differently: per rank then over ranks, or
// at stage 2/3 over ranks then micro-batches), active clipping (the norm is summed per shard),
// tied parameters (the GPT's wte gets two adds per micro-batch) or 16-bit gradients, results
// differ by roundings; AdamW's normalised update carries a relative gradient difference d into
// a parameter difference of about lr * d per step, far below the bounds used here.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "models/gpt.hpp"
#include "models/mlp.hpp"
#include "core/world.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;

namespace {

struct Run {
  std::vector<std::vector<float>> params;
  std::vector<double> losses;  // per step: mean over all ranks' micro-batches
  int skipped = 0;             // steps skipped for fp16 overflow
};

struct Setup {
  bool gpt = false;
  int stage = 0;
  int ga = 1;
  ScalarType type = ScalarType::f32;
  float clip = 1e6f;  // inactive unless set low
  std::optional<optim::LossScalerOptions> scaler = std::nullopt;
  // Communication options (EngineOptions); DeepSpeed's defaults unless a test sets them.
  bool overlap = true;
  int64_t reduce_bucket = 500'000'000, prefetch = 50'000'000, max_live = 1'000'000'000;
  int64_t persistence = 0;
  bool timers = false;
};

constexpr int kSteps = 20;
constexpr int kMicro = 8;  // samples (MLP) per micro-batch
// The MLP's 1,037 parameters divide by none of 2, 3 and 4 (and no group's size by the world
// size): the partitioner's padding is exercised at every world size.
const models::MlpShape kMlp{12, 24, 2, 5};
const models::GptShape kGpt{2, 16, 2, 13, 8};

Batch make_batch(Device& dev, bool gpt, int64_t index) {
  Batch b;
  if (gpt) {
    std::vector<int32_t> tok(16), tgt(16);
    for (size_t i = 0; i < tok.size(); ++i) {
      tok[i] = static_cast<int32_t>((index * 7 + static_cast<int64_t>(i) * 3) % 13);
      tgt[i] = (tok[i] * 2 + 1) % 13;  // a learnable next token
    }
    b.inputs = Tensor::empty(dev, Shape{2, 8}, ScalarType::i32, MemCategory::activations);
    b.targets = Tensor::empty(dev, Shape{2, 8}, ScalarType::i32, MemCategory::activations);
    std::memcpy(b.inputs.data(), tok.data(), tok.size() * 4);
    std::memcpy(b.targets.data(), tgt.data(), tgt.size() * 4);
    return b;
  }
  static const models::MlpTeacherTask task(kMlp, 11);
  std::vector<float> feat;
  std::vector<int32_t> labels;
  task.batch(index * kMicro, kMicro, feat, labels);
  b.inputs = Tensor::empty(dev, Shape{kMicro, kMlp.in_features}, ScalarType::f32, MemCategory::activations);
  b.targets = Tensor::empty(dev, Shape{kMicro}, ScalarType::i32, MemCategory::activations);
  std::memcpy(b.inputs.data(), feat.data(), feat.size() * 4);
  std::memcpy(b.targets.data(), labels.data(), labels.size() * 4);
  return b;
}

// Trains with `comm`; `data_rank` picks this run's share of each step's micro-batches.
Run train(coll::Communicator& comm, int data_rank, const Setup& s) {
  Device& dev = *test::env().device;
  auto stream = dev.create_stream("compute");
  auto ops = models::make_ops(dev, *stream);
  Model model = s.gpt ? models::make_gpt({kGpt, s.type, ScalarType::f32}, *ops)
                      : models::make_mlp({kMlp, s.type, ScalarType::f32}, *ops);
  EngineOptions o;
  o.stage = s.stage;
  o.gradient_accumulation_steps = s.ga;
  o.param_type = s.type;
  o.adam.weight_decay = 0.01f;
  o.gradient_clipping = s.clip;
  o.lr = [](int64_t t) { return 1e-2f * std::min(1.0f, static_cast<float>(t) / 5.0f); };
  o.seed = 5;
  o.loss_scaler = s.scaler;
  o.overlap_comm = s.overlap;
  o.reduce_bucket_size = s.reduce_bucket;
  o.prefetch_bucket_size = s.prefetch;
  o.max_live_parameters = s.max_live;
  o.param_persistence_threshold = s.persistence;
  o.timers = s.timers;
  Engine engine(model, dev, *stream, comm, o);
  Run run;
  for (int step = 0; step < kSteps; ++step) {
    const StepStats st = engine.step([&](int m) {
      return make_batch(dev, s.gpt, int64_t{step} * 1000 + int64_t{data_rank} * s.ga + m);
    });
    float loss = static_cast<float>(st.loss) / static_cast<float>(comm.size());
    comm.all_reduce(&loss, &loss, 1, DType::f32, coll::ReduceOp::sum).wait();
    run.losses.push_back(loss);
    run.skipped += st.applied ? 0 : 1;
  }
  for (int p = 0; p < static_cast<int>(model.params.size()); ++p) run.params.push_back(engine.parameter(p));
  return run;
}

// The reference: stage 0 on a world of one, W x GA micro-batches per step.
Run reference(const Setup& s) {
  coll::Communicator& comm = *test::env().comm;
  auto alone = comm.split(comm.rank(), 0);
  Setup r = s;
  r.stage = 0;
  r.ga = s.ga * comm.size();
  return train(*alone, 0, r);
}

// ||a - b|| / ||b|| over all parameter elements (an elementwise bound would be meaningless: an
// element whose gradient is rounding noise gets Adam steps of order lr in either direction).
// Skipped: the GPT's key biases (c_attn.bias elements [C, 2C)), whose exact gradient is zero
// (q . b_k is the same for every key and softmax ignores a constant): they hold nothing but
// Adam-amplified rounding noise, different for any two summation orders.
double rel_l2_diff(const Run& a, const Run& b, const Model* gpt) {
  double num = 0, den = 0;
  for (size_t p = 0; p < b.params.size(); ++p) {
    const bool key_bias = gpt && gpt->params[p].name.ends_with("attn.c_attn.bias");
    for (size_t i = 0; i < b.params[p].size(); ++i) {
      if (key_bias && i >= size_t(kGpt.n_embd) && i < size_t(2 * kGpt.n_embd)) continue;
      const double d = double(a.params[p][i]) - b.params[p][i];
      num += d * d;
      den += double(b.params[p][i]) * b.params[p][i];
    }
  }
  return std::sqrt(num / den);
}

void compare(const Setup& base, bool bitwise, double param_tol) {
  coll::Communicator& comm = *test::env().comm;
  const Run ref = reference(base);
  // The parameter names, for max_rel_diff.
  auto stream = test::env().device->create_stream("names");
  auto ops = models::make_ops(*test::env().device, *stream);
  const Model gpt = models::make_gpt({kGpt, base.type, ScalarType::f32}, *ops);
  const Model* names = base.gpt ? &gpt : nullptr;
  for (int stage = 0; stage <= 3; ++stage) {
    Setup s = base;
    s.stage = stage;
    const Run got = train(comm, comm.rank(), s);
    INFO("stage " << stage << " on " << comm.size() << " rank(s), ga " << s.ga << ", "
                  << to_string(s.type) << (s.gpt ? ", gpt" : ", mlp") << ": final loss "
                  << got.losses.back() << " vs reference " << ref.losses.back()
                  << ", relative L2 parameter difference " << rel_l2_diff(got, ref, names));
    // It trains at all: the last five steps' mean loss below the first five's (each step sees
    // new data, so single losses are noisy).
    const auto mean5 = [&](int from) {
      double m = 0;
      for (int t = from; t < from + 5; ++t) m += ref.losses[static_cast<size_t>(t)] / 5;
      return m;
    };
    CHECK(mean5(kSteps - 5) < 0.95 * mean5(0));
    CHECK(got.skipped == ref.skipped);  // overflow is decided on the same (global) gradient
    for (int t = 0; t < kSteps; ++t)  // the mean of the same losses, summed in another order
      CHECK(std::abs(got.losses[t] - ref.losses[t]) <= 1e-5 * std::abs(ref.losses[t]) + (bitwise ? 1e-6 : param_tol));
    if (bitwise) {
      for (size_t p = 0; p < ref.params.size(); ++p) CHECK(got.params[p] == ref.params[p]);
    } else {
      CHECK(rel_l2_diff(got, ref, names) <= param_tol);
    }
  }
}

}  // namespace

TEST_CASE("engine: fp32, one micro-batch per rank: every stage is bitwise the 1-rank run") {
  compare({.gpt = false, .ga = 1, .type = ScalarType::f32}, true, 0);
}

// Bucketing, prefetching, persistence, overlap and the timers change when collectives run and
// which buffers hold what, never the arithmetic: still bitwise. (The MLP's groups hold 192-768
// elements, padded for N ranks, so these sizes give one reduction in flight, a prefetch of one
// Unit, and a mix of persistent and partitioned groups.)
TEST_CASE("engine: communication options change nothing: bitwise, every stage") {
  const Setup base{.gpt = false, .ga = 1, .type = ScalarType::f32};
  SECTION("collectives waited for at once (overlap_comm false)") {
    Setup s = base;
    s.overlap = false;
    compare(s, true, 0);
  }
  SECTION("one reduction in flight, no prefetch, nothing gathered ahead") {
    Setup s = base;
    s.reduce_bucket = 1;
    s.prefetch = 0;
    s.max_live = 0;
    compare(s, true, 0);
  }
  SECTION("prefetch of about one Unit, small groups persistent, timers on") {
    Setup s = base;
    s.reduce_bucket = 700;
    s.prefetch = 700;
    s.max_live = 1400;
    s.persistence = 400;
    s.timers = true;
    compare(s, true, 0);
  }
}

// Measured on 1-4 ranks: relative L2 differences up to 6e-8 (fp32 MLP), 7e-4 (bf16: each
// micro-batch's gradient is rounded to 8 bits before it is summed, in a stage-dependent order),
// 2e-7 (GPT). (On unlearnable random targets the GPT's gradients hover near zero and the
// difference grew to 6e-5: Adam amplifies noise-level gradients.) The bounds leave a factor of
// 4 to 16 for other CPUs' BLAS kernels.
TEST_CASE("engine: one micro-batch per rank with active clipping: fp32 within 1e-6, bf16 3e-3") {
  // The norm is summed per shard, then over ranks: its rounding differs, so does the clip
  // coefficient, by an ulp or so.
  compare({.gpt = false, .ga = 1, .type = ScalarType::f32, .clip = 0.05f}, false, 1e-6);
  compare({.gpt = false, .ga = 1, .type = ScalarType::bf16, .clip = 0.05f}, false, 3e-3);
}

TEST_CASE("engine: fp32 with accumulation 3 and active clipping: every stage within 1e-6") {
  compare({.gpt = false, .ga = 3, .type = ScalarType::f32, .clip = 0.05f}, false, 1e-6);
}

TEST_CASE("engine: bf16 parameters with accumulation 3 and clipping: every stage within 3e-3") {
  compare({.gpt = false, .ga = 3, .type = ScalarType::bf16, .clip = 0.05f}, false, 3e-3);
}

TEST_CASE("engine: the GPT (tied embedding) with accumulation 3 and clipping: within 2e-6") {
  compare({.gpt = true, .ga = 3, .type = ScalarType::f32, .clip = 0.5f}, false, 2e-6);
}

TEST_CASE("engine: fp16 with dynamic loss scaling skips the same steps at every stage") {
  // Starting at 2^20 the scaled fp16 gradients overflow: the first steps are skipped and the
  // scale halves (hysteresis 2) until they fit, on every stage and world size alike. The
  // parameters then agree within the bf16 case's bound (measured up to 3.2e-4). One micro-batch
  // per rank: with accumulation, stage 0/1 sum the micro-batches in fp16 while stage 2/3 sum
  // them in fp32, and in this setting (scaled gradients near fp16's range) the two differ by ~5%
  // (the fp32 sum is the accurate one; see the session notes).
  optim::LossScalerOptions ls;
  ls.enabled = true;
  ls.initial_scale_power = 20;
  ls.loss_scale_window = 5;
  const Setup s{.gpt = false, .ga = 1, .type = ScalarType::f16, .clip = 0.05f, .scaler = ls};
  compare(s, false, 3e-3);
  CHECK(reference(s).skipped >= 1);
}

// EngineOptions::weight_decay_all (zero_train.weight_decay_applies_to "all"): after one AdamW
// step from the same weights and data, a parameter the model declares decayed (the GPT's
// matrices) is bitwise the same either way, and every other one (biases, LayerNorm gains) ends
// lr x weight_decay x p0 lower with "all": decoupled decay p -= lr*wd*p comes before the Adam
// update, which is the same in both runs (same gradients). Tolerance 1e-6 absolute: the two
// runs round p - lr*wd*p - update in a different order, a few fp32 ulps of |p| <= 2, while the
// decay itself is 5e-3 x p0 (>= 5e-3 for the gains, which start at 1).
TEST_CASE("engine: weight decay applies to the declared parameters, or to all of them") {
  coll::Communicator& comm = *test::env().comm;
  Device& dev = *test::env().device;
  for (const int stage : {0, 2, 3}) {
    for (const bool offload : {false, true}) {
      if (offload && stage == 0) continue;
      CAPTURE(stage, offload);
      const auto one_step = [&](bool all, std::vector<std::vector<float>>* before) {
        auto stream = dev.create_stream("compute");
        auto ops = models::make_ops(dev, *stream);
        Model model = models::make_gpt({kGpt, ScalarType::f32, ScalarType::f32}, *ops);
        EngineOptions o;
        o.stage = stage;
        o.offload_optimizer = offload;
        o.adam.weight_decay = 0.5f;
        o.weight_decay_all = all;
        o.lr = [](int64_t) { return 1e-2f; };
        o.gradient_clipping = 0.0f;
        o.seed = 5;
        Engine engine(model, dev, *stream, comm, o);
        if (before)
          for (int p = 0; p < static_cast<int>(model.params.size()); ++p)
            before->push_back(engine.parameter(p));
        engine.step([&](int) { return make_batch(dev, true, comm.rank()); });
        std::vector<std::vector<float>> after;
        for (int p = 0; p < static_cast<int>(model.params.size()); ++p) after.push_back(engine.parameter(p));
        return std::make_pair(std::move(after), std::move(model.params));
      };
      std::vector<std::vector<float>> p0;
      const auto [declared, specs] = one_step(false, &p0);
      const auto [all, unused] = one_step(true, nullptr);
      int undeclared = 0;
      for (size_t p = 0; p < specs.size(); ++p) {
        CAPTURE(specs[p].name);
        if (specs[p].weight_decay) {
          CHECK(std::memcmp(declared[p].data(), all[p].data(), all[p].size() * sizeof(float)) == 0);
          continue;
        }
        ++undeclared;
        double worst = 0;
        for (size_t i = 0; i < all[p].size(); ++i)
          worst = std::max(worst, std::fabs((double(declared[p][i]) - all[p][i]) - 5e-3 * p0[p][i]));
        CHECK(worst <= 1e-6);
      }
      CHECK(undeclared >= 4);  // ln_1, ln_2, ln_f gains and the biases of the tiny GPT
    }
  }
}

namespace {

// A Unit that throws from its backward when armed: the `fail_at`-th backward from now (0: the
// next one), once; otherwise it is the wrapped Unit.
class FailingUnit final : public Unit {
 public:
  explicit FailingUnit(std::unique_ptr<Unit> u) : u_(std::move(u)) {}
  const std::string& name() const noexcept override { return u_->name(); }
  std::span<const int> param_ids() const noexcept override { return u_->param_ids(); }
  bool checkpointable() const noexcept override { return u_->checkpointable(); }
  void forward(UnitContext& ctx) override { u_->forward(ctx); }
  void backward(UnitContext& ctx) override { trip(); u_->backward(ctx); }
  bool splits_backward() const noexcept override { return u_->splits_backward(); }
  void backward_input(UnitContext& ctx) override { trip(); u_->backward_input(ctx); }
  void backward_weight(UnitContext& ctx) override { u_->backward_weight(ctx); }
  int fail_at = -1;

 private:
  void trip() {
    if (fail_at >= 0 && fail_at-- == 0) throw std::runtime_error("injected failure in " + name() + "'s backward");
  }
  std::unique_ptr<Unit> u_;
};

}  // namespace

// A step that throws half-way through a backward (a Unit's error, an out-of-memory) leaves the
// model as it was, and the next step sums only its own gradients: the run that failed a step
// and then went on is bitwise the run that never failed. The failure comes in micro-batch 1 of
// 3, in h.0's backward: micro-batch 0's gradients are in the step's sums, the head's and h.1's
// of micro-batch 1 in the full buffers (stage 0/1), the pooled ones, a reduction in flight or
// the host accumulator (stage 2/3, offload), and the tied wte/head gradient half summed.
TEST_CASE("engine: a step that throws mid-backward leaves no trace in the next step, every stage") {
  coll::Communicator& comm = *test::env().comm;
  Device& dev = *test::env().device;
  struct Case {
    int stage;
    bool offload, offload_param;
  };
  const Case cases[] = {{0, false, false}, {1, false, false}, {2, false, false}, {3, false, false},
                        {1, true, false},  {2, true, false},  {3, true, false},  {3, true, true}};
  for (ScalarType type : {ScalarType::f32, ScalarType::bf16})
    for (const Case& c : cases) {
      auto run = [&](bool fail) {
        auto stream = dev.create_stream("compute");
        auto ops = models::make_ops(dev, *stream);
        Model model = models::make_gpt({kGpt, type, ScalarType::f32}, *ops);
        FailingUnit* failing = nullptr;
        for (auto& u : model.units)
          if (u->name() == "h.0") {
            auto f = std::make_unique<FailingUnit>(std::move(u));
            failing = f.get();
            u = std::move(f);
          }
        REQUIRE(failing);
        EngineOptions o;
        o.stage = c.stage;
        o.offload_optimizer = c.offload;
        o.offload_param = c.offload_param;
        o.gradient_accumulation_steps = 3;
        o.param_type = type;
        o.adam.weight_decay = 0.01f;
        o.lr = [](int64_t) { return 1e-2f; };
        o.seed = 5;
        Engine engine(model, dev, *stream, comm, o);
        auto batches = [&](int step) {
          return [&, step](int m) { return make_batch(dev, true, int64_t{step} * 1000 + comm.rank() * 3 + m); };
        };
        Run r;
        for (int step = 0; step < 4; ++step) {
          if (fail && step == 1) {
            failing->fail_at = 1;  // micro-batch 1's backward of h.0, on every rank alike
            CHECK_THROWS_WITH(engine.step(batches(step)), Catch::Matchers::Equals("injected failure in h.0's backward"));
            CHECK(engine.steps_taken() == 1);
          }
          r.losses.push_back(engine.step(batches(step)).loss);
        }
        for (int p = 0; p < static_cast<int>(model.params.size()); ++p) r.params.push_back(engine.parameter(p));
        return r;
      };
      INFO("stage " << c.stage << (c.offload ? " + offload_optimizer" : "") << (c.offload_param ? " + offload_param" : "")
                    << ", " << to_string(type) << ", " << comm.size() << " rank(s)");
      const Run failed = run(true), plain = run(false);
      CHECK(failed.losses == plain.losses);
      for (size_t p = 0; p < plain.params.size(); ++p) CHECK(failed.params[p] == plain.params[p]);
    }
}
