// Pipeline capacity (issue 18, "Capacity", GPipe's headline): under a fixed device memory limit
// per rank (cpu device, DeviceOptions::memory_limit), the largest GPT, grown in depth at a fixed
// width, that trains one step
//   (a) on one rank, Engine::step, no activation checkpointing;
//   (b) on one rank with every block checkpointed (EngineOptions::number_checkpoints = n_layer:
//       a block keeps only its input and recomputes its forward in backward);
//   (c) on 4 ranks as 4 pipeline stages (Engine::pipeline_step, gpipe, one data rank per stage,
//       each rank under the same limit), checkpointing asked for as in (b); and 1f1b beside it.
// All at the same global batch: m micro-batches of the same size (accumulation in (a), (b)).
// Reported: the three depths, their parameter counts, and the ratios (b)/(a) and (c)/(a) next
// to GPipe's figures (Huang et al. 2019, its table 1, as issue 18 quotes them: 82M parameters on
// one accelerator core without re-materialization, 318M with it, 3.9x; with pipelining the
// largest model grows about linearly in the number of devices, 25x on 8).
//
// How "fits" is decided. (a), (b): a real run on a device with the limit; an OutOfMemory from
// the engine (construction or step) means it does not. (c): an OutOfMemory on one stage in the
// middle of a pipeline step would leave its neighbours waiting for a message forever, so the
// search runs on devices without a limit and reads each rank's ledger peak (the device total,
// every category, over construction and one step); a depth fits when every rank's peak is within
// the limit. The ledger counts the bytes asked for, and a limit only refuses an allocation that
// would take the total past it, so the two agree up to timing: the host runs up to one Unit
// ahead of the compute stream, which moves a peak by a Unit's temporaries. The depth found is
// then run for real on 4 limited devices (two steps). The one-rank searches are checked the
// same way in reverse: their ledger peak is printed and the next depth is shown to throw.
//
// The search: the peak is close to affine in the depth, so two small depths give a guess,
// corrected one layer at a time until depth d fits and d + 1 does not.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <thread>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/report.hpp"
#include "collectives/communicator.hpp"
#include "core/ledger.hpp"
#include "core/world.hpp"
#include "models/gpt.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/pipeline_stage.hpp"
#include "runtime/pipeline/schedule.hpp"
#include "runtime/pipeline/stage_partition.hpp"

