// Engine::pipeline_step: one pipeline stage's instruction list (runtime/pipeline/schedule.hpp)
// driven through the engine's pieces. The engine runs over the stage's view of the model, so its
// Units are the stage's; this file adds what a stage needs beyond Engine::step: the boundary
// tensors in and out (point-to-point over the pipeline communicator) and the passes in the
// list's order instead of the data-parallel schedule's.
//
// Transfers. A receive is posted where its instruction sits and waited for at the pass that
// reads it; a send is posted right after the pass that produced its tensor, and waited for only
// at the end of the list. Every transfer starts after the compute stream's point (a send's
// tensor must be written, a receive's buffer is stream-ordered memory of the compute stream).
// Every posted buffer is held (in the micro-batch or in `sending`) until its Work completes; a
// completed send's tensors are dropped after the instruction that finds it complete.
//
// Pairs. A send followed in the list by the receive from the same neighbour (only `load`s
// between: send_activation then recv_gradient, send_gradient then recv_activation;
// pipeline::paired_receive) is posted with it as ONE batch_send_recv. On NCCL a lone send may
// block the communicator's stream until the peer's matching receive runs, and in 1F1B's and
// ZB-H1's steady state stage s sends activation j and then receives gradient k while stage s+1
// sends gradient k and then receives activation j: posted one at a time on one stream each, both
// stages would wait on their sends forever once the messages exceed NCCL's buffers. Batched,
// each pair progresses together (Megatron's send_forward_recv_backward); with the pairs every
// schedule completes on a transport that buffers nothing (pipeline::check_unbuffered, tested).
// MPI needs none of it (any order is safe there); the pairs change only when a receive is
// posted, never what arrives.
//
// Activations carry a header of kPipeHeader int32 words (scalar type, rank, dims): the receiver needs
// no knowledge of the previous stage's Units. At the first step (per micro-batch index) the
// receiver posts only the header at recv_activation and, at F, reads it and posts the data: one
// host round trip. Both sides keep the (type, shape) they exchanged (State::pipe_sent,
// pipe_received), so later steps post header and data together at recv_activation and F only
// waits; the header is then checked against the kept shape, and the sender refuses to send a
// shape other than the first step's (the receiver has already posted that one). Header and data
// go from the same sender to the same receiver, so they match in order (communicator.hpp). A
// gradient needs no header: it has the shape and type of the activation this stage sent.
#include <algorithm>
#include <map>

#include "core/phase.hpp"
#include "runtime/engine/engine_state.hpp"
#include "runtime/pipeline/p2p_batches.hpp"

