#include "runtime/train/grid_run.hpp"

#include <algorithm>
#include <cstdio>

#include "core/error.hpp"
#include "core/ledger.hpp"
#include "core/log.hpp"
#include "core/mpi_check.hpp"
#include "models/gpt_flops.hpp"
#include "runtime/pipeline/check.hpp"
#include "runtime/pipeline/stage_model.hpp"
#include "runtime/train/run.hpp"

namespace zero::train {
namespace {

// "1,234,567": parameter counts read at a glance.
std::string grouped(long long n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Every rank's `text`, on rank 0 in rank order (empty elsewhere). Collective over `comm`.
std::vector<std::string> gather_strings(MPI_Comm comm, const std::string& text) {
  int rank = 0, size = 1;
  ZERO_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  ZERO_CHECK_MPI(MPI_Comm_size(comm, &size));
  int len = static_cast<int>(text.size());
  std::vector<int> lens(static_cast<size_t>(rank == 0 ? size : 0)), offs(lens.size());
  ZERO_CHECK_MPI(MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, comm));
  int total = 0;
  for (size_t r = 0; r < lens.size(); ++r) {
    offs[r] = total;
    total += lens[r];
  }
  std::vector<char> all(static_cast<size_t>(std::max(total, 1)));
  ZERO_CHECK_MPI(MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0, comm));
  std::vector<std::string> out;
  for (size_t r = 0; r < lens.size(); ++r) out.emplace_back(all.data() + offs[r], static_cast<size_t>(lens[r]));
  return out;
}

}  // namespace

GridRun::~GridRun() {
  if (data_comm != MPI_COMM_NULL) MPI_Comm_free(&data_comm);
}

void build_grid(Run& run) {
  const config::Parallel& par = run.c.ours.parallel;
  run.grid = std::make_unique<coll::ProcessGrid>(
      *run.comm, coll::GridShape{.data = par.data, .pipeline = par.pipeline, .tensor = par.tensor});
}

void build_grid_run(Run& run) {
  const config::Parallel& par = run.c.ours.parallel;
  const std::string& file = run.flags.config;
  auto p = std::make_unique<GridRun>();
  p->grid = run.grid.get();
  const coll::GridCoord& at = p->grid->coord();
  // The ranks that hold this rank's stage (and tensor slice), ordered by data index.
  ZERO_CHECK_MPI(MPI_Comm_split(run.world.comm(), at.pipeline * par.tensor + at.tensor, at.data, &p->data_comm));
  if (par.pipeline == 1) {  // tensor slices only: no cut, no schedule
    run.pipe = std::move(p);
    return;
  }

  // The cut: the same on every rank (pure functions of the model and the config).
  const Model& model = *run.model;
  const pipeline::PartitionMethod method =
      pipeline::parse_partition_method(config::to_string(par.partition), file + ": zero_train.parallel.partition");
  pipeline::UnitCosts costs;
  costs.parameters = pipeline::unit_parameter_counts(model);
  if (method == pipeline::PartitionMethod::flops)
    for (const models::UnitFlops& f : models::gpt_unit_flops(run.shape, run.T)) costs.flops.push_back(f.total());
  p->cut = pipeline::cut_stages(method, costs, par.pipeline);

  // The schedule, checked once for this run's stages and micro-batches: a list that breaks the
  // executor's rules would otherwise show up as a hang (a receive with no send) mid-step.
  p->schedule = std::string(config::to_string(par.schedule));
  const pipeline::ScheduleFn fn = pipeline::schedule_by_name(p->schedule, file + ": zero_train.parallel.schedule");
  const std::vector<std::string> broken = pipeline::check_schedules(pipeline::all_stages(fn, par.pipeline, run.GA), run.GA);
  if (!broken.empty()) {
    std::string lines;
    for (size_t i = 0; i < broken.size() && i < 5; ++i) lines += "\n  " + broken[i];
    ZERO_FAIL("pipeline schedule \"" + p->schedule + "\" for " + std::to_string(par.pipeline) + " stages and " +
              std::to_string(run.GA) + " micro-batches breaks the executor's rules (" +
              std::to_string(broken.size()) + " problem(s)):" + lines +
              "\nHINT: this is a bug in the schedule; choose another zero_train.parallel.schedule");
  }
  p->list = fn(par.pipeline, run.GA, at.pipeline);
  p->stage.emplace(engine::make_pipeline_stage(*run.model, p->cut, p->grid->pipeline()));
  run.pipe = std::move(p);
}