namespace {

using namespace zero;
using namespace zero::bench;

const char* kUsage =
    "usage: mpirun -np 4 pipeline_capacity [--quick]\n"
    "  The largest GPT (depth at a fixed width) that trains one step under a per-rank device\n"
    "  memory limit: one rank without and with activation checkpointing, and 4 pipeline\n"
    "  stages. Prints one JSON document (rank 0).\n";

struct Setup {
  models::GptShape base;  // n_layer varies
  int rows = 0;           // sequences per micro-batch
  int m = 0;              // micro-batches per step
  size_t limit = 0;       // bytes per rank
};

Batch tokens(Device& dev, const models::GptShape& sh, int rows, int64_t seed) {
  Batch b;
  b.inputs = Tensor::empty(dev, Shape{rows, sh.seq_len}, ScalarType::i32, MemCategory::activations);
  b.targets = Tensor::empty(dev, Shape{rows, sh.seq_len}, ScalarType::i32, MemCategory::activations);
  for (int i = 0; i < rows * sh.seq_len; ++i) {
    b.inputs.data_as<int32_t>()[i] = static_cast<int32_t>((seed * 131 + i * 7) % sh.vocab_size);
    b.targets.data_as<int32_t>()[i] = static_cast<int32_t>((seed * 17 + i * 3 + 1) % sh.vocab_size);
  }
  return b;
}

EngineOptions options(const Setup& su, int n_layer, bool checkpoint) {
  EngineOptions o;
  o.stage = 0;
  o.gradient_accumulation_steps = su.m;
  o.seed = 3;
  if (checkpoint) o.number_checkpoints = n_layer;
  return o;
}

// What one probe found on this rank.
struct Probe {
  bool fits = true;          // no OutOfMemory (limited device)
  size_t peak = 0;           // ledger peak of the device total
  size_t activations = 0;    // ledger peak of the activations category
};

// One rank alone: construction and `steps` steps on a device with `limit` (0: none).
Probe single_rank(const Setup& su, int n_layer, bool checkpoint, size_t limit, int steps,
                  coll::Communicator& self) {
  DeviceOptions dopt;
  dopt.memory_limit = limit;
  auto dev = make_device(DeviceKind::cpu, 0, dopt);
  auto stream = dev->create_stream("compute");
  auto ops = models::make_ops(*dev, *stream);
  models::GptShape sh = su.base;
  sh.n_layer = n_layer;
  Model model = models::make_gpt({sh, ScalarType::f32, ScalarType::f32}, *ops);
  Probe pr;
  try {
    Engine e(model, *dev, *stream, self, options(su, n_layer, checkpoint));
    for (int s = 0; s < steps; ++s) e.step([&](int mb) { return tokens(*dev, sh, su.rows, s * 64 + mb); });
  } catch (const OutOfMemory&) {
    pr.fits = false;
  }
  const LedgerSnapshot snap = dev->ledger().snapshot();
  pr.peak = snap.total[static_cast<int>(MemSpace::device)].peak;
  pr.activations = snap.at(MemSpace::device, MemCategory::activations).peak;
  return pr;
}

// This rank's stage of a p-stage pipeline (p = the world): construction and `steps` steps.
// Collective. With a limit, an OutOfMemory is not caught (see the top of the file).
Probe pipeline_rank(const Setup& su, int n_layer, bool checkpoint, const char* schedule,
                    size_t limit, int steps, coll::Communicator& world, coll::Communicator& alone) {
  DeviceOptions dopt;
  dopt.memory_limit = limit;
  auto dev = make_device(DeviceKind::cpu, 0, dopt);
  auto stream = dev->create_stream("compute");
  auto ops = models::make_ops(*dev, *stream);
  models::GptShape sh = su.base;
  sh.n_layer = n_layer;
  Model model = models::make_gpt({sh, ScalarType::f32, ScalarType::f32}, *ops);
  // Balanced parameters per stage (DeepSpeed's default): each stage's model state, which is
  // what a depth search under a memory limit is about.
  pipeline::UnitCosts uc;
  uc.parameters = pipeline::unit_parameter_counts(model);
  const pipeline::StageCut cut = pipeline::cut_stages(pipeline::PartitionMethod::parameters, uc, world.size());
  engine::PipelineStage st = engine::make_pipeline_stage(model, cut, world);
  Engine e(st.view.model, *dev, *stream, alone, options(su, n_layer, checkpoint), st.place);
  const pipeline::Stage list = pipeline::schedule_by_name(schedule)(world.size(), su.m, world.rank());
  for (int s = 0; s < steps; ++s)
    e.pipeline_step(list, [&](int mb) { return tokens(*dev, sh, su.rows, s * 64 + mb); });
  const LedgerSnapshot snap = dev->ledger().snapshot();
  Probe pr;
  pr.peak = snap.total[static_cast<int>(MemSpace::device)].peak;
  pr.activations = snap.at(MemSpace::device, MemCategory::activations).peak;
  return pr;
}

// The largest depth d >= min_depth with fits(d) and not fits(d + 1), 0 when min_depth does not
// fit (4 stages need 2 blocks: the embedding, 2 blocks and the head are 4 Units). The
// peaks of depths 2 and 4 give an affine guess (exact for one rank, where every block adds the
// same bytes; a pipeline's peak steps as its busiest stage gains a block), then a bisection
// between the deepest depth known to fit and the shallowest known not to. Every probe is kept
// in `seen`.
int largest_depth(const std::function<Probe(int)>& probe, size_t limit, std::map<int, Probe>& seen,
                  int min_depth = 1) {
  auto ok = [&](int d) {
    auto it = seen.find(d);
    if (it == seen.end()) it = seen.emplace(d, probe(d)).first;
    return it->second.fits && it->second.peak <= limit;
  };
  if (!ok(min_depth)) return 0;
  int lo = min_depth, hi = -1;  // lo fits; hi does not (-1: none known yet)
  for (int d : {2, 4}) {
    if (d <= lo) continue;
    if (ok(d)) lo = d; else { hi = d; break; }
  }
  if (hi < 0) {
    const double p2 = static_cast<double>(seen.at(2).peak), p4 = static_cast<double>(seen.at(4).peak);
    int g = p4 > p2 ? 4 + static_cast<int>((static_cast<double>(limit) - p4) / ((p4 - p2) / 2)) : 8;
    g = std::max(g, lo + 1);
    if (ok(g)) {
      lo = g;
      // Upwards: g + 1, then doubling steps, until one does not fit.
      for (int step = 1; hi < 0; step *= 2) {
        if (ok(lo + step)) lo += step; else hi = lo + step;
      }
    } else {
      hi = g;
    }
  }
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (ok(mid)) lo = mid; else hi = mid;
  }
  return lo;
}

