// Schedules as data (runtime/pipeline/schedule.hpp), their structural check and the simulator:
// for every schedule and every (p, m) of the grid below (m < p included), the lists keep the
// rules, run without deadlock, respect the dependencies between stages, hold at most the
// schedule's bound of micro-batches, and waste exactly the formula's bubble with unit costs.
// The planted-bug cases show each check can fail.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "core/error.hpp"
#include "runtime/pipeline/check.hpp"
#include "runtime/pipeline/schedule.hpp"
#include "runtime/pipeline/simulate.hpp"

using namespace zero::pipeline;
using Catch::Matchers::ContainsSubstring;

namespace {

constexpr int kStages[] = {1, 2, 3, 4, 8};
constexpr int kMicro[] = {1, 2, 3, 4, 8, 16};

std::string describe(const char* name, int p, int m) {
  return std::string(name) + " p=" + std::to_string(p) + " m=" + std::to_string(m);
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += s + "\n";
  return out;
}

// The simulated [start, end) of each pass, by (stage, op, micro).
using PassTimes = std::map<std::tuple<int, Op, int>, std::pair<double, double>>;
PassTimes pass_times(const Simulation& sim) {
  PassTimes t;
  for (size_t s = 0; s < sim.stages.size(); ++s)
    for (const Event& e : sim.stages[s].timeline) t[{static_cast<int>(s), e.in.op, e.in.micro}] = {e.start, e.end};
  return t;
}

// Dependencies read from the simulated timelines, independently of how the simulator enforces
// them: on each stage F < B < W in time; F on stage s starts after stage s-1's F of the same
// micro-batch ended; B (or the joint backward) on stage s after stage s+1's ended.
void check_dependencies(const Simulation& sim, int p, int m) {
  const PassTimes t = pass_times(sim);
  auto find = [&](int s, Op op, int mb) -> const std::pair<double, double>* {
    auto it = t.find({s, op, mb});
    return it == t.end() ? nullptr : &it->second;
  };
  for (int s = 0; s < p; ++s)
    for (int mb = 0; mb < m; ++mb) {
      INFO("stage " << s << " micro-batch " << mb);
      const auto* f = find(s, Op::forward, mb);
      const auto* b = find(s, Op::backward_input, mb);
      const auto* w = find(s, Op::backward_weight, mb);
      if (!b) b = find(s, Op::backward, mb);
      REQUIRE(f);
      REQUIRE(b);
      CHECK(b->first >= f->second);
      if (w) CHECK(w->first >= b->second);
      if (s > 0) CHECK(f->first >= find(s - 1, Op::forward, mb)->second);
      if (s + 1 < p) {
        const auto* up = find(s + 1, Op::backward_input, mb);
        if (!up) up = find(s + 1, Op::backward, mb);
        REQUIRE(up);
        CHECK(b->first >= up->second);
      }
    }
}

// Only the passes (F, B, W, BW) of a list, for comparing orders.
std::vector<std::string> passes(const Stage& list) {
  std::vector<std::string> out;
  for (const Instruction& in : list)
    if (in.op == Op::forward || in.op == Op::backward_input || in.op == Op::backward_weight ||
        in.op == Op::backward)
      out.push_back(to_string(in));
  return out;
}

}  // namespace

TEST_CASE("schedule: every schedule keeps the structural rules, for p up to 8 and m from 1 to 16") {
  for (const NamedSchedule& sch : known_schedules())
    for (int p : kStages)
      for (int m : kMicro) {
        INFO(describe(sch.name, p, m));
        const std::vector<Stage> lists = all_stages(sch.fn, p, m);
        REQUIRE(lists.size() == static_cast<size_t>(p));
        const std::vector<std::string> problems = check_schedules(lists, m);
        CHECK(joined(problems) == "");
        // Counted here too, not only by the checker: each micro-batch's F, B and W (or joint
        // backward) exactly once per stage.
        for (const Stage& list : lists)
          for (int mb = 0; mb < m; ++mb) {
            auto n = [&](Op op) { return std::count(list.begin(), list.end(), Instruction{op, mb}); };
            CHECK(n(Op::forward) == 1);
            const bool joint = sch.fn != &zb_h1;
            CHECK(n(Op::backward) == (joint ? 1 : 0));
            CHECK(n(Op::backward_input) == (joint ? 0 : 1));
            CHECK(n(Op::backward_weight) == (joint ? 0 : 1));
          }
      }
}

