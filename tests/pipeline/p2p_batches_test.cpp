// The executor's pairs of sends and receives (runtime/pipeline/p2p_batches.hpp): where they are,
// and that with them every schedule's lists complete on a transport that buffers nothing (NCCL
// past its buffers), at the first step (activation header, then data) and after it; without them
// 1F1B and ZB-H1 deadlock there for every p, m >= 2 (the check can fail, and the pairs are why
// the executor runs on NCCL), while GPipe does not need them.
#include <catch2/catch_test_macros.hpp>

#include "runtime/pipeline/p2p_batches.hpp"
#include "runtime/pipeline/schedule.hpp"

using namespace zero::pipeline;

TEST_CASE("p2p batches: a send takes the next receive from the same neighbour, loads skipped") {
  // Stage 1 of 2 (the last), 1F1B: send_grad0, load1, recv_act1 are one batch.
  const Stage last = one_f_one_b(2, 4, 1);
  for (size_t i = 0; i < last.size(); ++i) {
    const auto k = paired_receive(last, i);
    if (last[i].op != Op::send_gradient) {
      CHECK(!k);
      continue;
    }
    INFO(to_string(last[i]));
    if (last[i].micro < 3) {
      REQUIRE(k);
      CHECK(last[*k] == Instruction{Op::recv_activation, last[i].micro + 1});
      for (size_t j = i + 1; j < *k; ++j) CHECK(last[j].op == Op::load);
    } else {
      CHECK(!k);  // the last gradient: nothing follows
    }
  }
  // Stage 0 of 2: send_act(j) is followed by F(j+1) during warm-up (no pair), then by recv_grad.
  const Stage first = one_f_one_b(2, 4, 0);
  int pairs = 0;
  for (size_t i = 0; i < first.size(); ++i)
    if (const auto k = paired_receive(first, i)) {
      CHECK(first[i].op == Op::send_activation);
      CHECK(first[*k].op == Op::recv_gradient);
      CHECK(*k == i + 1);
      ++pairs;
    }
  CHECK(pairs == 3);  // send_act1..3 with recv_grad0..2
}

TEST_CASE("p2p batches: every schedule completes unbuffered with the pairs, 1F1B and ZB-H1 not without") {
  for (const NamedSchedule& ns : known_schedules())
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {1, 2, 3, 4, 5, 8, 16}) {
        const auto lists = all_stages(ns.fn, p, m);
        INFO(ns.name << " p=" << p << " m=" << m);
        for (bool first_step : {true, false}) {
          const StreamCheck paired = check_unbuffered(lists, Pairing::executor, first_step);
          INFO("first step " << first_step << ": " << paired.where);
          CHECK(!paired.deadlocked);
        }
        const StreamCheck alone = check_unbuffered(lists, Pairing::none, false);
        const bool needs_pairs = std::string(ns.name) != "gpipe" && p >= 2 && m >= 2;
        CHECK(alone.deadlocked == needs_pairs);
      }
}
