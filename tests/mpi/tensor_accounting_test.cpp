// Issue 19's memory and communication figures for the tensor-parallel GPT, measured, on a world
// that is one tensor group (2 or 4 ranks; with 4 also 2 tensor x 2 pipeline):
//
// Memory. Every rank of a tensor group holds its slices plus the replicated parameters (the
// LayerNorms, the row-split matrices' biases, wpe): per rank (N - R) / T + R elements for a
// model of N with R replicated (over P stages: each stage's share), which the test derives from
// the whole model's table (make_gpt), not from the sliced one. The device ledger's "parameters"
// bytes, allocated by the Engine, are that many elements of the parameter type plus the
// partition's alignment padding (fewer than kAlignElems per parameter).
//
// Communication. The bytes each rank sends on the tensor communicator in one optimizer step,
// counted at the communicator (coll::CountingCommunicator, ring-algorithm volume), equal the
// model's formula (models::gpt_tensor_parallel_traffic) per micro-batch times the micro-batches,
// plus the engine's norm exchange; and one more transformer block adds exactly Megatron's
// 4 x 2 (T-1)/T x b s h x bytes per micro-batch (2 all-reduces forward, 2 backward), 6 with
// activation checkpointing (the recomputed forward repeats its two). With sequence parallelism
// (Korthikanti et al.; Megatron-LM's implementation) each all-reduce becomes a reduce-scatter and
// an all-gather, (T-1)/T x b s h x bytes each, and backward re-gathers the two LayerNorm
// outputs it kept as shards: 10 of them per layer, 12 checkpointed (the recompute's 4 replace
// the re-gathers), plus the two replicated LayerNorms' [2, h] gradient all-reduces.
#include <catch2/catch_test_macros.hpp>

#include <cstring>
#include <memory>
#include <vector>

#include "collectives/counting.hpp"
#include "collectives/grid.hpp"
#include "core/world.hpp"
#include "models/gpt.hpp"
#include "models/gpt_tensor_parallel.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/partition.hpp"
#include "runtime/engine/pipeline_stage.hpp"
#include "runtime/pipeline/schedule.hpp"
#include "runtime/pipeline/stage_partition.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;

namespace {

constexpr int kGa = 2;
constexpr int64_t kB = 2, kS = 8;

models::GptShape shape(int layers) { return {layers, 32, 4, 16, static_cast<int>(kS)}; }

Batch make_batch(Device& dev, int64_t index) {
  Batch b;
  std::vector<int32_t> tok(kB * kS), tgt(kB * kS);
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<int32_t>((index * 5 + static_cast<int64_t>(i) * 3) % 16);
    tgt[i] = (tok[i] + 1) % 16;
  }
  b.inputs = Tensor::empty(dev, Shape{kB, kS}, ScalarType::i32, MemCategory::activations);
  b.targets = Tensor::empty(dev, Shape{kB, kS}, ScalarType::i32, MemCategory::activations);
  std::memcpy(b.inputs.data(), tok.data(), tok.size() * 4);
  std::memcpy(b.targets.data(), tgt.data(), tgt.size() * 4);
  return b;
}

// Replicated in the tensor-parallel model: whole on every tensor rank (not cut by the degree).
bool replicated(const std::string& name) {
  return name.ends_with("ln_1.weight") || name.ends_with("ln_1.bias") || name.ends_with("ln_2.weight") ||
         name.ends_with("ln_2.bias") || name.ends_with("attn.c_proj.bias") || name.ends_with("mlp.c_proj.bias") ||
         name == "wpe.weight" || name == "ln_f.weight" || name == "ln_f.bias";
}

struct Measured {
  double tensor_bytes = 0;  // one step's, counted at the tensor communicator
  int64_t activation_peak = 0;  // the step's peak of the ledger's activations
  int64_t param_ledger = 0;  // the device ledger's parameters bytes with the Engine built
  int64_t param_elems = 0;   // this rank's model's (or stage view's) parameter elements
  int params = 0;            // their number (each starts aligned: the padding bound)
};