// Waits for every rank without spinning (MPI_Barrier busy-polls in Open MPI, which would take
// the cores from the rank that is measuring while the others wait).
void quiet_barrier(MPI_Comm comm) {
  MPI_Request req;
  MPI_Ibarrier(comm, &req);
  for (int done = 0; !done;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

int main(int argc, char** argv) {
  return zero::run_main(argc, argv, [&](zero::World& world) {
    const Options opt = parse_options(argc, argv, kUsage);
    const int P = world.size(), rank = world.rank();
    ZERO_REQUIRE(P == 4, "pipeline_capacity: runs on 4 ranks (4 pipeline stages for case (c)); "
                         "start it with mpirun -np 4, not " + std::to_string(P));
    auto comm_dev = make_device(DeviceKind::cpu);  // the communicators' own (unlimited) device
    auto world_comm = coll::make_mpi_communicator(world.comm(), *comm_dev);
    auto alone = world_comm->split(rank, 0);
    Report report("pipeline_capacity", argc, argv, opt.quick, P, 1);

    // Width 128, 128 positions, 4 sequences per micro-batch (quick), 4 micro-batches: one block holds
    // 3.2 MB of fp32 model state (16 bytes per parameter: weights, gradients, Adam m and v) and
    // several MB of activations per micro-batch (attention probabilities dominate), the regime
    // where re-materialization pays, as in GPipe's.
    // The full run doubles the micro-batch, so activations outweigh the model state more (as in
    // GPipe's runs, where re-materialization alone gave 3.9x), and quadruples the limit.
    Setup su;
    su.base = models::GptShape{0, 128, 4, 256, 128};
    su.rows = opt.quick ? 4 : 8;
    su.m = 4;
    su.limit = (opt.quick ? size_t{64} : size_t{256}) << 20;

    auto log = [&](const char* what, int d, const Probe& p, bool fits) {
      if (rank == 0)
        std::fprintf(stderr, "  %s depth %3d: %s, peak %.1f MiB (activations %.1f MiB)\n", what, d,
                     fits ? "fits" : "does not fit", static_cast<double>(p.peak) / (1 << 20),
                     static_cast<double>(p.activations) / (1 << 20));
    };
    // (a), (b): rank 0 alone, the others wait.
    int depth[2] = {0, 0};
    nlohmann::json single[2];
    for (int ck = 0; ck < 2; ++ck) {
      if (rank == 0) {
        const char* name = ck ? "(b) one rank, checkpointing" : "(a) one rank";
        std::fprintf(stderr, "%s\n", name);
        std::map<int, Probe> seen;
        const int d = largest_depth([&](int dd) {
          Probe p = single_rank(su, dd, ck, su.limit, 1, *alone);
          log(name, dd, p, p.fits);
          return p;
        }, su.limit, seen);
        ZERO_REQUIRE(d >= 1, "pipeline_capacity: not even one block fits the limit");
        // The search ran depth d + 1 under the limit too: it threw OutOfMemory.
        depth[ck] = d;
        single[ck] = {{"peak_bytes", seen.at(d).peak}, {"activations_peak_bytes", seen.at(d).activations},
                      {"next_depth_out_of_memory", !seen.at(d + 1).fits}};
      }
      quiet_barrier(world.comm());
    }
    MPI_Bcast(depth, 2, MPI_INT, 0, world.comm());

    // (c): 4 stages. The peak of every rank, its maximum over the ranks.
    struct Piped {
      int depth = 0;
      std::vector<size_t> peaks, activations;
      bool checkpoint_changed_activations = false;
    };
    auto pipelined = [&](const char* schedule) {
      if (rank == 0) std::fprintf(stderr, "(c) 4 stages, %s, checkpointing asked for\n", schedule);
      auto probe_all = [&](int d, bool ck, std::vector<size_t>* peaks, std::vector<size_t>* acts) {
        const Probe mine = pipeline_rank(su, d, ck, schedule, 0, 1, *world_comm, *alone);
        unsigned long long v[2] = {mine.peak, mine.activations}, all[8];
        MPI_Allgather(v, 2, MPI_UNSIGNED_LONG_LONG, all, 2, MPI_UNSIGNED_LONG_LONG, world.comm());
        Probe worst;
        for (int r = 0; r < P; ++r) {
          worst.peak = std::max<size_t>(worst.peak, all[2 * r]);
          worst.activations = std::max<size_t>(worst.activations, all[2 * r + 1]);
          if (peaks) peaks->push_back(all[2 * r]);
          if (acts) acts->push_back(all[2 * r + 1]);
        }
        return worst;
      };
      Piped out;
      std::map<int, Probe> seen;
      std::map<int, std::pair<std::vector<size_t>, std::vector<size_t>>> per_rank;
      out.depth = largest_depth([&](int d) {
        auto& [pk, ac] = per_rank[d];
        Probe p = probe_all(d, true, &pk, &ac);
        log("(c)", d, p, p.peak <= su.limit);
        return p;
      }, su.limit, seen, P - 2);
      ZERO_REQUIRE(out.depth >= 1, "pipeline_capacity: not even " + std::to_string(P - 2) +
                                       " blocks on " + std::to_string(P) + " stages fit the limit");
      out.peaks = per_rank.at(out.depth).first;
      out.activations = per_rank.at(out.depth).second;
      // Whether the executor applied the checkpointing asked for: the same depth without it.
      // Applied, it keeps a block's input instead of its activations (in (b) a fraction of them),
      // so the busiest stage's activation peak would fall well below three quarters; run-to-run
      // timing moves a peak by one Unit's temporaries, a few percent here.
      std::vector<size_t> plain;
      probe_all(out.depth, false, nullptr, &plain);
      out.checkpoint_changed_activations =
          static_cast<double>(*std::max_element(out.activations.begin(), out.activations.end())) <
          0.75 * static_cast<double>(*std::max_element(plain.begin(), plain.end()));
      // The real thing: every rank under the limit, one step.
      pipeline_rank(su, out.depth, true, schedule, su.limit, 1, *world_comm, *alone);
      return out;
    };
    const Piped gp = pipelined("gpipe");
    const Piped ob = pipelined("1f1b");

    models::GptShape sh = su.base;
    auto params_at = [&](int d) {
      sh.n_layer = d;
      return static_cast<double>(models::gpt_parameter_count(sh));
    };
    const nlohmann::json setup = {
        {"width", su.base.n_embd}, {"heads", su.base.n_head}, {"vocab", su.base.vocab_size},
        {"seq_len", su.base.seq_len}, {"micro_batch_sequences", su.rows}, {"micro_batches", su.m},
        {"limit_bytes_per_rank", su.limit}, {"dtype", "fp32"}, {"zero_stage", 0}};
    auto add = [&](const std::string& name, int d, nlohmann::json extra, const char* ref_name,
                   double ref) {
      Result r;
      r.name = name;
      r.params = setup;
      r.params["depth"] = d;
      r.params["parameters"] = params_at(d);
      for (auto& [k, v] : extra.items()) r.params[k] = v;
      r.metric = "throughput";  // bigger is better: ratio = ours / reference
      r.unit = "parameters";
      r.value = Stats{params_at(d), params_at(d), params_at(d), 1};
      if (ref_name) {
        r.reference_name = ref_name;
        r.reference_median = ref;
      }
      report.add(std::move(r));
    };
    add("(a) largest GPT on one rank, no activation checkpointing", depth[0], single[0], nullptr, 0);
    add("(b) largest GPT on one rank, every block checkpointed", depth[1],
        [&] {
          nlohmann::json j = single[1];
          j["gpipe_paper_ratio_remat"] = 318.0 / 82.0;
          return j;
        }(),
        "(a), same run", params_at(depth[0]));
    for (const Piped* pp : {&gp, &ob}) {
      const bool is_gp = pp == &gp;
      add(std::string("(c) largest GPT on 4 pipeline stages (") + (is_gp ? "gpipe" : "1f1b") +
              "), each rank under the limit, checkpointing asked for",
          pp->depth,
          {{"schedule", is_gp ? "gpipe" : "1f1b"},
           {"stage_peak_bytes", pp->peaks},
           {"stage_activations_peak_bytes", pp->activations},
           {"checkpointing_applied_by_executor", pp->checkpoint_changed_activations},
           {"ratio_to_b", params_at(pp->depth) / params_at(depth[1])},
           {"gpipe_paper_per_device_scaling", "about linear in the devices (25x on 8, as issue 18 quotes it)"}},
          "(a), same run", params_at(depth[0]));
    }
    if (rank == 0) report.print();
    return 0;
  });
}