namespace zero {
namespace {

using engine::kPipeHeader;

DType wire_type(ScalarType t, const char* what) {
  auto d = to_dtype(t);
  ZERO_REQUIRE(d.has_value(), std::string("pipeline executor: the ") + what +
                                  " is not fp32/bf16/fp16; the first version moves fp32 activations");
  return *d;
}

struct StageMicro {
  engine::MicroState state;      // batch, Unit contexts, carry, loss (ScheduleRunner's)
  Tensor header;                 // received activation header
  Tensor input;                  // received activation (posted with the header once its shape is known)
  coll::Work header_work, input_work;
  bool header_posted = false, input_posted = false;
  Tensor grad_in_buf;            // received gradient (the seed of this stage's backward)
  coll::Work grad_work;
  bool grad_posted = false;
  Tensor sent_output;            // the activation sent up: the received gradient's shape
  Tensor to_send;                // the first Unit's input gradient, until send_gradient
};

struct Sending {
  std::vector<int32_t> host;  // the header's host copy (its upload may still read it)
  Tensor a, b;
  std::vector<coll::Work> work;
};

// One batch_send_recv in the making: its ops and where each op's Work goes.
struct Posting {
  std::vector<coll::P2POp> ops;
  std::vector<coll::Work*> works;
  void add(const coll::P2POp& op, coll::Work* w) {
    ops.push_back(op);
    works.push_back(w);
  }
};

using Boundary = engine::PipeBoundary;

std::string describe(const Boundary& b) {
  return std::string(to_string(b.type)) + " " + b.shape.str();
}

}  // namespace

StepStats Engine::pipeline_step(const pipeline::Stage& list, const std::function<Batch(int micro)>& next) {
  State& s = *s_;
  engine::Context& x = s.x;
  ZERO_REQUIRE(x.place.active(), "Engine::pipeline_step: this Engine was built without a "
                                 "PipelinePlace (engine::make_pipeline_stage); use Engine::step");
  coll::Communicator& pipe = *x.place.pipe;
  const int prev_rank = x.place.prev(), next_rank = x.place.next();
  const int M = x.o.gradient_accumulation_steps;
  const int U = static_cast<int>(x.model.units.size());
  const std::string where = "pipeline executor (pipeline stage " + std::to_string(pipe.rank()) + " of " +
                            std::to_string(pipe.size()) + ")";
  ZERO_REQUIRE(pipe.kind() == x.dev.kind(), where + ": the pipeline communicator is for other buffers");

  // The list as Unit passes (an F, B or W instruction is its passes over the stage's Units:
  // forward first to last, backward parts last to first), where each instruction's passes
  // start, and the checks that the list fits this stage's place in the pipeline.
  using pipeline::Op;
  using Part = engine::UnitPass::Part;
  std::vector<engine::UnitPass> passes;
  std::vector<size_t> first_pass(list.size(), 0);
  std::map<int, int> micro_ops;  // micro -> F/B/W instructions
  size_t last_grad_instr = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const pipeline::Instruction& in = list[i];
    first_pass[i] = passes.size();
    switch (in.op) {
      case Op::forward:
        for (int u = 0; u < U; ++u) passes.push_back({in.micro, u, Part::forward});
        break;
      case Op::backward:
      case Op::backward_input:
      case Op::backward_weight: {
        const Part part = in.op == Op::backward ? Part::backward
                          : in.op == Op::backward_input ? Part::input : Part::weight;
        for (int u = U; u-- > 0;) passes.push_back({in.micro, u, part});
        if (in.op != Op::backward_input) last_grad_instr = i;
        break;
      }
      default:
        break;
    }
    if (in.op == Op::forward || in.op == Op::backward || in.op == Op::backward_input ||
        in.op == Op::backward_weight)
      ++micro_ops[in.micro];
    const bool needs_prev = in.op == Op::recv_activation || in.op == Op::send_gradient;
    const bool needs_next = in.op == Op::send_activation || in.op == Op::recv_gradient;
    ZERO_REQUIRE(!(needs_prev && prev_rank < 0) && !(needs_next && next_rank < 0),
                 where + ": instruction " + std::to_string(i) + " (" + pipeline::to_string(in) +
                     ") needs a neighbouring stage this stage does not have");
  }
  ZERO_REQUIRE(static_cast<int>(micro_ops.size()) == M,
               where + ": the list has " + std::to_string(micro_ops.size()) +
                   " micro-batches but gradient_accumulation_steps is " + std::to_string(M));
  const bool first = prev_rank < 0, last = next_rank < 0;

