// zero-train with pipeline stages (zero_train.parallel.pipeline > 1; docs/pipeline.md,
// "zero-train with pipeline stages"): the process grid, this rank's stage of the model, its
// Engine, its schedule, and what the step log and the evaluation need across stages.
//
// Which rank does what. The world is the grid data x pipeline x tensor (collectives/grid.hpp).
// Every rank builds an Engine over its stage's view of the model, with its stage's
// data-parallel group as the Engine's communicator. Data index d of D reads the micro-batches the
// data-parallel run of D ranks gives its rank d (the batch rule counts the data-parallel size
// only); in each pipeline the first stage (tokens) and the last (targets) load them, the middle
// stages load nothing.
//
// Ownership: a GridRun lives in its Run (run.hpp), declared after the model (its stage view
// borrows the model's Units) and before the engine (the engine borrows the view, the place and
// the grid's communicators), so it is destroyed after the engine and before the model. One
// thread. Every function here is collective over the world unless it says otherwise.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/grid.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/pipeline_stage.hpp"
#include "runtime/pipeline/schedule.hpp"
#include "runtime/pipeline/stage_partition.hpp"

namespace zero::train {

struct Run;

struct GridRun {
  GridRun() = default;
  GridRun(const GridRun&) = delete;
  GridRun& operator=(const GridRun&) = delete;
  ~GridRun();

  coll::ProcessGrid* grid = nullptr;        // the Run's (run.hpp)
  // With pipeline stages only (grid->shape().pipeline > 1; a tensor-sliced run of one stage
  // trains with Engine::step):
  pipeline::StageCut cut;                   // the model's Units by stage (zero_train.parallel.partition)
  std::string schedule;                     // "gpipe", "1f1b", "zb-h1"
  pipeline::Stage list;                     // this stage's instructions of one step
  std::optional<engine::PipelineStage> stage;  // this rank's view of the model and its place
  // MPI over this stage's data group (the ranks that share this rank's stage): the held-out
  // evaluation spreads its chunks over it. MPI_COMM_NULL until built; freed with the GridRun.
  MPI_Comm data_comm = MPI_COMM_NULL;

  int data_size() const noexcept { return grid->shape().data; }
  int data_rank() const noexcept { return grid->coord().data; }
  int stages() const noexcept { return grid->shape().pipeline; }
  int stage_id() const noexcept { return grid->coord().pipeline; }
  bool last_stage() const noexcept { return grid->last_stage(); }
  // Whether this rank's stage reads the micro-batches (the first: tokens; the last: targets).
  bool loads() const noexcept { return grid->first_stage() || grid->last_stage(); }
};

// Builds run.grid from the config's parallel block (collective over run.comm). Needs run.comm.
void build_grid(Run& run);

// Builds run.pipe over run.grid; with pipeline stages also the cut, the schedule (checked once
// with pipeline::check_schedules: a broken list is an error here, not a hang in the first step)
// and this rank's stage (its view of the model and its PipelinePlace). Needs run.grid,
// run.model, run.GA and run.T. Throws zero::Error (a partition the model cannot take, a broken
// schedule) alike on every rank; the caller runs it under on_all_ranks and then builds the Engine
// over run.pipe->stage->view.model (or the model, with one stage) with run.grid->data(), the
// stage's place and the tensor communicator.
void build_grid_run(Run& run);

// The start-up report's pipeline part on rank 0: the grid (which world ranks form each stage),
// the schedule and the cut (each stage's Units and parameter count, the tied parameters), then
// the memory report of each stage's Engine, gathered from rank 0 of each stage's data group.
void report_grid(Run& run);

// One optimizer step of this rank's stage (Engine::pipeline_step with this stage's list); `load`
// is called only on the first and last stages. With one stage: Engine::step.
StepStats grid_train_step(Run& run, const std::function<Batch(int micro)>& load);

// What the step log needs from every stage.
struct PipelineStepFigures {
  // The model's loss: the mean, over the D pipelines, of their last stage's mean micro-batch
  // loss (StepStats::loss counts there only), i.e. the data-parallel run's loss.
  double loss = 0;
  // StepStats::time.bubble() (p2p_wait / step) of every rank: the mean over all ranks (each
  // stage of each pipeline), and the largest.
  double bubble_mean = 0, bubble_max = 0;
};
PipelineStepFigures pipeline_step_figures(Run& run, const StepStats& st);

}  // namespace zero::train
