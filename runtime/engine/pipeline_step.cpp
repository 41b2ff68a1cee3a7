// Engine::pipeline_step: one pipeline stage's instruction list (runtime/pipeline/schedule.hpp)
// driven through the engine's pieces. The engine runs over the stage's view of the model, so its
// Units are the stage's; this file adds what a stage needs beyond Engine::step: the boundary
// tensors in and out (point-to-point over the pipeline communicator) and the passes in the
// list's order instead of the data-parallel schedule's.
//
// Transfers. A receive is posted where its instruction sits and waited for at the pass that
// reads it; a send is posted right after the pass that produced its tensor, after the compute
// stream's point (the tensor must be written before it is read), and waited for only at the end
// of the list. Every posted buffer is held (in the micro-batch or in `sending`) until its Work
// completes. An activation goes as two messages, a header of kHeader int32 words (scalar type,
// rank, dims) and the data: the receiver needs no knowledge of the previous stage's Units. Both
// go from the same sender to the same receiver, so they match the receiver's two receives in
// order (communicator.hpp). A gradient needs no header: it has the shape and type of the
// activation this stage sent for that micro-batch.
#include <map>

#include "core/phase.hpp"
#include "runtime/engine/engine_state.hpp"

namespace zero {
namespace {

constexpr int kHeader = 8;  // scalar type, rank, up to 6 dimensions (Shape::kMaxRank is 4)

DType wire_type(ScalarType t, const char* what) {
  auto d = to_dtype(t);
  ZERO_REQUIRE(d.has_value(), std::string("pipeline executor: the ") + what +
                                  " is not fp32/bf16/fp16; the first version moves fp32 activations");
  return *d;
}

struct StageMicro {
  Batch batch;
  std::vector<UnitContext> ctx;  // per Unit of the stage
  Tensor header;                 // received activation header, then
  coll::Work header_work;
  bool header_posted = false;
  Tensor grad_in_buf;            // received gradient (the seed of this stage's backward)
  coll::Work grad_work;
  bool grad_posted = false;
  Tensor sent_output;            // the activation sent up: the received gradient's shape
  Tensor carry;                  // between B and W: nothing; B's running gradient otherwise
};

struct Sending {
  std::vector<int32_t> host;  // the header's host copy (its upload may still read it)
  Tensor a, b;
  std::vector<coll::Work> work;
};

}  // namespace

StepStats Engine::pipeline_step(const pipeline::Stage& list, const std::function<Batch(int micro)>& next) {
  State& s = *s_;
  engine::Context& x = s.x;
  ZERO_REQUIRE(x.place.active(), "Engine::pipeline_step: this Engine was built without a "
                                 "PipelinePlace (engine::make_pipeline_stage); use Engine::step");
  coll::Communicator& pipe = *x.place.pipe;
  const int prev_rank = x.place.prev(), next_rank = x.place.next();
  const int M = x.o.gradient_accumulation_steps;
  const size_t U = x.model.units.size();
  const std::string where = "pipeline executor (pipeline rank " + std::to_string(pipe.rank()) + ")";
  // The first version's scope; each refusal names what to change.
  ZERO_REQUIRE(x.o.stage == 0, where + ": ZeRO stage " + std::to_string(x.o.stage) +
                                   " per pipeline stage is not implemented yet; use stage 0");
  ZERO_REQUIRE(x.comm.size() == 1, where + ": " + std::to_string(x.comm.size()) +
                                       " data-parallel ranks per stage; the first version runs one");
  ZERO_REQUIRE(x.dtype == DType::f32 && !x.o.loss_scaler,
               where + ": only fp32 parameters without loss scaling are implemented yet");
  ZERO_REQUIRE(!(x.o.gradient_clipping > 0),
               where + ": gradient_clipping > 0 needs the gradient norm summed over the pipeline "
                       "stages, not implemented yet; set gradient_clipping to 0");
  ZERO_REQUIRE(!x.off, where + ": offload_optimizer is not implemented with the pipeline yet");
  ZERO_REQUIRE(pipe.kind() == x.dev.kind(), where + ": the pipeline communicator is for other buffers");
  // Which micro-batches the list names, and the last backward part of the step (after it each
  // Unit's gradient is final); also that the list fits this stage's place in the pipeline.
  std::map<int, int> parts_left;  // micro -> backward parts (BW, or W) still to run
  size_t last_grad_pos = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const pipeline::Instruction& in = list[i];
    using pipeline::Op;
    if (in.op == Op::backward || in.op == Op::backward_weight) {
      ++parts_left[in.micro];
      last_grad_pos = i;
    }
    const bool needs_prev = in.op == Op::recv_activation || in.op == Op::send_gradient;
    const bool needs_next = in.op == Op::send_activation || in.op == Op::recv_gradient;
    ZERO_REQUIRE(!(needs_prev && prev_rank < 0) && !(needs_next && next_rank < 0),
                 where + ": instruction " + std::to_string(i) + " (" + pipeline::to_string(in) +
                     ") needs a neighbouring stage this stage does not have");
  }
  ZERO_REQUIRE(static_cast<int>(parts_left.size()) == M,
               where + ": the list has " + std::to_string(parts_left.size()) +
                   " micro-batches but gradient_accumulation_steps is " + std::to_string(M));
  const bool first = prev_rank < 0, last = next_rank < 0;