  std::map<int, StageMicro> live;  // node-based: a micro-batch's Batch address stays put
  std::vector<Sending> sending;
  std::vector<bool> posted_early(list.size(), false);  // a receive posted with the send before it
  double total = 0;
  bool reduced = false;
  auto micro = [&](int mb) -> StageMicro& {
    auto it = live.find(mb);
    if (it == live.end()) {
      it = live.emplace(mb, StageMicro{}).first;
      it->second.state.passes_left = s.runner->passes(mb);
    }
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
  // Posts `p` as one batch after the compute stream's point.
  auto post = [&](Posting& p) {
    if (p.ops.empty()) return;
    std::vector<coll::Work> w = pipe.batch_send_recv(p.ops, x.compute_point());
    for (size_t i = 0; i < w.size(); ++i) *p.works[i] = std::move(w[i]);
  };
  // The receive of micro-batch mb's activation: the header, and the data when an earlier step
  // told its shape.
  auto add_recv_activation = [&](int mb, Posting& p) {
    StageMicro& m = micro(mb);
    m.header = Tensor::empty(x.dev, Shape{kPipeHeader}, ScalarType::i32, MemCategory::activations);
    p.add(coll::P2POp::recv(m.header.data(), kPipeHeader, DType::f32, prev_rank), &m.header_work);
    m.header_posted = true;
    if (auto it = s.pipe_received.find(mb); it != s.pipe_received.end()) {
      m.input = Tensor::empty(x.dev, it->second.shape, it->second.type, MemCategory::activations);
      p.add(coll::P2POp::recv(m.input.data(), static_cast<size_t>(m.input.numel()),
                              wire_type(m.input.type(), "activation"), prev_rank),
            &m.input_work);
      m.input_posted = true;
    }
  };
  auto add_recv_gradient = [&](const pipeline::Instruction& in, Posting& p) {
    StageMicro& m = micro(in.micro);
    ZERO_REQUIRE(m.sent_output, where + ": " + pipeline::to_string(in) +
                                    " before this stage sent the activation of micro-batch " +
                                    std::to_string(in.micro));
    m.grad_in_buf = Tensor::empty(x.dev, m.sent_output.shape(), m.sent_output.type(),
                                  MemCategory::activations);
    p.add(coll::P2POp::recv(m.grad_in_buf.data(), static_cast<size_t>(m.grad_in_buf.numel()),
                            wire_type(m.grad_in_buf.type(), "gradient"), next_rank),
          &m.grad_work);
    m.grad_posted = true;
  };
  // The send at `pos` takes along the receive that follows it from the same neighbour (only
  // `load`s between), which is then posted here instead of at its own place (see "Pairs").
  auto add_paired_recv = [&](size_t pos, Posting& p) {
    const std::optional<size_t> k = pipeline::paired_receive(list, pos);
    if (!k) return;
    if (list[*k].op == Op::recv_gradient) add_recv_gradient(list[*k], p);
    else add_recv_activation(list[*k].micro, p);
    posted_early[*k] = true;
  };
  const double t_step = engine::now_seconds();
  try {
    x.timers.reset_step();
    s.opt->begin_step();
    s.grads.begin_step();
    s.runner->plan(passes);
    const float seed = static_cast<float>(s.opt->loss_scale());
    auto run_passes = [&](StageMicro& m, size_t i) {
      const size_t end = i + 1 < list.size() ? first_pass[i + 1] : passes.size();
      for (size_t q = first_pass[i]; q < end; ++q) s.runner->pass(m.state, q, seed);
    };
    for (size_t pos = 0; pos < list.size(); ++pos) {
      if (posted_early[pos]) continue;  // a receive posted with the send before it
      const pipeline::Instruction& in = list[pos];
      switch (in.op) {
        case Op::load: {
          phase::set("loading a micro-batch");
          micro(in.micro).state.batch = next(in.micro);
          break;
        }
        case Op::recv_activation: {
          Posting p;
          add_recv_activation(in.micro, p);
          post(p);
          break;
        }
        case Op::recv_gradient: {
          Posting p;
          add_recv_gradient(in, p);
          post(p);
          break;
        }
        case Op::forward: {
          StageMicro& m = micro(in.micro);
          if (!first) {
            ZERO_REQUIRE(m.header_posted, where + ": F" + std::to_string(in.micro) +
                                              " on a non-first stage without its recv_activation");
            wait_p2p(m.header_work);
            int32_t h[kPipeHeader];
            copy_to_host(x.dev, x.compute, h, m.header);
            x.compute.synchronize();
            const Boundary got = engine::decode_header(h, where, prev_rank);
            if (m.input_posted) {
              // The sender checks this too before sending; a mismatch here means the two stages'
              // kept shapes parted (e.g. one of them was rebuilt between steps).
              const Boundary& kept = s.pipe_received.at(in.micro);
              ZERO_REQUIRE(got == kept, where + ": the activation of micro-batch " +
                                            std::to_string(in.micro) + " from pipeline stage " +
                                            std::to_string(prev_rank) + " is " + describe(got) +
                                            " but this stage posted its receive as " + describe(kept) +
                                            ", the first step's\nHINT: every micro-batch must keep "
                                            "its shape from step to step (fixed micro-batch size and "
                                            "sequence length)");
            } else {
              m.input = Tensor::empty(x.dev, got.shape, got.type, MemCategory::activations);
              Posting p;
              p.add(coll::P2POp::recv(m.input.data(), static_cast<size_t>(m.input.numel()),
                                      wire_type(m.input.type(), "activation"), prev_rank),
                    &m.input_work);
              post(p);
              s.pipe_received[in.micro] = got;
            }
            wait_p2p(m.input_work);
            m.header = Tensor();
            m.state.carry = std::move(m.input);
          }
          run_passes(m, pos);
          if (last) total += m.state.loss;
          else m.sent_output = std::move(m.state.carry);
          m.state.carry = Tensor();
          break;
        }
        case Op::send_activation: {
          StageMicro& m = micro(in.micro);
          ZERO_REQUIRE(m.sent_output, where + ": " + pipeline::to_string(in) + " before its F");
          const Boundary out{m.sent_output.type(), m.sent_output.shape()};
          const auto [kept, fresh] = s.pipe_sent.emplace(in.micro, out);
          ZERO_REQUIRE(fresh || kept->second == out,
                       where + ": the activation of micro-batch " + std::to_string(in.micro) +
                           " is " + describe(out) + " but was " + describe(kept->second) +
                           " at the first step, and pipeline stage " + std::to_string(next_rank) +
                           " posts its receive with the first step's shape\nHINT: every "
                           "micro-batch must keep its shape from step to step (fixed micro-batch "
                           "size and sequence length)");
          Sending sd;
          const std::array<int32_t, kPipeHeader> words = engine::encode_header(out);
          sd.host.assign(words.begin(), words.end());
          sd.a = Tensor::empty(x.dev, Shape{kPipeHeader}, ScalarType::i32, MemCategory::activations);
          copy_from_host(x.dev, x.compute, sd.a, sd.host.data());
          sd.b = m.sent_output;
          sd.work.resize(2);
          Posting p;
          p.add(coll::P2POp::send(sd.a.data(), kPipeHeader, DType::f32, next_rank), &sd.work[0]);
          p.add(coll::P2POp::send(sd.b.data(), static_cast<size_t>(sd.b.numel()),
                                  wire_type(sd.b.type(), "activation"), next_rank),
                &sd.work[1]);
          add_paired_recv(pos, p);
          post(p);
          sending.push_back(std::move(sd));
          break;
        }
        case Op::backward:
        case Op::backward_input:
        case Op::backward_weight: {
          StageMicro& m = micro(in.micro);
          if (in.op != Op::backward_weight && !last) {
            ZERO_REQUIRE(m.grad_posted, where + ": " + pipeline::to_string(in) +
                                            " on a non-last stage without its recv_gradient");
            wait_p2p(m.grad_work);
            m.state.carry = std::move(m.grad_in_buf);
          }
          // Offload: before the step's final gradients land, whether AdamW runs ahead of the norm.
          if (pos == last_grad_instr) s.opt->plan_speculation();
          run_passes(m, pos);
          if (in.op != Op::backward_weight) {
            if (!first) m.to_send = std::move(m.state.carry);  // what the previous stage needs
            m.state.carry = Tensor();
          }
          if (m.state.passes_left == 0) s.grads.drain();  // the micro-batch's reductions too
          break;
        }
        case Op::send_gradient: {
          StageMicro& m = micro(in.micro);
          ZERO_REQUIRE(m.to_send, where + ": " + pipeline::to_string(in) + " before its B");
          Sending sd;
          sd.b = std::move(m.to_send);
          sd.work.resize(1);
          Posting p;
          p.add(coll::P2POp::send(sd.b.data(), static_cast<size_t>(sd.b.numel()),
                                  wire_type(sd.b.type(), "gradient"), prev_rank),
                &sd.work[0]);
          add_paired_recv(pos, p);
          post(p);
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
      // Sends that have completed give their tensors back now, not at the end of the list: else
      // a stage would hold every micro-batch's sent boundary tensors, gpipe's memory under every
      // schedule (with activation checkpointing those are most of what a held micro-batch costs).
      // wait() on a completed Work returns at once and reports a failed send.
      std::erase_if(sending, [](Sending& sd) {
        for (coll::Work& w : sd.work)
          if (!w.test()) return false;
        for (coll::Work& w : sd.work) w.wait();
        return true;
      });
      // A micro-batch whose passes all ran and whose gradient went out is done.
      if (in.micro >= 0) {
        auto it = live.find(in.micro);
        if (it != live.end() && it->second.state.passes_left == 0 && !it->second.to_send) live.erase(it);
      }
    }
    for (Sending& sd : sending)
      for (coll::Work& w : sd.work) wait_p2p(w);
    sending.clear();
    const double t0 = engine::now_seconds();
    phase::set("optimizer step (gradient norm across stages, AdamW, parameter all-gather)");
    if (!reduced) s.grads.finish();  // a list without `reduce`: the boundary does it
    StepStats st = s.opt->apply(last ? total / M : 0.0);
    s.grads.clear();
    if (s.host) s.host->clear();
    if (x.o.stage == 3) s.params.prefetch(0);
    st.time.forward = x.timers.forward;
    st.time.backward = x.timers.backward;
    st.time.optimizer = engine::now_seconds() - t0;
    st.time.p2p_wait = x.timers.p2p_wait;
    st.time.step = engine::now_seconds() - t_step;
    if (x.o.timers) {
      st.time.comm_exposed = x.timers.exposed;
      st.time.d2h = x.timers.d2h;
      st.time.h2d = x.timers.h2d;
      st.time.host_adam = static_cast<double>(x.timers.adam_ns.load()) * 1e-9;
      st.time.host_adam_waited = x.timers.adam_waited;
      const int64_t busy = x.timers.comm_busy_ns.load();
      st.time.comm_busy = static_cast<double>(busy - x.timers.comm_busy_reported_ns) * 1e-9;
      x.timers.comm_busy_reported_ns = busy;
    }
    return st;
  } catch (...) {
    for (Sending& sd : sending)
      for (coll::Work& w : sd.work) try { w.wait(); } catch (...) {}
    s.quiesce();
    throw;
  }
}

}  // namespace zero
