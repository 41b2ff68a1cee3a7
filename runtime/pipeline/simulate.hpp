// A discrete-event simulator of one step of a pipeline schedule: the p stages' instruction lists
// run as p processes with given pass costs, and neighbours exchange tensors by matched messages.
//
// The communication model is by default the executor's: a send is posted and the stage goes on
// (isend; the message arrives `comm` time units later); a receive waits until the matching
// message has arrived (irecv posted early, waited on at that point of the list). Sends and receives pair in
// order on each (sender, receiver, activation|gradient) channel, as MPI's non-overtaking rule
// pairs them for one tag. So a deadlock here is a cycle of receives, which no asynchrony in the
// executor can break.
//
// Reports whether the lists deadlock (and where each stuck stage waits), a message that pairs
// with the wrong receive or is never received, every stage's timeline, the makespan, the bubble
// fraction and each stage's peak of micro-batches held for backward. Pure: no threads, no clocks.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "runtime/pipeline/schedule.hpp"

namespace zero::pipeline {

// Time of each instruction kind, in any unit. Receives and sends cost nothing on the stage
// itself: their cost is `comm`, the delay from a send's post to the message's arrival.
struct Costs {
  double forward = 1;
  double backward_input = 1;
  double backward_weight = 1;
  std::optional<double> backward;  // the joint backward; default backward_input + backward_weight
  double load = 0;
  double reduce = 0;
  double step = 0;
  double comm = 0;

  double of(Op op) const;  // a pass's compute time (0 for sends and receives)
};

struct Event {
  Instruction in;
  double start;  // when the stage reached the instruction
  double end;    // when it finished; for a receive, when the message was there
};

struct StageReport {
  std::vector<Event> timeline;  // every instruction the stage ran, in list order
  double busy = 0;              // time spent in passes (load, F, B, W, backward, reduce, step)
  double finish = 0;            // the end of its last instruction
  // Peaks over the step, counted in micro-batches:
  int peak_activations = 0;     // forward done, input gradient (B or joint backward) not yet
  int peak_weight_pending = 0;  // B done, W not yet: tensors W still needs
  int peak_in_flight = 0;       // forward done, W (or joint backward) not yet: the two together
};

// A stage that cannot go on: it waits at `index` of its list, at a receive for a message never
// sent (or, with synchronous sends, at a send for a receive never reached).
struct Blocked {
  int stage;
  size_t index;
  Instruction in;
};

struct Simulation {
  bool deadlocked = false;
  std::vector<Blocked> blocked;         // when deadlocked: every unfinished stage
  std::vector<std::string> mismatches;  // a receive met another micro-batch's message, a stage
                                        // sent to or received from no neighbour, or a message
                                        // was never received; the simulation stops at the first
  std::vector<StageReport> stages;      // complete only when ok()
  double makespan = 0;                  // the last stage's finish
  double bubble_fraction = 0;           // idle time / (p x makespan)

  bool ok() const { return !deadlocked && mismatches.empty(); }
  // What went wrong, one line per stuck stage or mismatch ("" when ok()).
  std::string failure() const;
};

// How a send behaves. asynchronous: posted and the stage goes on (the executor's isend; the
// default). synchronous: the stage waits until the receiver has taken the message (MPI_Ssend,
// or a large MPI_Send under the rendezvous protocol): for showing which lists need asynchrony.
enum class Sends { asynchronous, synchronous };

Simulation simulate(const std::vector<Stage>& stages, const Costs& costs = {},
                    Sends sends = Sends::asynchronous);
// Each stage with its own pass costs (per_stage[s]; a message takes its sender's `comm`): a cut
// whose stages cost different amounts, where the slower stage sets the pace and the faster one
// waits for it (which the one-cost form cannot show).
Simulation simulate_per_stage(const std::vector<Stage>& stages, const std::vector<Costs>& per_stage,
                              Sends sends = Sends::asynchronous);

// A text picture of the timelines, one row per stage, `slot` time units per cell (4 characters:
// the pass and its micro-batch, "." idle). For docs and failing tests; passes shorter than a
// slot are not drawn faithfully.
std::string chart(const Simulation& sim, double slot = 1);

}  // namespace zero::pipeline
