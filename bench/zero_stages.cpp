// ZeRO stage step time: each stage's optimizer step on N ranks (mpirun), relative to stage 0 in
// the same run, and the fraction of its communication hidden behind compute.
//
// Hidden fraction, per stage: the engine's own timers (EngineOptions::timers). comm_busy is the
// time the communicator's stream spent running the step's collectives (clock reads bracket each
// one on that stream, after the event it waits for); comm_exposed is the time the host waited
// for a collective while the compute stream was idle. hidden = 1 - exposed / busy, summed over
// the timed steps and the ranks. The collectives alone (same sizes and order, nothing else
// running) are timed too, as the physical reference for the busy time.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "bench/common/mpi_timing.hpp"
#include "bench/common/report.hpp"
#include "collectives/communicator.hpp"
#include "models/gpt.hpp"
#include "core/world.hpp"
#include "runtime/engine/engine.hpp"

namespace {

const char* kUsage =
    "usage: mpirun -np N zero_stages [--quick]\n"
    "  Step time of ZeRO stages 0-3 on the cpu backend, relative to stage 0, and the fraction\n"
    "  of communication hidden behind compute. Prints one JSON document (rank 0).\n";


}  // namespace

int main(int argc, char** argv) {
  return zero::run_main(argc, argv, [&](zero::World& world) {
    using namespace zero;
    using namespace zero::bench;
    const Options opt = parse_options(argc, argv, kUsage);
    const int n = world.size();
    auto device = make_device(DeviceKind::cpu);
    auto comm = coll::make_mpi_communicator(world.comm(), *device);
    MPI_Comm raw = MPI_COMM_NULL;
    MPI_Comm_dup(world.comm(), &raw);
    Report report("zero_stages", argc, argv, opt.quick, n, 1);

    const models::GptShape shape = opt.quick ? models::GptShape{4, 256, 8, 2048, 64}
                                             : models::GptShape{8, 512, 8, 8192, 128};
    const int B = 4, T = shape.seq_len, reps = opt.quick ? 5 : 7;
    auto stream = device->create_stream("compute");
    auto ops = models::make_ops(*device, *stream);

    auto time_once = [&](const std::function<void()>& fn) { return slowest_rank_seconds(raw, fn); };
    auto batch = [&](int64_t seed) {
      Batch b;
      b.inputs = Tensor::empty(*device, Shape{B, T}, ScalarType::i32, MemCategory::activations);
      b.targets = Tensor::empty(*device, Shape{B, T}, ScalarType::i32, MemCategory::activations);
      for (int i = 0; i < B * T; ++i) {
        b.inputs.data_as<int32_t>()[i] = static_cast<int32_t>((seed * 131 + i * 7) % shape.vocab_size);
        b.targets.data_as<int32_t>()[i] = static_cast<int32_t>((seed * 17 + i * 3) % shape.vocab_size);
      }
      return b;
    };
    // Median step time of `stage` over `c` (all ranks step; each rank's own data), and the
    // engine's communication timers summed over the timed steps and all ranks.
    struct StageTimes {
      Stats step;
      double busy = 0, exposed = 0;
    };
    auto step_time = [&](int stage, coll::Communicator& c) {
      Model model = models::make_gpt({shape, ScalarType::bf16, ScalarType::f32}, *ops);
      EngineOptions o;
      o.stage = stage;
      o.param_type = ScalarType::bf16;
      o.timers = true;
      Engine engine(model, *device, *stream, c, o);
      StepStats last;
      auto one = [&] { last = engine.step([&](int m) { return batch(world.rank() * 100 + m); }); };
      time_once(one);  // warm-up: first-touch of buffers, BLAS start-up
      time_once(one);  // and its collectives' busy time, reported by the next step
      StageTimes out;
      std::vector<double> t;
      double sums[2] = {0, 0};
      for (int i = 0; i < reps; ++i) {
        t.push_back(time_once(one));
        sums[0] += last.time.comm_busy;
        sums[1] += last.time.comm_exposed;
      }
      MPI_Allreduce(MPI_IN_PLACE, sums, 2, MPI_DOUBLE, MPI_SUM, raw);
      out.step = stats_of(t);
      out.busy = sums[0];
      out.exposed = sums[1];
      return out;
    };
    // The stage's collectives alone, in the step's sizes and order.
    auto comm_time = [&](int stage) {
      Model model = models::make_gpt({shape, ScalarType::bf16, ScalarType::f32}, *ops);
      const Partition part(model, n);
      std::vector<std::vector<uint16_t>> bufs;
      for (int g = 0; g < part.group_count(); ++g)
        bufs.emplace_back(static_cast<size_t>(part.group(g).padded_numel), uint16_t{0x3f80});
      auto run = [&] {
        for (int g = part.group_count(); g-- > 0;) {
          auto& b = bufs[static_cast<size_t>(g)];
          const size_t S = b.size() / static_cast<size_t>(n);
          uint16_t* shard = b.data() + S * static_cast<size_t>(world.rank());
          if (stage == 0) comm->all_reduce(b.data(), b.data(), b.size(), DType::bf16, coll::ReduceOp::sum).wait();
          if (stage >= 1) comm->reduce_scatter(b.data(), shard, S, DType::bf16, coll::ReduceOp::sum).wait();
          if (stage == 1 || stage == 2) comm->all_gather(shard, b.data(), S, DType::bf16).wait();
          if (stage == 3) {  // forward and backward gathers
            comm->all_gather(shard, b.data(), S, DType::bf16).wait();
            comm->all_gather(shard, b.data(), S, DType::bf16).wait();
          }
        }
      };
      time_once(run);
      std::vector<double> t;
      for (int i = 0; i < reps; ++i) t.push_back(time_once(run));
      return stats_of(t);
    };

    std::vector<StageTimes> step(4);
    std::vector<Stats> comm_only(4);
    for (int s = 0; s < 4; ++s) {
      std::fprintf(stderr, "zero_stages: stage %d on %d ranks\n", s, n);
      step[static_cast<size_t>(s)] = step_time(s, *comm);
      comm_only[static_cast<size_t>(s)] = comm_time(s);
    }
    const double params = static_cast<double>(models::gpt_parameter_count(shape));
    for (int s = 0; s < 4; ++s) {
      const size_t i = static_cast<size_t>(s);
      const StageTimes& st = step[i];
      const double hidden = st.busy > 0 ? 1.0 - st.exposed / st.busy : 1.0;
      Result r;
      r.name = "stage " + std::to_string(s) + " step, " + std::to_string(n) + " ranks, vs stage 0";
      r.params = {{"stage", s}, {"ranks", n}, {"parameters", params}, {"dtype", "bf16"},
                  {"batch", B}, {"seq_len", T}, {"n_layer", shape.n_layer}, {"n_embd", shape.n_embd},
                  {"vocab", shape.vocab_size},
                  {"step_s", st.step.median},
                  {"comm_busy_per_step_s", st.busy / (reps * n)},
                  {"comm_exposed_per_step_s", st.exposed / (reps * n)},
                  {"communication_alone_s", comm_only[i].median},
                  {"communication_hidden_fraction", hidden}};
      r.metric = "time";
      r.unit = "s";
      r.value = st.step;
      r.reference_name = "stage 0 step, same run";
      r.reference_median = step[0].step.median;
      // Issue 6: stage 1/2 within 5% of stage 0, stage 3 within 1.5x (ratio = stage 0 / ours).
      if (s == 1 || s == 2) r.goal = Goal{"ratio_at_least", 1.0 / 1.05};
      if (s == 3) r.goal = Goal{"ratio_at_least", 1.0 / 1.5};
      report.add(std::move(r));
    }
    if (world.rank() == 0) report.print();
    MPI_Comm_free(&raw);
    return 0;
  });
}