TEST_CASE("schedule: every schedule runs without deadlock and respects the dependencies between stages") {
  for (const NamedSchedule& sch : known_schedules())
    for (int p : kStages)
      for (int m : kMicro) {
        INFO(describe(sch.name, p, m));
        const Simulation sim = simulate(all_stages(sch.fn, p, m));
        REQUIRE(sim.failure() == "");
        REQUIRE(sim.ok());
        check_dependencies(sim, p, m);
      }
}

TEST_CASE("schedule: with synchronous sends 1F1B and ZB-H1 deadlock, GPipe does not") {
  // Why the executor posts sends asynchronously (docs/pipeline.md): in 1F1B's steady state
  // stage s sends an activation and then waits for a gradient, while stage s+1 sends that
  // gradient before it receives the activation.
  for (int p : kStages)
    for (int m : kMicro) {
      INFO("p=" << p << " m=" << m);
      const bool cycle = p >= 2 && m >= 2;  // one micro-batch never has both in flight
      CHECK(simulate(all_stages(gpipe, p, m), {}, Sends::synchronous).ok());
      CHECK(simulate(all_stages(one_f_one_b, p, m), {}, Sends::synchronous).deadlocked == cycle);
      CHECK(simulate(all_stages(zb_h1, p, m), {}, Sends::synchronous).deadlocked == cycle);
    }
  const Simulation sim = simulate(all_stages(one_f_one_b, 2, 2), {}, Sends::synchronous);
  CHECK(sim.failure() ==
        "deadlock: no stage can go on\n"
        "  stage 0 instruction 5 (send_act1) waits for a receive never reached\n"
        "  stage 1 instruction 4 (send_grad0) waits for a receive never reached\n");
}

TEST_CASE("schedule: activations held stay within each schedule's bound") {
  for (int p : kStages)
    for (int m : kMicro)
      for (int s = 0; s < p; ++s) {
        INFO("p=" << p << " m=" << m << " stage " << s);
        const Simulation g = simulate(all_stages(gpipe, p, m));
        const Simulation o = simulate(all_stages(one_f_one_b, p, m));
        const Simulation z = simulate(all_stages(zb_h1, p, m));
        const auto su = static_cast<size_t>(s);
        // GPipe: every forward before any backward, so all m on every stage.
        CHECK(g.stages[su].peak_activations == m);
        // 1F1B: p-s-1 warm-up forwards plus the one before the first backward.
        CHECK(o.stages[su].peak_activations == std::min(p - s, m));
        CHECK(o.stages[su].peak_weight_pending == 0);
        // ZB-H1: 1F1B's activations; W delayed by s micro-batches holds s+1 for W; together p.
        CHECK(z.stages[su].peak_activations == std::min(p - s, m));
        CHECK(z.stages[su].peak_weight_pending == std::min(s + 1, m));
        CHECK(z.stages[su].peak_in_flight == std::min(p, m));
      }
}