Measured run(int layers, int pipeline, bool remat, ScalarType type, bool partition = false, bool sp = false) {
  coll::Communicator& world = *test::env().comm;
  Device& dev = *test::env().device;
  coll::ProcessGrid grid(world, coll::grid_shape_for(world.size(), pipeline, world.size() / pipeline));
  coll::CountingCommunicator tensor(grid.tensor());
  auto stream = dev.create_stream("compute");
  auto ops = models::make_ops(dev, *stream);
  Model model = models::make_gpt_tensor_parallel({shape(layers), type, ScalarType::f32, sp}, *ops, tensor);
  EngineOptions o;
  o.stage = 1;
  o.gradient_accumulation_steps = kGa;
  o.param_type = type;
  o.gradient_clipping = 1.0f;
  if (remat) o.number_checkpoints = 1000;
  o.partition_activations = partition;
  const int64_t before = dev.ledger().snapshot().by_category[0][static_cast<size_t>(MemCategory::parameters)].current;
  std::optional<engine::PipelineStage> st;
  std::unique_ptr<Engine> engine;
  Measured m;
  if (pipeline > 1) {
    st.emplace(engine::make_pipeline_stage(model, pipeline::cut_uniform(static_cast<int>(model.units.size()), pipeline),
                                           grid.pipeline()));
    engine = std::make_unique<Engine>(st->view.model, dev, *stream, grid.data(), o, st->place, TensorPlace{&tensor});
  } else {
    engine = std::make_unique<Engine>(model, dev, *stream, grid.data(), o, PipelinePlace{}, TensorPlace{&tensor});
  }
  m.param_ledger = dev.ledger().snapshot().by_category[0][static_cast<size_t>(MemCategory::parameters)].current - before;
  for (const ParamSpec& p : (st ? st->view.model : model).params) {
    m.param_elems += p.numel();
    ++m.params;
  }
  tensor.reset();
  dev.ledger().reset_peaks();
  auto next = [&](int mb) { return make_batch(dev, mb); };
  if (st) engine->pipeline_step(pipeline::one_f_one_b(pipeline, kGa, grid.coord().pipeline), next);
  else engine->step(next);
  m.tensor_bytes = tensor.traffic().ring_bytes();
  stream->synchronize();
  m.activation_peak = static_cast<int64_t>(
      dev.ledger().snapshot().by_category[0][static_cast<size_t>(MemCategory::activations)].peak);
  return m;
}

}  // namespace

TEST_CASE("tensor slicing: per-rank parameter bytes are the model's over T plus the replicated ones", "[tensor]") {
  const int T = test::env().comm->size();
  for (ScalarType type : {ScalarType::f32, ScalarType::bf16}) {
    const Measured m = run(2, 1, false, type);
    // From the whole model's table: N and R.
    auto stream = test::env().device->create_stream("compute");
    auto ops = models::make_ops(*test::env().device, *stream);
    const Model whole = models::make_gpt({shape(2), type, ScalarType::f32}, *ops);
    int64_t N = 0, R = 0;
    for (const ParamSpec& p : whole.params) {
      N += p.numel();
      if (replicated(p.name)) R += p.numel();
    }
    INFO("T " << T << ", " << to_string(type) << ": N " << N << ", R " << R << ", held " << m.param_elems
              << ", ledger " << m.param_ledger << " bytes");
    CHECK(m.param_elems == (N - R) / T + R);
    const int64_t e = type == ScalarType::f32 ? 4 : 2;
    CHECK(m.param_ledger >= e * m.param_elems);
    CHECK(m.param_ledger < e * (m.param_elems + int64_t{m.params} * Partition::kAlignElems));
  }
}

TEST_CASE("tensor slicing: the bytes sent per layer are Megatron's, counted at the communicator", "[tensor]") {
  const int T = test::env().comm->size();
  const double ring = 2.0 * (T - 1) / T;
  for (bool remat : {false, true}) {
    const Measured two = run(2, 1, remat, ScalarType::f32), three = run(3, 1, remat, ScalarType::f32);
    const double per_layer = three.tensor_bytes - two.tensor_bytes;
    const double megatron = (remat ? 6 : 4) * ring * double(kB * kS * 32) * 4 * kGa;
    INFO("T " << T << (remat ? ", checkpointed" : "") << ": per layer " << per_layer << " bytes, Megatron "
              << megatron);
    CHECK(per_layer == megatron);
    // The whole step: the model's formula per micro-batch, and the engine's norm exchange (an
    // all-gather of one (squared norm, loss) pair of doubles per rank: 16 bytes each).
    const models::TensorParallelTraffic f = models::gpt_tensor_parallel_traffic(
        {shape(2), ScalarType::f32, ScalarType::f32}, T, kB, kS, remat ? 2 : 0);
    CHECK(two.tensor_bytes == f.wire_bytes() * kGa + double(T - 1) / T * 16 * T);
  }
}