  std::map<int, StageMicro> live;
  std::vector<Sending> sending;
  double total = 0;
  bool reduced = false;
  auto micro = [&](int mb) -> StageMicro& {
    auto it = live.find(mb);
    if (it == live.end()) it = live.emplace(mb, StageMicro{}).first;
    if (it->second.ctx.empty()) it->second.ctx.resize(U);
    return it->second;
  };
  // A wait on a neighbouring stage: the stage's bubble (the compute stream drained first, so
  // the wait is not compute).
  auto wait_p2p = [&](coll::Work& w) {
    x.compute.synchronize();
    const double t0 = engine::now_seconds();
    w.wait();
    x.timers.p2p_wait += engine::now_seconds() - t0;
  };
  const double t_step = engine::now_seconds();
  try {
    x.timers.reset_step();
    s.opt->begin_step();
    for (size_t pos = 0; pos < list.size(); ++pos) {
      const pipeline::Instruction& in = list[pos];
      using pipeline::Op;
      switch (in.op) {
        case Op::load: {
          phase::set("loading a micro-batch");
          micro(in.micro).batch = next(in.micro);
          break;
        }
        case Op::recv_activation: {
          StageMicro& m = micro(in.micro);
          m.header = Tensor::empty(x.dev, Shape{kHeader}, ScalarType::i32, MemCategory::activations);
          m.header_work = pipe.recv(m.header.data(), kHeader, DType::f32, prev_rank);
          m.header_posted = true;
          break;
        }
        case Op::recv_gradient: {
          StageMicro& m = micro(in.micro);
          ZERO_REQUIRE(m.sent_output, where + ": " + pipeline::to_string(in) +
                                          " before this stage sent the activation of micro-batch " +
                                          std::to_string(in.micro));
          m.grad_in_buf = Tensor::empty(x.dev, m.sent_output.shape(), m.sent_output.type(),
                                        MemCategory::activations);
          m.grad_work = pipe.recv(m.grad_in_buf.data(), static_cast<size_t>(m.grad_in_buf.numel()),
                                  wire_type(m.grad_in_buf.type(), "gradient"), next_rank);
          m.grad_posted = true;
          break;
        }
        case Op::forward: {
          phase::set("forward");
          StageMicro& m = micro(in.micro);
          Tensor carry;
          if (!first) {
            ZERO_REQUIRE(m.header_posted, where + ": F" + std::to_string(in.micro) +
                                              " on a non-first stage without its recv_activation");
            wait_p2p(m.header_work);
            int32_t h[kHeader];
            copy_to_host(x.dev, x.compute, h, m.header);
            x.compute.synchronize();
            ZERO_REQUIRE(h[0] >= 0 && h[0] <= static_cast<int>(ScalarType::i32) && h[1] >= 1 &&
                             h[1] <= Shape::kMaxRank,
                         where + ": a malformed activation header from pipeline rank " +
                             std::to_string(prev_rank));
            Shape shape = h[1] == 1   ? Shape{h[2]}
                          : h[1] == 2 ? Shape{h[2], h[3]}
                          : h[1] == 3 ? Shape{h[2], h[3], h[4]}
                                      : Shape{h[2], h[3], h[4], h[5]};
            carry = Tensor::empty(x.dev, shape, static_cast<ScalarType>(h[0]), MemCategory::activations);
            coll::Work w = pipe.recv(carry.data(), static_cast<size_t>(carry.numel()),
                                     wire_type(carry.type(), "activation"), prev_rank);
            wait_p2p(w);
            m.header = Tensor();
          }
          for (size_t u = 0; u < U; ++u) {
            UnitContext& c = m.ctx[u];
            c.batch = &m.batch;
            c.input = carry;
            c.params = s.params.views(static_cast<int>(u));
            x.model.units[u]->forward(c);
            c.params.clear();
            carry = c.output;
            x.unit_fence();
          }
          if (last) {
            UnitContext& c = m.ctx[U - 1];
            float loss32 = 0;
            ZERO_REQUIRE(c.loss.type() == ScalarType::f32, where + ": the first version reads an fp32 loss");
            copy_to_host(x.dev, x.compute, &loss32, c.loss);
            x.compute.synchronize();
            total += loss32;
          } else {
            m.sent_output = carry;
          }
          break;
        }
        case Op::send_activation: {
          StageMicro& m = micro(in.micro);
          ZERO_REQUIRE(m.sent_output, where + ": " + pipeline::to_string(in) + " before its F");
          Sending sd;
          sd.host.assign(kHeader, 0);
          const Shape& sh = m.sent_output.shape();
          sd.host[0] = static_cast<int32_t>(m.sent_output.type());
          sd.host[1] = sh.rank();
          for (int d = 0; d < sh.rank(); ++d) sd.host[static_cast<size_t>(2 + d)] = static_cast<int32_t>(sh[d]);
          sd.a = Tensor::empty(x.dev, Shape{kHeader}, ScalarType::i32, MemCategory::activations);
          copy_from_host(x.dev, x.compute, sd.a, sd.host.data());
          sd.b = m.sent_output;
          const coll::P2POp ops[2] = {
              coll::P2POp::send(sd.a.data(), kHeader, DType::f32, next_rank),
              coll::P2POp::send(sd.b.data(), static_cast<size_t>(sd.b.numel()),
                                wire_type(sd.b.type(), "activation"), next_rank)};
          sd.work = pipe.batch_send_recv(ops, x.compute_point());
          sending.push_back(std::move(sd));
          break;
        }
        case Op::backward:
        case Op::backward_input: {
          phase::set("backward");
          StageMicro& m = micro(in.micro);
          const bool joint = in.op == Op::backward;
          Tensor carry;
          if (!last) {
            ZERO_REQUIRE(m.grad_posted, where + ": " + pipeline::to_string(in) +
                                            " on a non-last stage without its recv_gradient");
            wait_p2p(m.grad_work);
            carry = m.grad_in_buf;
          }
          const bool final_part = joint && pos == last_grad_pos;
          for (size_t u = U; u-- > 0;) {
            UnitContext& c = m.ctx[u];
            c.params = s.params.views(static_cast<int>(u));
            c.grads = s.grads.views(static_cast<int>(u));
            c.grad_output = carry;
            c.grad_scale = 1.0f;  // fp32 without loss scaling: 1/M is folded into AdamW's scale
            if (joint) x.model.units[u]->backward(c); else x.model.units[u]->backward_input(c);
            carry = c.grad_input;
            if (joint) {
              c = UnitContext();
              s.grads.after_backward(static_cast<int>(u), final_part);
            } else {
              // W reads only ctx.state and ctx.grads: drop the rest now.
              c.params.clear();
              c.grads.clear();
              c.input = Tensor();
              c.output = Tensor();
              c.grad_output = Tensor();
              c.grad_input = Tensor();
            }
            x.unit_fence();
          }
          m.grad_in_buf = Tensor();
          if (!first) m.carry = carry;  // the first Unit's grad_input: what the previous stage needs
          if (joint && --parts_left[in.micro] == 0) s.grads.drain();
          break;
        }
        case Op::backward_weight: {
          phase::set("backward");
          StageMicro& m = micro(in.micro);
          const bool final_part = pos == last_grad_pos;
          for (size_t u = U; u-- > 0;) {
            UnitContext& c = m.ctx[u];
            c.grads = s.grads.views(static_cast<int>(u));
            x.model.units[u]->backward_weight(c);
            c = UnitContext();
            s.grads.after_backward(static_cast<int>(u), final_part);  // after the Unit's last part
            x.unit_fence();
          }
          if (--parts_left[in.micro] == 0) s.grads.drain();
          break;
        }
        case Op::send_gradient: {
          StageMicro& m = micro(in.micro);
          ZERO_REQUIRE(m.carry, where + ": " + pipeline::to_string(in) + " before its B");
          Sending sd;
          sd.b = m.carry;
          m.carry = Tensor();
          const coll::P2POp op = coll::P2POp::send(sd.b.data(), static_cast<size_t>(sd.b.numel()),
                                                   wire_type(sd.b.type(), "gradient"), prev_rank);
          sd.work = pipe.batch_send_recv(std::span<const coll::P2POp>(&op, 1), x.compute_point());
          sending.push_back(std::move(sd));
          break;
        }
        case Op::reduce:
          phase::set("gradient reduction");
          s.grads.finish();
          reduced = true;
          break;
        case Op::step:
          break;  // below, after the sends are done
      }
      // A micro-batch whose every backward part ran is done (its W keeps nothing after).
      if (in.micro >= 0) {
        auto it = live.find(in.micro);
        if (it != live.end() && parts_left[in.micro] == 0 && !it->second.carry &&
            (in.op == Op::backward || in.op == Op::backward_weight || in.op == Op::send_gradient))
          live.erase(it);
      }
    }
    for (Sending& sd : sending)
      for (coll::Work& w : sd.work) wait_p2p(w);
    sending.clear();
    phase::set("optimizer step");
    if (!reduced) s.grads.finish();  // a list without `reduce`: the boundary does it
    StepStats st = s.opt->apply(last ? total / M : 0.0);
    s.grads.clear();
    st.time.forward = x.timers.forward;
    st.time.backward = x.timers.backward;
    st.time.p2p_wait = x.timers.p2p_wait;
    st.time.step = engine::now_seconds() - t_step;
    return st;
  } catch (...) {
    for (Sending& sd : sending)
      for (coll::Work& w : sd.work) try { w.wait(); } catch (...) {}
    s.quiesce();
    throw;
  }
}

}  // namespace zero
