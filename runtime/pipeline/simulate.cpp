// The simulator: each stage runs its list until it reaches a receive whose message has not been
// sent; the stages are swept round-robin until all finish or a sweep makes no progress (then
// every unfinished stage waits on a receive nobody will satisfy: a deadlock). Times do not depend
// on the sweep order: a stage's clock advances only by its own passes and by message arrivals,
// which are fixed once the sender has run the send.
#include "runtime/pipeline/simulate.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"

namespace zero::pipeline {

double Costs::of(Op op) const {
  switch (op) {
    case Op::load: return load;
    case Op::forward: return forward;
    case Op::backward_input: return backward_input;
    case Op::backward_weight: return backward_weight;
    case Op::backward: return backward ? *backward : backward_input + backward_weight;
    case Op::reduce: return reduce;
    case Op::step: return step;
    default: return 0;
  }
}

namespace {

struct Message {
  int micro;
  double arrival;
  double taken = -1;  // when the receive completed; -1 until then
};

// One direction between two neighbours: every message sent, and the next one to receive.
struct Channel {
  std::vector<Message> sent;
  size_t next = 0;
  bool empty() const { return next == sent.size(); }
};

// In-flight counters of one stage, with their peaks.
struct Held {
  int activations = 0, weight_pending = 0;
  void apply(Op op, StageReport& r) {
    switch (op) {
      case Op::forward: ++activations; break;
      case Op::backward_input: --activations; ++weight_pending; break;
      case Op::backward_weight: --weight_pending; break;
      case Op::backward: --activations; break;
      default: return;
    }
    r.peak_activations = std::max(r.peak_activations, activations);
    r.peak_weight_pending = std::max(r.peak_weight_pending, weight_pending);
    r.peak_in_flight = std::max(r.peak_in_flight, activations + weight_pending);
  }
};

std::string where(int stage, size_t index, const Instruction& in) {
  return "stage " + std::to_string(stage) + " instruction " + std::to_string(index) + " (" +
         to_string(in) + ")";
}

}  // namespace

std::string Simulation::failure() const {
  std::string out;
  for (const std::string& m : mismatches) out += m + "\n";
  if (deadlocked) {
    out += "deadlock: no stage can go on\n";
    for (const Blocked& b : blocked) {
      const bool send = b.in.op == Op::send_activation || b.in.op == Op::send_gradient;
      out += "  " + where(b.stage, b.index, b.in) +
             (send ? " waits for a receive never reached\n" : " waits for a message never sent\n");
    }
  }
  return out;
}

Simulation simulate(const std::vector<Stage>& lists, const Costs& costs, Sends sends) {
  return simulate_per_stage(lists, std::vector<Costs>(lists.size(), costs), sends);
}

Simulation simulate_per_stage(const std::vector<Stage>& lists, const std::vector<Costs>& per_stage,
                              Sends sends) {
  const int p = static_cast<int>(lists.size());
  ZERO_REQUIRE(p >= 1, "pipeline simulate: no stages");
  ZERO_REQUIRE(per_stage.size() == lists.size(),
               "pipeline simulate: " + std::to_string(per_stage.size()) + " cost sets for " +
                   std::to_string(p) + " stages; give one per stage");
  Simulation sim;
  sim.stages.resize(static_cast<size_t>(p));
  // act[s]: activations from s to s+1; grad[s]: gradients from s+1 to s.
  std::vector<Channel> act(static_cast<size_t>(p)), grad(static_cast<size_t>(p));
  // With synchronous sends: the message a stage waits on at its current send (-1: none posted).
  std::vector<long> posted(static_cast<size_t>(p), -1);
  std::vector<size_t> pos(static_cast<size_t>(p), 0);
  std::vector<double> clock(static_cast<size_t>(p), 0);
  std::vector<Held> held(static_cast<size_t>(p));

  // Runs stage s until it finishes or waits; false on a mismatch (recorded).
  auto run = [&](int s, bool& progressed) {
    const auto su = static_cast<size_t>(s);
    const Stage& list = lists[su];
    const Costs& costs = per_stage[su];  // a message's delay is its sender's comm
    StageReport& r = sim.stages[su];
    while (pos[su] < list.size()) {
      const Instruction& in = list[pos[su]];
      const double t = clock[su];
      double end = t;
      switch (in.op) {
        case Op::send_activation:
        case Op::send_gradient: {
          const bool fwd = in.op == Op::send_activation;
          const int to = fwd ? s + 1 : s - 1;
          if (to < 0 || to >= p) {
            sim.mismatches.push_back(where(s, pos[su], in) + ": there is no stage " +
                                     std::to_string(to) + " to send to");
            return false;
          }
          Channel& ch = fwd ? act[su] : grad[static_cast<size_t>(to)];
          if (sends == Sends::asynchronous) {
            ch.sent.push_back({in.micro, t + costs.comm});
            break;
          }
          if (posted[su] < 0) {
            posted[su] = static_cast<long>(ch.sent.size());
            ch.sent.push_back({in.micro, t + costs.comm});
          }
          const Message& msg = ch.sent[static_cast<size_t>(posted[su])];
          if (msg.taken < 0) return true;  // waits for the receiver
          end = msg.taken;
          posted[su] = -1;
          break;
        }
        case Op::recv_activation:
        case Op::recv_gradient: {
          const bool fwd = in.op == Op::recv_activation;
          const int from = fwd ? s - 1 : s + 1;
          if (from < 0 || from >= p) {
            sim.mismatches.push_back(where(s, pos[su], in) + ": there is no stage " +
                                     std::to_string(from) + " to receive from");
            return false;
          }
          Channel& q = fwd ? act[static_cast<size_t>(from)] : grad[su];
          if (q.empty()) return true;  // waits
          Message& msg = q.sent[q.next];
          if (msg.micro != in.micro) {
            sim.mismatches.push_back(
                where(s, pos[su], in) + ": the next " + (fwd ? "activation" : "gradient") +
                " stage " + std::to_string(from) + " sends is for micro-batch " +
                std::to_string(msg.micro) + " (sends and receives pair in order)");
            return false;
          }
          end = std::max(t, msg.arrival);
          msg.taken = end;
          ++q.next;
          progressed = true;  // its sender may go on
          break;
        }
        default: {
          const double c = costs.of(in.op);
          end = t + c;
          r.busy += c;
          held[su].apply(in.op, r);
        }
      }
      r.timeline.push_back({in, t, end});
      clock[su] = end;
      ++pos[su];
      progressed = true;
    }
    return true;
  };

  for (;;) {
    bool progressed = false, done = true;
    for (int s = 0; s < p; ++s) {
      if (!run(s, progressed)) return sim;
      done = done && pos[static_cast<size_t>(s)] == lists[static_cast<size_t>(s)].size();
    }
    if (done) break;
    if (!progressed) {
      sim.deadlocked = true;
      for (int s = 0; s < p; ++s) {
        const auto su = static_cast<size_t>(s);
        if (pos[su] < lists[su].size()) sim.blocked.push_back({s, pos[su], lists[su][pos[su]]});
      }
      return sim;
    }
  }

  for (int s = 0; s < p; ++s) {
    const auto su = static_cast<size_t>(s);
    auto leftover = [&](const Channel& q, int from, int to, const char* what) {
      for (size_t i = q.next; i < q.sent.size(); ++i) {
        const Message& m = q.sent[i];
        sim.mismatches.push_back("stage " + std::to_string(from) + " sends the " + what +
                                 " of micro-batch " + std::to_string(m.micro) + " that stage " +
                                 std::to_string(to) + " never receives");
      }
    };
    leftover(act[su], s, s + 1, "activation");
    leftover(grad[su], s + 1, s, "gradient");
  }
  if (!sim.mismatches.empty()) return sim;

  double idle = 0;
  for (StageReport& r : sim.stages) {
    r.finish = r.timeline.empty() ? 0 : r.timeline.back().end;
    sim.makespan = std::max(sim.makespan, r.finish);
  }
  for (const StageReport& r : sim.stages) idle += sim.makespan - r.busy;
  sim.bubble_fraction = sim.makespan > 0 ? idle / (p * sim.makespan) : 0;
  return sim;
}

std::string chart(const Simulation& sim, double slot) {
  ZERO_REQUIRE(slot > 0, "pipeline chart: slot must be positive");
  const auto cells = static_cast<size_t>(std::ceil(sim.makespan / slot - 1e-9));
  std::string out;
  for (size_t s = 0; s < sim.stages.size(); ++s) {
    std::vector<std::string> row(cells, "  . ");
    for (const Event& e : sim.stages[s].timeline) {
      const Op op = e.in.op;
      const bool pass = op == Op::forward || op == Op::backward_input ||
                        op == Op::backward_weight || op == Op::backward;
      if (!pass || e.end <= e.start) continue;  // waits on receives show as idle
      std::string label = to_string(e.in);
      if (label.size() < 4) label.append(4 - label.size(), ' ');
      const auto first = static_cast<size_t>(std::floor(e.start / slot + 1e-9));
      const auto last = static_cast<size_t>(std::ceil(e.end / slot - 1e-9));
      for (size_t c = first; c < last && c < cells; ++c) row[c] = label;
    }
    out += "stage " + std::to_string(s) + ":";
    for (const std::string& c : row) out += c;
    out += "\n";
  }
  return out;
}

}  // namespace zero::pipeline
