// The rules of check.hpp, one pass over each list plus one comparison per channel.
#include "runtime/pipeline/check.hpp"

#include <array>
#include <optional>

namespace zero::pipeline {

namespace {

bool is_pass(Op op) {
  return op == Op::forward || op == Op::backward_input || op == Op::backward_weight ||
         op == Op::backward || op == Op::reduce || op == Op::step;
}

bool is_backward(Op op) { return op == Op::backward_input || op == Op::backward; }

// Where each kind of instruction of one micro-batch sits in a list (positions), and how many.
struct Seen {
  std::array<std::vector<size_t>, static_cast<size_t>(Op::step) + 1> at;  // indexed by Op
  std::vector<size_t>& operator[](Op op) { return at[static_cast<size_t>(op)]; }
};

std::string name(int stage, int micro) {
  return "stage " + std::to_string(stage) + ", micro-batch " + std::to_string(micro);
}

// The pass after (dir = +1) or before (dir = -1) position i, skipping loads and communication.
std::optional<Instruction> neighbour_pass(const Stage& list, size_t i, int dir) {
  for (long j = static_cast<long>(i) + dir; j >= 0 && j < static_cast<long>(list.size()); j += dir)
    if (is_pass(list[static_cast<size_t>(j)].op)) return list[static_cast<size_t>(j)];
  return std::nullopt;
}

std::vector<int> micros_of(const Stage& list, Op op) {
  std::vector<int> out;
  for (const Instruction& in : list)
    if (in.op == op) out.push_back(in.micro);
  return out;
}

std::string list_text(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : " ") + std::to_string(x);
  return "[" + out + "]";
}

void check_stage(const Stage& list, int s, int p, int m, std::vector<std::string>& problems) {
  const bool first = s == 0, last = s == p - 1;
  std::vector<Seen> seen(static_cast<size_t>(m));
  std::vector<size_t> reduces, steps;
  std::optional<size_t> last_backward;
  for (size_t i = 0; i < list.size(); ++i) {
    const Instruction& in = list[i];
    const std::string here = "stage " + std::to_string(s) + " instruction " + std::to_string(i) +
                             " (" + to_string(in) + ")";
    if (in.op == Op::reduce || in.op == Op::step) {
      if (in.micro != -1) problems.push_back(here + ": names micro-batch " + std::to_string(in.micro));
      (in.op == Op::reduce ? reduces : steps).push_back(i);
      continue;
    }
    if (in.micro < 0 || in.micro >= m) {
      problems.push_back(here + ": micro-batch outside 0.." + std::to_string(m - 1));
      continue;
    }
    seen[static_cast<size_t>(in.micro)][in.op].push_back(i);
    if (in.op == Op::backward || in.op == Op::backward_input || in.op == Op::backward_weight)
      last_backward = i;
    // Placement: the tensor's producer right before a send, its consumer right after a receive.
    auto expect = [&](bool ok, const char* what) {
      if (!ok) problems.push_back(here + ": " + what);
    };
    const std::optional<Instruction> next = neighbour_pass(list, i, +1);
    const std::optional<Instruction> prev = neighbour_pass(list, i, -1);
    switch (in.op) {
      case Op::recv_activation:
        expect(next && next->op == Op::forward && next->micro == in.micro,
               "the next pass is not this micro-batch's F");
        break;
      case Op::load:
        expect(next && next->op == Op::forward && next->micro == in.micro,
               "the next pass is not this micro-batch's F");
        break;
      case Op::send_activation:
        expect(prev && prev->op == Op::forward && prev->micro == in.micro,
               "the previous pass is not this micro-batch's F");
        break;
      case Op::recv_gradient:
        expect(next && is_backward(next->op) && next->micro == in.micro,
               "the next pass is not this micro-batch's B");
        break;
      case Op::send_gradient:
        expect(prev && is_backward(prev->op) && prev->micro == in.micro,
               "the previous pass is not this micro-batch's B");
        break;
      default: break;
    }
  }

  for (int mb = 0; mb < m; ++mb) {
    Seen& x = seen[static_cast<size_t>(mb)];
    const std::string who = name(s, mb);
    auto count = [&](Op op, size_t want) {
      if (x[op].size() != want)
        problems.push_back(who + ": " + std::to_string(x[op].size()) + " " + op_name(op) +
                           ", expected " + std::to_string(want));
    };
    count(Op::forward, 1);
    const bool joint = !x[Op::backward].empty();
    count(Op::backward, joint ? 1 : 0);
    count(Op::backward_input, joint ? 0 : 1);
    count(Op::backward_weight, joint ? 0 : 1);
    count(Op::load, first || last ? 1 : 0);
    count(Op::recv_activation, first ? 0 : 1);
    count(Op::send_activation, last ? 0 : 1);
    count(Op::recv_gradient, last ? 0 : 1);
    count(Op::send_gradient, first ? 0 : 1);
    if (x[Op::forward].size() != 1) continue;
    const size_t f = x[Op::forward][0];
    if (joint) {
      if (x[Op::backward].size() == 1 && x[Op::backward][0] < f)
        problems.push_back(who + ": backward before forward");
    } else if (x[Op::backward_input].size() == 1 && x[Op::backward_weight].size() == 1) {
      const size_t b = x[Op::backward_input][0], w = x[Op::backward_weight][0];
      if (b < f) problems.push_back(who + ": B before F");
      if (w < b) problems.push_back(who + ": W before B");
    }
  }

  if (reduces.size() != 1 || steps.size() != 1) {
    problems.push_back("stage " + std::to_string(s) + ": " + std::to_string(reduces.size()) +
                       " reduce and " + std::to_string(steps.size()) + " step, expected one each");
  } else {
    if (last_backward && reduces[0] < *last_backward)
      problems.push_back("stage " + std::to_string(s) + ": reduce before the last backward");
    if (steps[0] < reduces[0])
      problems.push_back("stage " + std::to_string(s) + ": step before reduce");
  }
}

}  // namespace

std::vector<std::string> check_schedules(const std::vector<Stage>& stages, int micro_batches) {
  std::vector<std::string> problems;
  const int p = static_cast<int>(stages.size());
  if (p < 1 || micro_batches < 1) {
    problems.push_back("no stages or no micro-batches");
    return problems;
  }
  for (int s = 0; s < p; ++s) check_stage(stages[static_cast<size_t>(s)], s, p, micro_batches, problems);
  for (int s = 0; s + 1 < p; ++s) {
    const Stage& lo = stages[static_cast<size_t>(s)];
    const Stage& hi = stages[static_cast<size_t>(s + 1)];
    const std::vector<int> sa = micros_of(lo, Op::send_activation), ra = micros_of(hi, Op::recv_activation);
    if (sa != ra)
      problems.push_back("stage " + std::to_string(s) + " sends activations " + list_text(sa) +
                         " but stage " + std::to_string(s + 1) + " receives " + list_text(ra));
    const std::vector<int> sg = micros_of(hi, Op::send_gradient), rg = micros_of(lo, Op::recv_gradient);
    if (sg != rg)
      problems.push_back("stage " + std::to_string(s + 1) + " sends gradients " + list_text(sg) +
                         " but stage " + std::to_string(s) + " receives " + list_text(rg));
  }
  return problems;
}

}  // namespace zero::pipeline