TEST_CASE("schedule: the bubble with unit costs is the formula, exactly") {
  // Costs are small integers, so makespans are exact in double; the fraction is compared after
  // one division on each side, hence the 1e-12 margin.
  constexpr double kDivision = 1e-12;
  Costs unit;  // F = B = W = 1, joint backward B + W = 2, communication 0
  Costs joint2;
  joint2.backward = 2;  // F = 1, B+W = 2 given as the joint pass's own cost
  for (int p : kStages)
    for (int m : kMicro) {
      INFO("p=" << p << " m=" << m);
      for (const Costs& c : {unit, joint2})
        for (ScheduleFn fn : {&gpipe, &one_f_one_b}) {
          const Simulation sim = simulate(all_stages(fn, p, m), c);
          CHECK(sim.makespan == 3.0 * (m + p - 1));
          CHECK(std::abs(sim.bubble_fraction - double(p - 1) / (m + p - 1)) < kDivision);
        }
      // ZB-H1: T = 3m + p - 1 + max(0, p - m) (docs/pipeline.md derives it); every stage does
      // 3m units of work, so the bubble is (T - 3m) / T.
      const Simulation z = simulate(all_stages(zb_h1, p, m), unit);
      const int T = 3 * m + p - 1 + std::max(0, p - m);
      CHECK(z.makespan == T);
      CHECK(std::abs(z.bubble_fraction - double(T - 3 * m) / T) < kDivision);
      if (m >= p) {
        // A third of 1F1B's idle time per stage: p-1 against 3(p-1).
        const Simulation o = simulate(all_stages(one_f_one_b, p, m), unit);
        for (size_t s = 0; s < z.stages.size(); ++s) {
          CHECK(z.makespan - z.stages[s].busy == p - 1);
          CHECK(o.makespan - o.stages[s].busy == 3 * (p - 1));
        }
      }
    }
}

TEST_CASE("schedule: uneven costs and communication time: the critical paths") {
  // F=1, B=2, W=1 and a link of 0.5: all in halves, exact in double.
  Costs c;
  c.forward = 1;
  c.backward_input = 2;
  c.backward_weight = 1;
  for (int p : kStages) {
    INFO("p=" << p);
    // Without communication 1F1B's bubble is (p-1)(F+B+W) per stage, for any costs.
    c.comm = 0;
    for (int m : {4, 8, 16}) CHECK(simulate(all_stages(one_f_one_b, p, m), c).makespan == (m + p - 1) * 4.0);
    // One micro-batch is one chain through every stage and back over 2(p-1) links; ZB-H1's
    // chain ends with stage 0's W only, the others' with a joint backward per stage.
    c.comm = 0.5;
    CHECK(simulate(all_stages(gpipe, p, 1), c).makespan == p * 4.0 + (p - 1) * 1.0);
    CHECK(simulate(all_stages(one_f_one_b, p, 1), c).makespan == p * 4.0 + (p - 1) * 1.0);
    CHECK(simulate(all_stages(zb_h1, p, 1), c).makespan == p * 3.0 + 1 + (p - 1) * 1.0);
  }
}

TEST_CASE("schedule: per-stage costs: the slower stage sets the pace") {
  // The same costs for every stage give the one-cost simulation, exactly.
  Costs c;
  c.forward = 1;
  c.backward_input = 2;
  c.backward_weight = 1;
  c.comm = 0.5;
  for (const NamedSchedule& sch : known_schedules())
    for (int p : {2, 4})
      for (int m : {1, 4, 8}) {
        INFO(describe(sch.name, p, m));
        const std::vector<Stage> lists = all_stages(sch.fn, p, m);
        CHECK(simulate_per_stage(lists, std::vector<Costs>(static_cast<size_t>(p), c)).makespan == simulate(lists, c).makespan);
      }
  // 1F1B on 2 stages, stage 1 twice as slow (F 2, joint backward 4), no link time: stage 1 runs
  // back to back from t = 1 (stage 0's F0) for m cycles of 6, then stage 0's last backward (2).
  Costs fast, slow;
  fast.forward = 1;
  fast.backward = 2;
  fast.comm = 0;
  slow.forward = 2;
  slow.backward = 4;
  slow.comm = 0;
  for (int m : {2, 4, 8}) {
    INFO("m=" << m);
    const Simulation sim = simulate_per_stage(all_stages(one_f_one_b, 2, m), std::vector<Costs>{fast, slow});
    REQUIRE(sim.ok());
    CHECK(sim.makespan == 6.0 * m + 3);
    CHECK(sim.stages[1].busy == 6.0 * m);
  }
  CHECK_THROWS_WITH(simulate_per_stage(all_stages(one_f_one_b, 2, 2), std::vector<Costs>{fast}),
                    ContainsSubstring("1 cost sets for 2 stages"));
}

