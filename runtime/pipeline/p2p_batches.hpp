// How the pipeline executor groups a stage's sends and receives into batches, and a check that a
// set of lists cannot deadlock on a transport that buffers nothing (NCCL past its buffers).
//
// The rule (docs/pipeline.md, "Pairs, for NCCL"): a send followed in the list by the receive from
// the same neighbour, with only `load`s between (send_activation then recv_gradient,
// send_gradient then recv_activation), is posted together with it as one batch_send_recv; every
// other send or receive is a batch of its own. On NCCL a stage's batches run one after another
// on the pipeline communicator's stream, and a lone send may block that stream until the peer's
// matching receive runs, so the order of batches on neighbouring stages must interlock.
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>

#include "runtime/pipeline/schedule.hpp"

namespace zero::pipeline {

// For the send at `send` (send_activation or send_gradient), the index of the receive the
// executor posts with it, if any. Any other instruction: none.
std::optional<size_t> paired_receive(const Stage& list, size_t send);

// How the transfers are grouped: `executor` as above; `none` every send and receive alone (what
// the executor did before the pairs, kept to show that the check can fail).
enum class Pairing { none, executor };

struct StreamCheck {
  bool deadlocked = false;
  std::string where;  // when deadlocked: each stuck stage and the instruction its batch came from
};

// Runs the stages' transfers under the strictest transport: each stage's batches in list order on
// one stream, an operation completing only while the peer's current batch holds its match (no
// buffering, no eager sends), a batch retiring once all its operations have completed. Compute
// always finishes, so only the transfers can block. An activation is two messages, header and
// data, sent in one batch; `first_step`: the receiver posts the data alone at F, after the header
// (the executor's first step, before it knows the shape), else with the header.
StreamCheck check_unbuffered(std::span<const Stage> stages, Pairing pairing, bool first_step);

}  // namespace zero::pipeline
