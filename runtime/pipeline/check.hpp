// The structural rules every schedule's lists must keep, checked without running them. The
// executor checks a schedule once before its first step (a broken list is an error naming the
// stage and instruction, not a hang); the tests check every schedule with it, and simulate()
// checks what it cannot: deadlock, timing, memory.
#pragma once

#include <string>
#include <vector>

#include "runtime/pipeline/schedule.hpp"

namespace zero::pipeline {

// One line per broken rule, naming the stage, micro-batch and instruction; empty when the p lists
// (stage 0 first) for `micro_batches` micro-batches keep all of:
//   - every micro-batch has exactly one F and either one joint backward or one B and one W, in
//     the order F, B, W; no instruction names a micro-batch outside 0..m-1;
//   - stage 0 has no activation receive nor gradient send, the last stage no activation send nor
//     gradient receive; every other stage has exactly one of each per micro-batch;
//   - a receive's next pass (skipping other communication and loads) is the pass that consumes
//     it, a send's previous pass is the one that produced it;
//   - the first and last stages load each micro-batch once, right before its F; others never;
//   - one reduce after the stage's last backward or W, then one step, both with micro -1;
//   - on each channel, the sender's sends and the receiver's receives name the same
//     micro-batches in the same order.
std::vector<std::string> check_schedules(const std::vector<Stage>& stages, int micro_batches);

}  // namespace zero::pipeline
