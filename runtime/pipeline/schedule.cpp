// The three schedules. Each is written as the order of its passes; the Builder adds the
// receives, sends and loads around each pass, so the placement rule lives in one place.
#include "runtime/pipeline/schedule.hpp"

#include <algorithm>
#include <array>

#include "core/error.hpp"

namespace zero::pipeline {

namespace {

void check_arguments(int stages, int micro_batches, int stage) {
  ZERO_REQUIRE(stages >= 1, "pipeline schedule: " + std::to_string(stages) +
                                " stages; need at least 1");
  ZERO_REQUIRE(micro_batches >= 1, "pipeline schedule: " + std::to_string(micro_batches) +
                                       " micro-batches; need at least 1 per step");
  ZERO_REQUIRE(stage >= 0 && stage < stages, "pipeline schedule: stage " + std::to_string(stage) +
                                                 " outside 0.." + std::to_string(stages - 1));
}

// Appends passes with their communication: a receive right before the pass that consumes the
// tensor, a send right after the pass that produces it (the executor posts both asynchronously).
class Builder {
 public:
  Builder(int stages, int stage) : first_(stage == 0), last_(stage == stages - 1) {}

  void forward(int mb) {
    if (first_ || last_) out_.push_back({Op::load, mb});
    if (!first_) out_.push_back({Op::recv_activation, mb});
    out_.push_back({Op::forward, mb});
    if (!last_) out_.push_back({Op::send_activation, mb});
  }
  // The input gradient: B, or the joint backward when `joint`.
  void backward(int mb, bool joint) {
    if (!last_) out_.push_back({Op::recv_gradient, mb});
    out_.push_back({joint ? Op::backward : Op::backward_input, mb});
    if (!first_) out_.push_back({Op::send_gradient, mb});
  }
  void weight(int mb) { out_.push_back({Op::backward_weight, mb}); }

  // The step's end: the stage's gradients are complete after its last backward or W.
  Stage finish() {
    out_.push_back({Op::reduce, -1});
    out_.push_back({Op::step, -1});
    return std::move(out_);
  }

 private:
  bool first_, last_;
  Stage out_;
};

// 1F1B's order of forwards and backwards, with a hook after each backward (ZB-H1 puts its W
// passes there). warm-up: the forwards before the first backward minus one, so that stage s
// holds at most p-s micro-batches between F and B (the last stage runs F, B, F, B, ...).
template <class AfterBackward>
void one_f_one_b_order(Builder& b, int p, int m, int s, bool joint, AfterBackward after) {
  const int warmup = std::min(p - s - 1, m);
  for (int i = 0; i < warmup; ++i) b.forward(i);
  for (int i = 0; i < m - warmup; ++i) {
    b.forward(warmup + i);
    b.backward(i, joint);
    after(i);
  }
  for (int i = m - warmup; i < m; ++i) {
    b.backward(i, joint);
    after(i);
  }
}

constexpr std::array<NamedSchedule, 3> kSchedules{{
    {"gpipe", &gpipe},
    {"1f1b", &one_f_one_b},
    {"zb-h1", &zb_h1},
}};

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::load: return "load";
    case Op::forward: return "forward";
    case Op::backward_input: return "backward_input";
    case Op::backward_weight: return "backward_weight";
    case Op::backward: return "backward";
    case Op::send_activation: return "send_activation";
    case Op::recv_activation: return "recv_activation";
    case Op::send_gradient: return "send_gradient";
    case Op::recv_gradient: return "recv_gradient";
    case Op::reduce: return "reduce";
    case Op::step: return "step";
  }
  return "?";
}

std::string to_string(const Instruction& in) {
  const char* prefix = "?";
  switch (in.op) {
    case Op::load: prefix = "L"; break;
    case Op::forward: prefix = "F"; break;
    case Op::backward_input: prefix = "B"; break;
    case Op::backward_weight: prefix = "W"; break;
    case Op::backward: prefix = "BW"; break;
    case Op::send_activation: prefix = "send_act"; break;
    case Op::recv_activation: prefix = "recv_act"; break;
    case Op::send_gradient: prefix = "send_grad"; break;
    case Op::recv_gradient: prefix = "recv_grad"; break;
    case Op::reduce: return "reduce";
    case Op::step: return "step";
  }
  return prefix + std::to_string(in.micro);
}

Stage gpipe(int stages, int micro_batches, int stage) {
  check_arguments(stages, micro_batches, stage);
  Builder b(stages, stage);
  for (int i = 0; i < micro_batches; ++i) b.forward(i);
  for (int i = micro_batches - 1; i >= 0; --i) b.backward(i, /*joint=*/true);
  return b.finish();
}

Stage one_f_one_b(int stages, int micro_batches, int stage) {
  check_arguments(stages, micro_batches, stage);
  Builder b(stages, stage);
  one_f_one_b_order(b, stages, micro_batches, stage, /*joint=*/true, [](int) {});
  return b.finish();
}

Stage zb_h1(int stages, int micro_batches, int stage) {
  check_arguments(stages, micro_batches, stage);
  Builder b(stages, stage);
  // Stage s runs W(j-s) right after B(j): the last stage delays its W passes the most, so its B
  // passes (which the stages above wait for) come one after each F; stage 0 delays none, as
  // nobody waits for its B. Holding s+1 micro-batches for W on top of at most p-s activations
  // keeps every stage at p micro-batches between F and W, 1F1B's count on stage 0.
  int next_w = 0;
  one_f_one_b_order(b, stages, micro_batches, stage, /*joint=*/false, [&](int j) {
    if (j - stage >= 0) b.weight(next_w++);
  });
  while (next_w < micro_batches) b.weight(next_w++);
  return b.finish();
}

std::span<const NamedSchedule> known_schedules() { return kSchedules; }

ScheduleFn schedule_by_name(std::string_view name, std::string_view where) {
  std::string known;
  for (const NamedSchedule& s : kSchedules) {
    if (name == s.name) return s.fn;
    known += known.empty() ? "" : ", ";
    known += s.name;
  }
  ZERO_FAIL(std::string(where) + ": unknown pipeline schedule \"" + std::string(name) +
            "\"; use one of: " + known);
}

std::vector<Stage> all_stages(ScheduleFn fn, int stages, int micro_batches) {
  check_arguments(stages, micro_batches, 0);
  std::vector<Stage> out;
  out.reserve(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) out.push_back(fn(stages, micro_batches, s));
  return out;
}

}  // namespace zero::pipeline