void report_grid(Run& run) {
  GridRun& p = *run.pipe;
  const coll::GridShape& shape = p.grid->shape();
  const Model& model = *run.model;
  // Every rank's parameter count (its tensor slice of its stage's parameters), for the grid's
  // lines: per rank, not per stage, since the slices are what a rank holds.
  long long mine = 0;
  for (const ParamSpec& ps : (p.stage ? p.stage->view.model : model).params) mine += ps.numel();
  std::vector<long long> counts(static_cast<size_t>(run.world.size()));
  const size_t bytes = size_of(run.options.param_type);  // per parameter element
  ZERO_CHECK_MPI(MPI_Gather(&mine, 1, MPI_LONG_LONG, counts.data(), 1, MPI_LONG_LONG, 0, run.world.comm()));
  if (run.world.is_root()) {
    char line[512];
    std::snprintf(line, sizeof line, "%s: grid %d data x %d pipeline x %d tensor (rank = t + T (d + D p))",
                  p.stage ? "pipeline" : "tensor slicing", shape.data, shape.pipeline, shape.tensor);
    std::string t = line;
    if (p.stage) {
      std::snprintf(line, sizeof line, "; schedule %s, %d micro-batches per step; partition \"%s\"",
                    p.schedule.c_str(), run.GA, std::string(config::to_string(run.c.ours.parallel.partition)).c_str());
      t += line;
    }
    for (int s = 0; s < shape.pipeline; ++s) {
      // The stage's ranks: with tensor slices each tensor group in brackets, every rank with the
      // parameters it holds (its slices; the replicated LayerNorms and biases whole).
      std::string ranks;
      for (int d = 0; d < shape.data; ++d) {
        std::string group;
        for (int k = 0; k < shape.tensor; ++k) {
          const int r = coll::grid_rank(shape, {.data = d, .pipeline = s, .tensor = k});
          const long long n = counts[static_cast<size_t>(r)];
          group += (k == 0 ? "" : " ") + std::to_string(r) +
                   (shape.tensor > 1 ? ":" + grouped(n) + " (" + format_bytes(static_cast<size_t>(n) * bytes) + ")"
                                     : std::string());
        }
        ranks += (ranks.empty() ? "" : ", ") + (shape.tensor > 1 ? "[" + group + "]" : group);
      }
      const std::string who = shape.tensor > 1 ? "tensor group" + std::string(shape.data > 1 ? "s" : "") +
                                                     " (world rank:parameters held (bytes)) " + ranks
                                               : "world rank" + std::string(shape.data > 1 ? "s " : " ") + ranks;
      if (p.stage) {
        std::string units;
        for (int u = p.cut.begin(s); u < p.cut.end(s); ++u)
          units += (u == p.cut.begin(s) ? "" : ", ") + model.units[static_cast<size_t>(u)]->name();
        long long params = 0;
        for (int i : pipeline::stage_param_ids(model, p.cut, s)) params += model.params[static_cast<size_t>(i)].shape.numel();
        std::snprintf(line, sizeof line, "\n  stage %d: %s; Units %d-%d of %d (%s)", s, who.c_str(), p.cut.begin(s),
                      p.cut.end(s) - 1, p.cut.units(), units.c_str());
        t += line;
        if (shape.tensor == 1) t += "; " + grouped(params) + " parameters";
      } else {
        t += "\n  " + who;
      }
    }
    if (p.stage)
      for (const pipeline::TiedParameter& tp : pipeline::tied_parameters(model, p.cut)) {
        std::string on;
        for (int s : tp.stages) on += (on.empty() ? "" : ", ") + std::to_string(s);
        t += "\n  tied: " + model.params[static_cast<size_t>(tp.param)].name + " on stages " + on +
             " (each of those stages keeps a copy)";
      }
    log::info(t);
  }
  // Each stage's Engine's memory report, from rank 0 of the stage's data group.
  const bool reports = p.data_rank() == 0 && p.grid->coord().tensor == 0;
  const std::vector<std::string> all = gather_strings(run.world.comm(), reports ? run.engine->memory_report() : "");
  if (!run.world.is_root()) return;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    const coll::GridCoord c = coll::grid_coord(shape, static_cast<int>(r));
    log::info((p.stage ? "stage " + std::to_string(c.pipeline) + " " : std::string()) + "(world rank " +
              std::to_string(r) + (shape.tensor > 1 ? ", tensor rank 0" : "") + "): " + all[r]);
  }
}

StepStats grid_train_step(Run& run, const std::function<Batch(int micro)>& load) {
  if (!run.pipe->stage) return run.engine->step(load);
  return run.engine->pipeline_step(run.pipe->list, load);
}

PipelineStepFigures pipeline_step_figures(Run& run, const StepStats& st) {
  const GridRun& p = *run.pipe;
  const bool counts = p.last_stage() && p.grid->coord().tensor == 0;
  double sums[2] = {counts ? st.loss / p.data_size() : 0.0, st.time.bubble()};
  double most = st.time.bubble();
  ZERO_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, run.world.comm()));
  ZERO_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &most, 1, MPI_DOUBLE, MPI_MAX, run.world.comm()));
  return {.loss = sums[0], .bubble_mean = sums[1] / run.world.size(), .bubble_max = most};
}

}  // namespace zero::train
