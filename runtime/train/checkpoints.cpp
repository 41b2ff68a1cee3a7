#include "runtime/train/checkpoints.hpp"

#include <mpi.h>

#include <cstdio>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/ledger.hpp"
#include "core/log.hpp"
#include "core/mpi_check.hpp"
#include "core/phase.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/hf_gpt2.hpp"
#include "runtime/train/exit_codes.hpp"
#include "runtime/train/rank_errors.hpp"
#include "runtime/train/step_report.hpp"

namespace zero::train {
namespace {

// --resume: the engine's state from the newest complete checkpoint. 0, kExitUsage or
// kExitFailure.
int resume(Run& run, long long& first_step) {
  World& world = run.world;
  const Flags& flags = run.flags;
  const config::Config& c = run.c;
  const Data& data = run.data;
  Engine* engine = run.engine.get();
  coll::Communicator& host_comm = run.host_comm();
  phase::set("resuming from a checkpoint");
  // The newest complete checkpoint by commit time, whatever DIR/latest says (a save whose last
  // step, writing latest, failed leaves a newer complete checkpoint than latest names).
  std::optional<std::string> tag;
  if (world.is_root()) {
    if (const std::optional<checkpoint::Newest> n = checkpoint::find_newest(flags.checkpoint_dir)) {
      if (!n->note.empty()) log::info("zero-train: --resume: " + n->note);
      tag = n->tag;
    }
  }
  int found = tag ? 1 : 0;
  ZERO_CHECK_MPI(MPI_Bcast(&found, 1, MPI_INT, 0, world.comm()));
  if (!found) {
    if (world.is_root())
      std::fprintf(stderr,
                   "zero-train: error: --resume: no complete checkpoint in %s\nHINT: check "
                   "--checkpoint-dir; start without --resume to train from the beginning\n",
                   flags.checkpoint_dir.c_str());
    return kExitUsage;
  }
  std::vector<char> name(256, 0);
  if (world.is_root()) std::snprintf(name.data(), name.size(), "%s", tag->c_str());
  ZERO_CHECK_MPI(MPI_Bcast(name.data(), static_cast<int>(name.size()), MPI_CHAR, 0, world.comm()));
  const std::string t = name.data();
  std::string user;
  if (!on_all_ranks(world, "--resume from " + flags.checkpoint_dir + "/" + t,
                    [&] { user = engine->load_checkpoint(flags.checkpoint_dir, t, host_comm); }))
    return kExitFailure;
  const nlohmann::json meta = nlohmann::json::parse(user, nullptr, false);
  first_step = engine->steps_taken() + 1;
  log::info("zero-train: resumed from " + flags.checkpoint_dir + "/" + t + " at step " +
            std::to_string(engine->steps_taken()));
  if (meta.is_object()) {
    auto differs = [&](const char* key, const nlohmann::json& now) {
      if (meta.contains(key) && meta[key] != now)
        log::info(std::string("zero-train: warning: the checkpoint was saved with ") + key + " " +
                  meta[key].dump() + ", this run has " + now.dump() +
                  ": the run goes on, but not as the saved run would have");
    };
    differs("seed", c.seed);
    differs("train_batch_size", c.batch.train_batch_size);
    if (data.has_train()) differs("data", data.train().describe());
  }
  return 0;
}

// --init-from: the file's weights, installed on every rank. 0, kExitUsage or kExitFailure.
int init_from(Run& run) {
  World& world = run.world;
  const Flags& flags = run.flags;
  const Model& model = *run.model;
  Engine* engine = run.engine.get();
  phase::set("loading --init-from");
  // The file's weights become the initial master and working copy: saved as a checkpoint of
  // step 0 in a temporary place and loaded, so the engine's one load path does the slicing.
  // A file that cannot be the model's weights (missing tensors, other shapes, NaN or infinite
  // values) is bad input: exit 2. Installing good weights can fail only while running: 1.
  std::vector<std::vector<float>> values;
  if (!on_all_ranks(world, "--init-from " + flags.init_from, [&] {
        values = checkpoint::import_safetensors(flags.init_from, checkpoint::param_table(model));
      }))
    return kExitUsage;
  // With pipeline stages too: set_parameters takes the whole model's values on every stage and
  // keeps the ones its stage holds (engine.hpp).
  if (!on_all_ranks(world, "--init-from " + flags.init_from, [&] { engine->set_parameters(values); }))
    return kExitFailure;
  values = {};
  log::info("zero-train: initial weights from " + flags.init_from);
  return 0;
}

}  // namespace

std::string step_tag(long long step) {
  char b[32];
  std::snprintf(b, sizeof b, "step_%08lld", step);
  return b;
}

int check_checkpoint_dir(World& world, const Flags& flags, const Engine& engine) {
  const std::string& dir = flags.checkpoint_dir;
  const std::string what = "--checkpoint-dir " + dir;
  // Rank 0 first, so that the others do not race it creating the directory.
  if (!on_all_ranks(world, what, [&] { if (world.is_root()) checkpoint::probe_writable(dir); }))
    return kExitUsage;
  if (!on_all_ranks(world, what, [&] { if (!world.is_root()) checkpoint::probe_writable(dir); }))
    return kExitUsage;
  if (!on_all_ranks(world, what, [&] {
        if (!world.is_root()) return;
        for (const std::string& done : checkpoint::clean_leftovers(dir)) log::info("checkpoint: " + done);
      }))
    return kExitUsage;

  // One checkpoint: every rank's file (fp32 master, exp_avg and exp_avg_sq of the elements it
  // owns, with its table) plus the manifest, marker and latest; each file rounded up to a block.
  unsigned long long mine = engine.checkpoint_bytes(), bytes = 0;
  ZERO_CHECK_MPI(MPI_Allreduce(&mine, &bytes, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, world.comm()));
  int verdict = 0;
  if (world.is_root()) {
    try {
      const checkpoint::Space space = checkpoint::free_space(dir);
      const unsigned long long need = bytes + (static_cast<unsigned long long>(world.size()) + 3) * space.block;
      char line[1024];
      if (space.available < need) {
        std::snprintf(line, sizeof line,
                      "%s has %llu bytes (%s) free, but one checkpoint of this run needs %llu (%s: "
                      "the fp32 master weights and Adam's two moments of every parameter, in %d rank "
                      "file(s), and the manifest)",
                      dir.c_str(), static_cast<unsigned long long>(space.available),
                      format_bytes(space.available).c_str(), need, format_bytes(need).c_str(), world.size());
        if (flags.no_space_check) {
          log::warn(std::string(line) + "; going on as --no-space-check asks: a save that finds the "
                    "disk full fails the run (exit 1) and keeps the earlier checkpoints");
        } else {
          std::fprintf(stderr,
                       "zero-train: error: %s: %s\nHINT: free at least %llu bytes there or pass a "
                       "--checkpoint-dir on a larger filesystem; --no-space-check skips this check "
                       "where statvfs does not report the real free space\n",
                       what.c_str(), line, need - static_cast<unsigned long long>(space.available));
          verdict = kExitUsage;
        }
      } else {
        std::snprintf(line, sizeof line, "checkpoint: %s: one checkpoint takes %s, %s free (room for %llu)",
                      dir.c_str(), format_bytes(need).c_str(), format_bytes(space.available).c_str(),
                      static_cast<unsigned long long>(space.available / need));
        log::info(line);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "zero-train: error: %s: %s\n", what.c_str(), error_text(e).c_str());
      verdict = kExitUsage;
    }
  }
  ZERO_CHECK_MPI(MPI_Bcast(&verdict, 1, MPI_INT, 0, world.comm()));
  return verdict;
}

// Where the run starts: a checkpoint (exact resume), a safetensors file, or the seed.
int choose_start(Run& run, long long& first_step) {
  first_step = 1;
  if (run.flags.resume) return resume(run, first_step);
  if (!run.flags.init_from.empty()) return init_from(run);
  return 0;
}

bool save_checkpoint(Run& run, long long step) {
  World& world = run.world;
  const Flags& flags = run.flags;
  const config::Config& c = run.c;
  const Data& data = run.data;
  const models::GptShape& shape = run.shape;
  const EngineOptions& o = run.options;
  const int W = run.W;
  Engine* engine = run.engine.get();
  coll::Communicator& host_comm = run.host_comm();
  char line[1024];
  phase::Scope in_phase("saving a checkpoint");
  const std::string tag = step_tag(step);
  const double t0 = now_seconds();
  nlohmann::json user = {{"step", step},
                         {"seed", c.seed},
                         {"train_batch_size", c.batch.train_batch_size},
                         {"data", data.train().describe()},
                         {"world_size", W},
                         {"stage", o.stage},
                         // What the parameter table cannot tell (n_head), for export --hf-config.
                         {"model", {{"n_layer", shape.n_layer}, {"n_embd", shape.n_embd}, {"n_head", shape.n_head},
                                    {"vocab_size", shape.vocab_size}, {"seq_len", shape.seq_len}}}};
  if (!on_all_ranks(world, "checkpoint " + flags.checkpoint_dir + "/" + tag,
                    [&] { engine->save_checkpoint(flags.checkpoint_dir, tag, host_comm, user.dump()); }))
    return false;
  std::snprintf(line, sizeof line, "checkpoint: saved %s/%s in %.2f s", flags.checkpoint_dir.c_str(),
                tag.c_str(), now_seconds() - t0);
  log::info(line);
  return true;
}

}  // namespace zero::train
