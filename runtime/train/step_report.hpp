// What zero-train reports about its steps: the JSON lines of the metrics file, the log line
// every steps_per_print steps (with the time breakdown under wall_clock_breakdown) and the
// progress bar between them.
//
// Printing is rank 0's (log::info prints there only; the bar is drawn only where the caller
// asks); nothing here is collective.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/ledger.hpp"
#include "runtime/engine/engine.hpp"

namespace zero::train {

// Seconds on the steady clock (differences only).
double now_seconds();

// One line of the metrics file. JSON has no NaN or infinity, and a strict parser refuses them:
// a number that is not finite is written as null, and the line gets "non_finite", naming each
// such key with what it was ("nan", "inf", "-inf"). Finite numbers are written exactly (%.17g
// for doubles, nlohmann's shortest round trip otherwise), so runs compare bit for bit.
std::string metrics_line(nlohmann::json j);

// A pipeline step's measured bubble (StepStats::time.bubble(), p2p_wait / step, per rank): the
// mean over every rank (each stage of each pipeline) and the largest.
struct Bubble {
  double mean = 0, max = 0;
};

// What a step of a run on a process grid adds to the report.
struct GridStep {
  std::optional<Bubble> bubble;  // with pipeline stages
  // With tensor slices: the bytes this rank sent on its tensor communicator in the step (the
  // blocks' all-reduces and the rest, counted as a ring algorithm sends them:
  // coll::CountingCommunicator), the same on every rank of a tensor group.
  std::optional<double> tensor_bytes;
  // With the optimizer state on NVMe: this rank's swap bytes read and written since the last
  // step's report (completed I/O: a write-back still running at the report counts in the next).
  struct Nvme {
    uint64_t read = 0, written = 0;
  };
  std::optional<Nvme> nvme;
};

// The figures a run's step reports derive from, fixed for the run.
struct StepReport {
  // Model FLOPs per token (models::gpt_flops_per_token: 6 x the matmul parameters + attention,
  // i.e. forward 2 and backward 4 FLOPs per parameter per token; recomputation by activation
  // checkpointing is not counted, as MFU is defined).
  double flops_per_token = 0;
  // The device's dense 16-bit peak (core/peak_flops.hpp), on a GPU whose peak we know: MFU =
  // model FLOP/s / peak.
  std::optional<double> peak;
  bool timers = false;             // wall_clock_breakdown: report the step's time breakdown
  bool offload_optimizer = false;  //   and, with it, the host AdamW's

  // The metrics-file line of step `step`: `loss` the mean over every rank, `tokens` trained by
  // every rank in this step, `seconds` its duration, `snap` this rank's ledger after it;
  // `grid` with pipeline stages ("bubble", "bubble_max") or tensor slices ("tensor_comm_bytes");
  // with NVMe offload "nvme_read_bytes", "nvme_written_bytes" and the ledger's "nvme_bytes".
  std::string metrics(long long step, double loss, const StepStats& st, double tokens, double seconds,
                      const LedgerSnapshot& snap, const GridStep& grid = {}) const;
  // The log line(s) of step `step` of `steps`; `seconds` is the mean step time since the last
  // printed step, so throughput covers the steps in between too; `grid` as above (this step's).
  void print(long long step, long long steps, double loss, const StepStats& st, double tokens, double seconds,
             const LedgerSnapshot& snap, const GridStep& grid = {}) const;
};

// Redraws the progress bar (carriage return, no newline) on stdout.
void draw_progress_bar(long long step, long long steps, double loss);
// Blanks the bar's line, so that a log line can take its place.
void clear_progress_bar();

}  // namespace zero::train