TEST_CASE("sequence parallelism: the bytes sent per layer are Megatron's, counted at the communicator", "[tensor]") {
  const int T = test::env().comm->size();
  const double half_ring = double(T - 1) / T;  // a reduce-scatter's or an all-gather's share
  for (bool remat : {false, true}) {
    const Measured two = run(2, 1, remat, ScalarType::f32, false, true);
    const Measured three = run(3, 1, remat, ScalarType::f32, false, true);
    const double per_layer = three.tensor_bytes - two.tensor_bytes;
    const double layernorms = 2 * 2 * half_ring * double(2 * 32 * 4);  // two all-reduces of [2, h] fp32
    const double megatron = ((remat ? 12 : 10) * half_ring * double(kB * kS * 32) * 4 + layernorms) * kGa;
    INFO("T " << T << (remat ? ", checkpointed" : "") << ": per layer " << per_layer << " bytes, Megatron "
              << megatron);
    CHECK(per_layer == megatron);
    const models::TensorParallelTraffic f = models::gpt_tensor_parallel_traffic(
        {shape(2), ScalarType::f32, ScalarType::f32, true}, T, kB, kS, remat ? 2 : 0);
    CHECK(two.tensor_bytes == f.wire_bytes() * kGa + double(T - 1) / T * 16 * T);
  }
}

TEST_CASE("tensor x pipeline: each stage holds its share over T", "[tensor]") {
  const int W = test::env().comm->size();
  if (W != 4) SKIP("2 tensor x 2 pipeline needs 4 ranks");
  const Measured m = run(2, 2, false, ScalarType::f32);
  CHECK(m.param_elems > 0);
  // Stage 0 (embedding, h.0) or stage 1 (h.1, head): either way well under the model's half.
  auto stream = test::env().device->create_stream("compute");
  auto ops = models::make_ops(*test::env().device, *stream);
  const Model whole = models::make_gpt({shape(2), ScalarType::f32, ScalarType::f32}, *ops);
  int64_t N = 0;
  for (const ParamSpec& p : whole.params) N += p.numel();
  CHECK(m.param_elems * 2 * 2 < N + N / 4);  // (N - R) / (T P) + R per rank, R small
}

// partition_activations keeps 1/T of each checkpointed block's input, so the ledger's activation
// peak falls by (T-1)/T of the kept inputs. Here 24 checkpointed blocks (Engine::step runs each
// micro-batch's forward then backward: one micro-batch's 24 inputs of b s C x 4 bytes are kept at
// once). Allowed: 18 of the 24 inputs' share, since a whole input is released only once the
// compute stream has passed its copy and the host enqueues a few Units ahead of the stream, and
// the recomputation holds one gathered input. Measured: 20 of 24 (T = 2), 21 of 24 (T = 4).
// Before the copy's source was held by the stream, this test's sibling in
// tensor_equivalence_test caught the copy reading freed memory (parameters off by 4e-2).
TEST_CASE("partition_activations lowers the activation peak", "[tensor]") {
  const int T = test::env().comm->size();
  const Measured whole = run(24, 1, true, ScalarType::f32), split = run(24, 1, true, ScalarType::f32, true);
  const int64_t saved = 24 * kB * kS * 32 * 4 * (T - 1) / T;
  INFO("T " << T << ": activation peak " << whole.activation_peak << " bytes plain, " << split.activation_peak
            << " partitioned; the kept inputs' share " << saved);
  CHECK(split.activation_peak < whole.activation_peak);
  CHECK(whole.activation_peak - split.activation_peak >= saved * 18 / 24);
  CHECK(split.tensor_bytes > whole.tensor_bytes);  // the all-gathers are the price
}
