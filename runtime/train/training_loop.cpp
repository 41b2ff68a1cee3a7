#include "runtime/train/training_loop.hpp"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/log.hpp"
#include "core/mpi_check.hpp"
#include "core/peak_flops.hpp"
#include "core/phase.hpp"
#include "core/tensor.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/step_guard.hpp"
#include "runtime/train/checkpoints.hpp"
#include "runtime/train/exit_codes.hpp"
#include "runtime/train/held_out_eval.hpp"
#include "runtime/train/rank_errors.hpp"
#include "runtime/train/run.hpp"
#include "runtime/train/startup.hpp"
#include "runtime/train/step_report.hpp"

namespace zero::train {
namespace {

// A batch read on the host, copied to the device on the compute stream; waits for the copies,
// which read `tb`.
Batch to_device(Run& run, const models::data::TokenBatch& tb) {
  Device& device = *run.device;
  Stream& stream = *run.stream;
  Batch b;
  b.inputs = Tensor::empty(device, Shape{tb.rows, tb.cols}, ScalarType::i32, MemCategory::activations);
  b.targets = Tensor::empty(device, Shape{tb.rows, tb.cols}, ScalarType::i32, MemCategory::activations);
  copy_from_host(device, stream, b.inputs, tb.inputs.data());
  copy_from_host(device, stream, b.targets, tb.targets.data());
  stream.synchronize();  // the copies read `tb`
  return b;
}

// The run's held-out set (empty without one), read so that a failure ends the job: the other
// ranks may be waiting in the evaluation's collectives.
HeldOutSet held_out_set(Run& run) {
  HeldOutSet held_out = run.data.has_eval() ? run.data.held_out() : HeldOutSet{};
  held_out.read = [&world = run.world, read = held_out.read](int64_t first, int count) {
    return read_or_end_job(world, "reading the held-out data", [&] { return read(first, count); });
  };
  return held_out;
}

// The held-out evaluation (runtime/train/held_out_eval.hpp) after step `step`: the fixed set, or
// its first --eval-sequences sequences, in chunks of the micro-batch spread over the ranks; the
// same loss on any world size. Logs it and writes its metrics line (collective). Returns false
// when the metrics line could not be written.
bool evaluate(Run& run, const HeldOutSet& held_out, long long step) {
  phase::Scope in_phase("evaluation");
  // With pipeline stages the chunks are spread over the data-parallel index: every stage of a
  // pipeline takes the same chunks (its rank in its stage's data group is the pipeline's data
  // index), and Engine::pipeline_evaluate passes each through the stages and hands every stage
  // the last stage's result.
  const HeldOutResult r = evaluate_held_out(
      held_out, run.flags.eval_sequences, run.B, /*collective_forward=*/run.options.stage == 3,
      run.pipe ? run.pipe->data_comm : run.world.comm(),
      [&](const models::data::TokenBatch& tb, std::vector<int32_t>* argmax) {
        return run.pipe && run.pipe->stage ? run.engine->pipeline_evaluate(to_device(run, tb), argmax)
                                           : run.engine->evaluate(to_device(run, tb), argmax);
      });
  // Exact match (addition task): a problem counts when every digit of its sum is the model's
  // most likely next token (teacher-forced; equal to greedy decoding for a causal model, see
  // AdditionTask::score).
  std::string match;
  if (r.problems > 0) {
    char b[96];
    std::snprintf(b, sizeof b, " | exact match %.1f%% of %lld held-out sums",
                  100.0 * static_cast<double>(r.correct) / static_cast<double>(r.problems),
                  static_cast<long long>(r.problems));
    match = b;
  }
  char line[1024];
  std::snprintf(line, sizeof line, "eval step %lld | held-out loss %.4f (%lld of %lld sequences)%s", step,
                r.loss, static_cast<long long>(r.sequences), static_cast<long long>(held_out.size),
                match.c_str());
  log::info(line);
  nlohmann::json j = {{"step", step}, {"eval_loss", r.loss}, {"eval_sequences", static_cast<long long>(r.sequences)}};
  if (r.problems > 0) j["eval_exact_match"] = static_cast<double>(r.correct) / static_cast<double>(r.problems);
  return run.write_metrics(metrics_line(j));
}

// What the evaluations will cover, said once before the first.
void announce_evaluation(const Run& run, const HeldOutSet& held_out) {
  const Flags& flags = run.flags;
  const int64_t n =
      flags.eval_sequences > 0 ? std::min<int64_t>(flags.eval_sequences, held_out.size) : held_out.size;
  char line[1024];
  std::snprintf(line, sizeof line,
                "eval: %lld of the %lld held-out sequences (%s), %d per forward pass, spread over %d %s",
                static_cast<long long>(n), static_cast<long long>(held_out.size),
                run.data.addition ? "the addition task's held-out problems, in the split's order"
                                  : "the --eval-data windows, in file order",
                run.B, run.D, run.pipe ? "pipeline(s)" : "rank(s)");
  log::info(line);
}

// Closes the metrics file on rank 0, where a failure to sync it surfaces (collective).
bool close_metrics(Run& run) {
  return on_all_ranks(run.world, "--metrics", [&] {
    if (run.metrics) run.metrics->close();
  });
}

// Why the run stopped before its end (StepGuard's paragraph), and which checkpoint is left: on
// stderr, rank 0.
void report_stop(const Run& run, const std::string& why) {
  if (!run.world.is_root()) return;
  const std::string& dir = run.flags.checkpoint_dir;
  std::string kept;
  if (!dir.empty()) {
    const std::optional<std::string> newest = checkpoint::latest(dir);
    kept = newest ? "\nThe newest checkpoint, " + dir + "/" + *newest + ", is kept."
                  : "\nNo checkpoint was saved in " + dir + ".";
  }
  std::fprintf(stderr, "zero-train: error: %s%s\n", why.c_str(), kept.c_str());
  std::fflush(stderr);
}

// Steps first_step..run.steps: each one's log line, metrics line, evaluation and checkpoint.
// 0 when every step ran, or kExitFailure.
int train_steps(Run& run, const HeldOutSet& held_out, long long first_step) {
  World& world = run.world;
  const Flags& flags = run.flags;
  Engine& engine = *run.engine;
  const int W = run.W, D = run.D, B = run.B, GA = run.GA, T = run.T;
  // This rank's data-parallel index: its rank, or with pipeline stages its pipeline's index.
  const int data_rank = run.pipe ? run.pipe->data_rank() : world.rank();
  const long long steps = run.steps;
  const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
  const bool bar = world.is_root() && (flags.progress == "on" ||
                                       (flags.progress == "auto" && ::isatty(STDOUT_FILENO) && !launched));
  const StepReport report{.flops_per_token = models::gpt_flops_per_token(run.shape),
                          .peak = peak_dense_16bit_flops(run.device->name()),
                          .timers = run.options.timers,
                          .offload_optimizer = run.options.offload_optimizer};

  if (first_step > steps)
    log::info("zero-train: the checkpoint is at step " + std::to_string(first_step - 1) +
              ", the run ends at " + std::to_string(steps) + ": nothing to train");
  double t_last = now_seconds();
  long long since = 0;
  Engine::NvmeTraffic nvme_last = engine.nvme_traffic(true);  // set-up's writes are no step's
  StepGuard guard(run.c.ours.max_consecutive_skipped_steps, first_step - 1);
  for (long long step = first_step; step <= steps; ++step) {
    phase::set_step(step);
    phase::set("training step");
    const double t_step = now_seconds();
    // Data index d of D reads sequences [((step-1) D + d) GA + m) B, + B): the batch rule's
    // order, the same with or without pipeline stages for the same data-parallel size.
    const auto load = [&](int m) {
      const int64_t first = ((static_cast<int64_t>(step - 1) * D + data_rank) * GA + m) * B;
      return to_device(run, read_or_end_job(world, "reading the training data",
                                            [&] { return run.data.train().batch(first, B, T); }));
    };
    // The tensor communicator's bytes before the step (set-up and evaluation are not a step's).
    const double tensor_sent = run.tensor_counter ? run.tensor_counter->traffic().ring_bytes() : 0.0;
    const StepStats st = run.pipe ? grid_train_step(run, load) : engine.step(load);
    const double dt_step = now_seconds() - t_step;
    ++since;
    // The mean loss over every rank's micro-batches (collective: every rank, every step); with
    // pipeline stages the last stages' losses, and the stages' bubbles.
    phase::set("the loss all-reduce");
    double loss = st.loss / W;
    GridStep grid;
    if (run.tensor_counter) grid.tensor_bytes = run.tensor_counter->traffic().ring_bytes() - tensor_sent;
    if (run.options.nvme.enabled() || !run.options.param_nvme_path.empty()) {
      // Since the last report, not since the step's start: the write-backs that finish between
      // steps (during the loss all-reduce, the report) belong to a step too.
      const Engine::NvmeTraffic n = engine.nvme_traffic();
      grid.nvme = GridStep::Nvme{.read = n.read - nvme_last.read, .written = n.written - nvme_last.written};
      nvme_last = n;
    }
    if (run.pipe) {
      const PipelineStepFigures f = pipeline_step_figures(run, st);
      loss = f.loss;
      if (run.pipe->stage) grid.bubble = Bubble{.mean = f.bubble_mean, .max = f.bubble_max};
    } else {
      ZERO_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &loss, 1, MPI_DOUBLE, MPI_SUM, world.comm()));
    }
    const LedgerSnapshot snap = run.device->ledger().snapshot();
    const double tokens = static_cast<double>(D) * GA * B * T;
    std::string metrics_text;
    if (world.is_root()) metrics_text = report.metrics(step, loss, st, tokens, dt_step, snap, grid);
    const bool print = step % run.c.steps_per_print == 0 || step == steps || step == first_step;
    if (bar && !print) draw_progress_bar(step, steps, loss);
    if (print) {
      if (bar) clear_progress_bar();
      const double t = now_seconds(), dt = (t - t_last) / static_cast<double>(since);
      report.print(step, steps, loss, st, tokens, dt, snap, grid);
      t_last = t;
      since = 0;
    }
    // After the log line, so that a failing metrics file still leaves this step on the screen.
    if (!run.write_metrics(metrics_text)) return kExitFailure;
    // A run that no longer trains stops here, before this step is evaluated or saved (every rank
    // sees the same loss and statistics, so all stop alike).
    std::optional<std::string> stop = guard.after_step(step, st, loss);
    if (!stop && step == steps) stop = guard.at_end(step);
    if (stop) {
      if (bar) std::printf("\n");
      report_stop(run, *stop);
      return kExitFailure;
    }
    if (flags.eval_interval > 0 && (step % flags.eval_interval == 0 || step == steps))
      if (!evaluate(run, held_out, step)) return kExitFailure;
    if (!flags.checkpoint_dir.empty() &&
        ((flags.save_interval > 0 && step % flags.save_interval == 0) || step == steps))
      if (!save_checkpoint(run, step)) return kExitFailure;
  }
  if (guard.counted_in_a_row() > 0)
    log::warn("zero-train: the last " + std::to_string(guard.not_trained_in_a_row()) +
              " step(s) did not train (non-finite gradients or loss); the last step that trained was " +
              std::to_string(guard.last_good_step()));
  return 0;
}

}  // namespace