TEST_CASE("schedule: ZB-H1 on 2 stages and 4 micro-batches is the order derived by hand") {
  // Derived on paper with unit costs: the last stage runs F, B at once and delays each W by one
  // micro-batch; stage 0 runs W right after B and its wait for B0 is its only bubble.
  CHECK(passes(zb_h1(2, 4, 0)) ==
        std::vector<std::string>{"F0", "F1", "B0", "W0", "F2", "B1", "W1", "F3", "B2", "W2", "B3", "W3"});
  CHECK(passes(zb_h1(2, 4, 1)) ==
        std::vector<std::string>{"F0", "B0", "F1", "B1", "W0", "F2", "B2", "W1", "F3", "B3", "W2", "W3"});
  // Stage 1's list in full: loads (labels) and receives before F, sends after B, then reduce, step.
  const Stage s1 = zb_h1(2, 1, 1);
  CHECK(s1 == Stage{{Op::load, 0}, {Op::recv_activation, 0}, {Op::forward, 0}, {Op::backward_input, 0},
                    {Op::send_gradient, 0}, {Op::backward_weight, 0}, {Op::reduce, -1}, {Op::step, -1}});
  const Simulation sim = simulate(all_stages(zb_h1, 2, 4));
  CHECK(chart(sim) ==
        "stage 0:F0  F1    . B0  W0  F2  B1  W1  F3  B2  W2  B3  W3  \n"
        "stage 1:  . F0  B0  F1  B1  W0  F2  B2  W1  F3  B3  W2  W3  \n");
}

TEST_CASE("schedule: names map to schedules; unknown names and bad arguments are refused") {
  CHECK(schedule_by_name("gpipe") == &gpipe);
  CHECK(schedule_by_name("1f1b") == &one_f_one_b);
  CHECK(schedule_by_name("zb-h1") == &zb_h1);
  CHECK_THROWS_WITH(schedule_by_name("zb-h2", "ds_config.json: zero_train.parallel.schedule"),
                    ContainsSubstring("ds_config.json: zero_train.parallel.schedule") &&
                        ContainsSubstring("\"zb-h2\"") &&
                        ContainsSubstring("use one of: gpipe, 1f1b, zb-h1"));
  CHECK_THROWS_AS(gpipe(0, 4, 0), zero::Error);
  CHECK_THROWS_AS(one_f_one_b(2, 0, 0), zero::Error);
  CHECK_THROWS_WITH(zb_h1(2, 4, 2), ContainsSubstring("stage 2 outside 0..1"));
}

