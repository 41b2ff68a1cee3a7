// Pipeline schedules as data: a schedule is a pure function from (stages p, micro-batches m,
// stage id s) to the list of typed instructions stage s runs in one training step, in order.
// One executor interprets the list; nothing here touches a model, a device or MPI, so a schedule
// is tested (and simulated, simulate.hpp) on its own. docs/pipeline.md, "Schedules", says what
// each schedule does and why its sends and receives sit where they do.
//
// Conventions every schedule here keeps (check_schedules() in check.hpp verifies them):
//   - stage 0 holds the first Units and stage p-1 the last (the loss); activations flow to s+1,
//     their gradients to s-1;
//   - a receive sits right before the pass that needs its tensor and a send right after the pass
//     that produces it, so the executor posts the receive (irecv) there and waits on it at the
//     pass, and posts the send (isend) without waiting: sends never block the list;
//   - load(mb) sits right before F(mb) on the first stage (inputs) and on the last (labels);
//   - every micro-batch gets exactly one F and either one joint backward or one B and one W,
//     in that order; `reduce` follows the stage's last backward or W, `step` follows `reduce`.
// Thread-safety: pure functions of their arguments.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zero::pipeline {

enum class Op {
  load,             // fetch micro-batch `micro`'s inputs (first stage) or labels (last stage)
  forward,          // F: the stage's Units forward on `micro`
  backward_input,   // B: gradient with respect to the stage's input (what the previous stage needs)
  backward_weight,  // W: gradient with respect to the stage's weights (needs B's saved tensors)
  backward,         // B and W together, for schedules (and Units) that do not split them
  send_activation,  // F's output of `micro` to stage s+1
  recv_activation,  // stage s-1's F output of `micro`: the input of this stage's F
  send_gradient,    // B's input gradient of `micro` to stage s-1
  recv_gradient,    // stage s+1's input gradient of `micro`: the seed of this stage's B
  reduce,           // hand the stage's accumulated gradients to the data-parallel reduction
  step,             // the optimizer step of the stage's parameters
};

struct Instruction {
  Op op;
  int micro = -1;  // the micro-batch, 0 .. m-1; -1 for reduce and step
  friend bool operator==(const Instruction&, const Instruction&) = default;
};

using Stage = std::vector<Instruction>;  // one stage's list for one step

// "forward", "backward_input", ... (the enum's names).
const char* op_name(Op op);
// Short form for charts and messages: "F3", "B3", "W3", "BW3", "L3", "send_act3", "recv_grad3",
// "reduce", "step".
std::string to_string(const Instruction& in);

// GPipe (fill-drain): every micro-batch forward, then every joint backward in reverse order
// (the last micro-batch's activations are the freshest on the last stage). Holds m micro-batches'
// activations on every stage; bubble (p-1)/(m+p-1) of the step.
Stage gpipe(int stages, int micro_batches, int stage);

// 1F1B (PipeDream-flush, DeepSpeed's TrainSchedule, Megatron's non-interleaved schedule):
// min(p-s-1, m) warm-up forwards, then one forward and one joint backward alternately, then the
// remaining backwards. Same bubble as GPipe, at most min(p-s, m) micro-batches' activations.
Stage one_f_one_b(int stages, int micro_batches, int stage);

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B's order of F and B with
// the backward split, and stage s's W passes delayed by s micro-batches (W(j-s) right after B(j),
// the rest after the last B), so B passes travel up the pipeline one B-time per stage and the
// delayed W passes fill the cool-down. Activations (F done, B not) at most min(p-s, m) as 1F1B;
// W-pending micro-batches at most min(s+1, m); F done and W not at most min(p, m) on every stage.
// Bubble with unit costs: see docs/pipeline.md (a third of 1F1B's when m >= p).
Stage zb_h1(int stages, int micro_batches, int stage);

using ScheduleFn = Stage (*)(int stages, int micro_batches, int stage);

struct NamedSchedule {
  const char* name;  // the config's "schedule" value
  ScheduleFn fn;
};

// Every schedule, in the order gpipe, 1f1b, zb-h1.
std::span<const NamedSchedule> known_schedules();

// The schedule called `name`. An unknown name throws zero::Error naming `where` (e.g. the config
// file and JSON path), the name, and the known names.
ScheduleFn schedule_by_name(std::string_view name, std::string_view where = "pipeline schedule");

// All p stages' lists of one schedule, stage 0 first.
std::vector<Stage> all_stages(ScheduleFn fn, int stages, int micro_batches);

}  // namespace zero::pipeline