int run_training(World& world, const Flags& flags) {
  const std::optional<config::Config> loaded = load_config(world, flags);
  if (!loaded) return kExitUsage;
  Run run(world, flags, *loaded);
  if (const int rc = set_up_run(run); rc != 0) return rc;
  if (!flags.checkpoint_dir.empty())
    if (const int rc = check_checkpoint_dir(world, flags, *run.engine); rc != 0) return rc;
  long long first_step = 1;
  if (const int rc = choose_start(run, first_step); rc != 0) return rc;

  const HeldOutSet held_out = held_out_set(run);
  if (run.data.has_eval() && (flags.eval_interval > 0 || flags.eval_only)) announce_evaluation(run, held_out);
  if (flags.eval_only) {
    if (!evaluate(run, held_out, run.engine->steps_taken())) return kExitFailure;
    if (!close_metrics(run)) return kExitFailure;
    log::info("zero-train: evaluation only: nothing trained, nothing saved");
    return 0;
  }

  if (const int rc = train_steps(run, held_out, first_step); rc != 0) return rc;
  phase::set("finishing");
  if (!close_metrics(run)) return kExitFailure;
  log::info("zero-train: done; the ledger at the end:\n" + run.device->ledger().snapshot().table());
  return 0;
}

}  // namespace zero::train
