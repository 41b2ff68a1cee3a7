// Engine::pipeline_evaluate: forward-only evaluation through the pipeline's stages, the pipeline
// counterpart of evaluate.cpp. Nothing changes and no activation is kept for a backward.
//
// The boundary activation travels exactly as in Engine::pipeline_step (pipeline_step.cpp): a
// header of kPipeHeader int32 words (scalar type, rank, dims), then the data, both from the same
// sender to the same receiver so they match in order. Evaluation is not on the hot path, so each
// transfer is waited for at once (the stages run one after the other: a pipeline of one
// micro-batch, which is what a held-out forward is).
//
// The result (the loss, and with `argmax` the last stage's argmax tokens) is computed on the
// last stage and broadcast over the pipeline communicator, so every stage returns the same: two
// broadcasts, a small header (the loss's 8 bytes and the row count) then the rows. The
// communicator moves device buffers (NCCL on cuda), hence the staging tensors; int32 and double
// words go as fp32 elements of the same size (a broadcast copies bits).
#include <algorithm>
#include <cstring>
#include <optional>

#include "runtime/engine/engine_state.hpp"

namespace zero {
namespace {

using engine::kPipeHeader;

}  // namespace

double Engine::pipeline_evaluate(const Batch& batch, std::vector<int32_t>* argmax) {
  State& s = *s_;
  engine::Context& x = s.x;
  ZERO_REQUIRE(x.place.active(), "Engine::pipeline_evaluate: this Engine was built without a "
                                 "PipelinePlace (engine::make_pipeline_stage); use Engine::evaluate");
  coll::Communicator& pipe = *x.place.pipe;
  const int prev_rank = x.place.prev(), next_rank = x.place.next();
  const bool first = prev_rank < 0, last = next_rank < 0;
  const std::string where = "pipeline evaluation (pipeline rank " + std::to_string(pipe.rank()) + ")";
  try {
    // The stage's input: the batch's tokens on the first stage, else the previous stage's output.
    Tensor carry;
    if (!first) {
      Tensor header = Tensor::empty(x.dev, Shape{kPipeHeader}, ScalarType::i32, MemCategory::activations);
      // After the compute stream's point: the buffers are stream-ordered allocations on the
      // compute stream (cuda: cudaMallocAsync), not ours until that stream has reached them.
      pipe.recv(header.data(), kPipeHeader, DType::f32, prev_rank, x.compute_point()).wait();
      int32_t h[kPipeHeader];
      copy_to_host(x.dev, x.compute, h, header);
      x.compute.synchronize();
      const engine::PipeBoundary got = engine::decode_header(h, where, prev_rank);
      carry = Tensor::empty(x.dev, got.shape, got.type, MemCategory::activations);
      const std::optional<DType> wire = to_dtype(carry.type());
      ZERO_REQUIRE(wire.has_value(), where + ": the activation is not fp32/bf16/fp16");
      pipe.recv(carry.data(), static_cast<size_t>(carry.numel()), *wire, prev_rank, x.compute_point()).wait();
    }

    const size_t U = x.model.units.size();
    std::vector<UnitContext> ctx(U);
    if (x.o.stage == 3) s.params.release_all();  // gathered on demand below, one Unit at a time
    for (size_t u = 0; u < U; ++u) {
      UnitContext& c = ctx[u];
      s.params.use(static_cast<int>(u));
      c.batch = &batch;
      c.input = carry;
      c.checkpoint = true;  // keep no activations for a backward that never comes
      c.params = s.params.views(static_cast<int>(u));
      x.model.units[u]->forward(c);
      c.params.clear();
      carry = c.output;
      if (x.o.stage == 3) s.params.release_all(); else x.compute_point()->synchronize();
    }
    if (x.o.stage == 3) s.params.prefetch(0);  // the next step's first groups again

    if (!last) {
      // The header and the activation, as pipeline_step sends them; posted after the compute
      // stream's point (the activation must be written) and waited for before `carry` goes.
      const std::array<int32_t, kPipeHeader> host = engine::encode_header({carry.type(), carry.shape()});
      Tensor header = Tensor::empty(x.dev, Shape{kPipeHeader}, ScalarType::i32, MemCategory::activations);
      copy_from_host(x.dev, x.compute, header, host.data());
      const std::optional<DType> wire = to_dtype(carry.type());
      ZERO_REQUIRE(wire.has_value(), where + ": the activation is not fp32/bf16/fp16");
      const coll::P2POp ops[2] = {
          coll::P2POp::send(header.data(), kPipeHeader, DType::f32, next_rank),
          coll::P2POp::send(carry.data(), static_cast<size_t>(carry.numel()), *wire, next_rank)};
      for (coll::Work& w : pipe.batch_send_recv(ops, x.compute_point())) w.wait();
    }

    // The last stage's result: [loss as a double (2 words), rows of argmax (1 word), unused].
    int32_t meta[4] = {0, 0, 0, 0};
    std::vector<int32_t> am;
    if (last) {
      double loss64 = 0;
      float loss32 = 0;
      const Tensor& loss = ctx.back().loss;
      ZERO_REQUIRE(loss, where + ": the last stage's last Unit gives no loss");
      const bool f64 = loss.type() == ScalarType::f64;
      copy_to_host(x.dev, x.compute, f64 ? static_cast<void*>(&loss64) : static_cast<void*>(&loss32), loss);
      x.compute.synchronize();
      const double value = f64 ? loss64 : loss32;
      std::memcpy(meta, &value, sizeof value);
      if (argmax) am = engine::argmax_rows(x, *x.model.units.back(), ctx.back().output, "pipeline_evaluate");
      meta[2] = static_cast<int32_t>(am.size());
    }
    if (pipe.size() > 1) {
      const int root = pipe.size() - 1;
      Tensor m = Tensor::empty(x.dev, Shape{4}, ScalarType::i32, MemCategory::activations);
      if (last) copy_from_host(x.dev, x.compute, m, meta);
      pipe.broadcast(m.data(), 4, DType::f32, root, x.compute_point()).wait();
      copy_to_host(x.dev, x.compute, meta, m);
      x.compute.synchronize();
      if (argmax && meta[2] > 0) {
        Tensor a = Tensor::empty(x.dev, Shape{meta[2]}, ScalarType::i32, MemCategory::activations);
        if (last) copy_from_host(x.dev, x.compute, a, am.data());
        pipe.broadcast(a.data(), static_cast<size_t>(meta[2]), DType::f32, root, x.compute_point()).wait();
        am.assign(static_cast<size_t>(meta[2]), 0);
        copy_to_host(x.dev, x.compute, am.data(), a);
        x.compute.synchronize();
      }
    }
    if (argmax) *argmax = std::move(am);
    double value = 0;
    std::memcpy(&value, meta, sizeof value);
    return value;
  } catch (...) {
    s.quiesce();
    throw;
  }
}

}  // namespace zero