// Planted bugs: each breaks one rule on an otherwise good list and must be reported, naming
// where. (Bugs planted in the schedule functions themselves are in the report of the change.)
TEST_CASE("schedule: planted bugs are caught by the check and the simulator") {
  SECTION("B before its F on a stage") {
    std::vector<Stage> l = all_stages(one_f_one_b, 2, 4);
    Stage& s1 = l[1];  // F0 BW0 ... on the last stage: swap them
    auto f = std::find(s1.begin(), s1.end(), Instruction{Op::forward, 0});
    auto b = std::find(s1.begin(), s1.end(), Instruction{Op::backward, 0});
    std::iter_swap(f, b);
    CHECK_THAT(joined(check_schedules(l, 4)), ContainsSubstring("stage 1, micro-batch 0: backward before forward"));
  }
  SECTION("W before its B; a receive far from the pass that needs it") {
    std::vector<Stage> l = all_stages(zb_h1, 2, 4);
    auto b = std::find(l[0].begin(), l[0].end(), Instruction{Op::backward_input, 2});
    auto w = std::find(l[0].begin(), l[0].end(), Instruction{Op::backward_weight, 2});
    std::iter_swap(b, w);
    auto r = std::find(l[1].begin(), l[1].end(), Instruction{Op::recv_activation, 3});
    l[1].erase(r);
    l[1].insert(l[1].begin(), Instruction{Op::recv_activation, 3});
    const std::string p = joined(check_schedules(l, 4));
    CHECK_THAT(p, ContainsSubstring("stage 0, micro-batch 2: W before B"));
    CHECK_THAT(p, ContainsSubstring("stage 1 instruction 0 (recv_act3): the next pass is not this micro-batch's F"));
  }
  SECTION("a W dropped, a forward duplicated") {
    std::vector<Stage> l = all_stages(zb_h1, 3, 4);
    l[2].erase(std::find(l[2].begin(), l[2].end(), Instruction{Op::backward_weight, 3}));
    l[0].insert(l[0].begin(), Instruction{Op::forward, 1});
    const std::string p = joined(check_schedules(l, 4));
    CHECK_THAT(p, ContainsSubstring("stage 2, micro-batch 3: 0 backward_weight, expected 1"));
    CHECK_THAT(p, ContainsSubstring("stage 0, micro-batch 1: 2 forward, expected 1"));
  }
  SECTION("two activation sends swapped: the pairs no longer match in order") {
    std::vector<Stage> l = all_stages(gpipe, 2, 4);
    auto a = std::find(l[0].begin(), l[0].end(), Instruction{Op::send_activation, 1});
    auto b = std::find(l[0].begin(), l[0].end(), Instruction{Op::send_activation, 2});
    std::iter_swap(a, b);
    const std::string p = joined(check_schedules(l, 4));
    CHECK_THAT(p, ContainsSubstring("stage 0 sends activations [0 2 1 3] but stage 1 receives [0 1 2 3]"));
    CHECK_THAT(p, ContainsSubstring("the previous pass is not this micro-batch's F"));
    const Simulation sim = simulate(l);
    CHECK_FALSE(sim.ok());
    CHECK_THAT(sim.failure(), ContainsSubstring("stage 1 instruction"));
    CHECK_THAT(sim.failure(), ContainsSubstring("is for micro-batch 2"));
  }
  SECTION("a receive moved before the send its peer waits for: deadlock, and where") {
    std::vector<Stage> l = all_stages(one_f_one_b, 2, 4);
    // Stage 0 waits for gradient 0 before sending activation 0: each stage waits for the other.
    auto r = std::find(l[0].begin(), l[0].end(), Instruction{Op::recv_gradient, 0});
    const Instruction moved = *r;
    l[0].erase(r);
    l[0].insert(std::find(l[0].begin(), l[0].end(), Instruction{Op::send_activation, 0}), moved);
    const Simulation sim = simulate(l);
    REQUIRE(sim.deadlocked);
    REQUIRE(sim.blocked.size() == 2);
    CHECK(sim.blocked[0].stage == 0);
    CHECK(sim.blocked[0].in == Instruction{Op::recv_gradient, 0});
    CHECK(sim.blocked[1].stage == 1);
    CHECK(sim.blocked[1].in == Instruction{Op::recv_activation, 0});
    CHECK_THAT(sim.failure(), ContainsSubstring("stage 0 instruction 2 (recv_grad0) waits"));
  }
  SECTION("a send nobody receives, a receive from no stage") {
    std::vector<Stage> l = all_stages(one_f_one_b, 2, 2);
    l[1].erase(std::find(l[1].begin(), l[1].end(), Instruction{Op::send_gradient, 1}));
    l[0].erase(std::find(l[0].begin(), l[0].end(), Instruction{Op::recv_gradient, 1}));
    l[0].push_back({Op::send_activation, 1});  // the second send of activation 1
    CHECK_THAT(simulate(l).failure(),
               ContainsSubstring("stage 0 sends the activation of micro-batch 1 that stage 1 never receives"));
    std::vector<Stage> one = all_stages(gpipe, 1, 1);
    one[0].insert(one[0].begin(), Instruction{Op::recv_activation, 0});
    CHECK_THAT(simulate(one).failure(), ContainsSubstring("there is no stage -1 to receive from"));
    CHECK_THAT(joined(check_schedules(one, 1)), ContainsSubstring("1 recv_activation, expected 0"));
  }
  SECTION("the step before the reduce") {
    std::vector<Stage> l = all_stages(zb_h1, 2, 2);
    std::iter_swap(l[0].end() - 1, l[0].end() - 2);
    CHECK_THAT(joined(check_schedules(l, 2)), ContainsSubstring("stage 0: step before reduce"));
  }
}
