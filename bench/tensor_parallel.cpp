// Tensor parallelism against data and pipeline parallelism (issue 19, "Benchmark"): one GPT
// trained in three layouts on the same 2 ranks (one per core) in one run, at the same global
// batch (m micro-batches of B sequences per optimizer step), ZeRO 1, fp32:
//
//   data 2      Engine::step over the grid's data communicator; each rank m/2 micro-batches
//   tensor 2    make_gpt_tensor_parallel over the grid's tensor communicator (TensorPlace);
//               both ranks run all m micro-batches, each on its half of every block
//   pipeline 2  the model cut in two by FLOPs (engine::make_pipeline_stage), 1f1b over m
//               micro-batches, Engine::pipeline_step
//
// and, as the reference measured in the same run, the 1-rank step: the whole model and all m
// micro-batches on one rank (each rank runs its own copy at the same time, so each core is as
// busy as in the layouts; the slowest rank's time). ratio = 1-rank time / layout time is the
// layout's speed-up over one rank (2 would be perfect). The four are interleaved, one step of
// each per repetition; a step's time is the slowest rank's (mpi_timing.hpp).
//
// Bytes. Every communicator a layout uses is wrapped in a coll::CountingCommunicator, and the
// bytes each rank sends per step under a ring algorithm (counting.hpp) are printed by axis and
// kind, with the formula each should equal:
//   data      ZeRO 1: reduce-scatter of the gradients and all-gather of the updated parameters,
//             (N-1)/N x 4 Psi_p bytes each (Psi_p: the partition's padded parameter count), so
//             2 (N-1)/N x 4 Psi_p, the same volume as stage 0's all-reduce (the ZeRO paper's
//             2 Psi); plus the gradient norm's all-reduce of one float
//   tensor    models::gpt_tensor_parallel_traffic(...).wire_bytes() x m, plus the engine's
//             exchange of (squared norm, loss) over the tensor group (an all-gather of 4 floats
//             per rank)
//   pipeline  per micro-batch one boundary activation [B, T, C] fp32 each way (stage 0 sends
//             the activation with its 8-word header, stage 1 sends its gradient), so m x 2
//             directions x B T C x 4 over the pair; plus the tied embedding's gradient summed
//             over the two stages (an all-reduce of V x C floats) and the (norm, loss) exchange
//             over the pipeline
// The ratio of each bytes result is formula / measured: 1.0 when the count equals the formula.
//
// Threads: one rank per core, so oneTBB is limited to one thread per rank here, and OpenBLAS
// must be too (OPENBLAS_NUM_THREADS=1, read when the library loads: the launch sets it).
#include <mpi.h>
#include <tbb/global_control.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/common/mpi_timing.hpp"
#include "bench/common/report.hpp"
#include "collectives/communicator.hpp"
#include "collectives/counting.hpp"
#include "collectives/grid.hpp"
#include "core/world.hpp"
#include "models/gpt.hpp"
#include "models/gpt_flops.hpp"
#include "models/gpt_tensor_parallel.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/pipeline_stage.hpp"
#include "runtime/pipeline/schedule.hpp"
#include "runtime/pipeline/stage_partition.hpp"

namespace {

using namespace zero;
using namespace zero::bench;

const char* kUsage =
    "usage: mpirun -x OPENBLAS_NUM_THREADS=1 -np 2 tensor_parallel [--quick]\n"
    "  Step time of tensor 2, data 2 and pipeline 2 (1f1b) on the same GPT and global batch,\n"
    "  against the 1-rank step, and the bytes each rank sends per step on each axis against\n"
    "  the formulas. Prints one JSON document (rank 0).\n";

const char* kLayouts[] = {"data 2", "tensor 2", "pipeline 2"};
constexpr int kL = 3;

// What one rank sent in one step, by kind, summed over the communicators of one layout.
struct Sent {
  double by_kind[coll::kCallKinds] = {};
  double total() const {
    double s = 0;
    for (double b : by_kind) s += b;
    return s;
  }
};

void add(Sent& s, const coll::CountingCommunicator& c) {
  for (int k = 0; k < coll::kCallKinds; ++k) s.by_kind[k] += c.traffic().by_kind[static_cast<size_t>(k)].ring_bytes;
}

nlohmann::json kinds_json(const Sent& s) {
  static const char* names[coll::kCallKinds] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                                "send",       "recv",           "barrier"};
  nlohmann::json j = nlohmann::json::object();
  for (int k = 0; k < coll::kCallKinds; ++k)
    if (s.by_kind[k] != 0) j[names[k]] = s.by_kind[k];
  return j;
}

// The 1, 5 and 15 minute load averages (/proc/loadavg): the machine is shared, so the document
// says how busy it was around the run.
std::vector<double> load_average() {
  std::vector<double> v(3, -1.0);
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &v[0], &v[1], &v[2]) != 3) v.assign(3, -1.0);
    std::fclose(f);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  return zero::run_main(argc, argv, [&](zero::World& world) {
    const Options opt = parse_options(argc, argv, kUsage);
    ZERO_REQUIRE(world.size() == 2, "tensor_parallel: runs on 2 ranks (one per core); start it with "
                                    "mpirun -np 2, not " + std::to_string(world.size()));
    const char* blas_threads = std::getenv("OPENBLAS_NUM_THREADS");
    ZERO_REQUIRE(blas_threads && std::string(blas_threads) == "1",
                 "tensor_parallel: rank " + std::to_string(world.rank()) +
                     " has OPENBLAS_NUM_THREADS " + (blas_threads ? blas_threads : "unset") +
                     "; one rank per core needs 1: launch with mpirun -x OPENBLAS_NUM_THREADS=1");
    const tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
    const int rank = world.rank(), N = 2;
    auto dev = make_device(DeviceKind::cpu);
    auto world_comm = coll::make_mpi_communicator(world.comm(), *dev);
    auto alone = world_comm->split(rank, 0);  // the 1-rank reference's (and a stage's) data group
    MPI_Comm raw = MPI_COMM_NULL;
    MPI_Comm_dup(world.comm(), &raw);
    Report report("tensor_parallel", argc, argv, opt.quick, N, 1);
    const std::vector<double> load_before = load_average();

    // Blocks dominate the work (the embedding and head are V/(12C) of a block's matmuls each), so
    // what is compared is how each layout splits the blocks.
    const models::GptShape shape = opt.quick ? models::GptShape{2, 128, 4, 256, 64}
                                             : models::GptShape{4, 256, 8, 512, 128};
    const int B = 4, T = shape.seq_len, m = 4;
    const int reps = opt.quick ? 5 : 11, warmup = opt.quick ? 1 : 2;
    const models::GptOptions gopt{shape, ScalarType::f32, ScalarType::f32};

    auto stream = dev->create_stream("compute");
    auto ops = models::make_ops(*dev, *stream);
    Model model = models::make_gpt(gopt, *ops);

    // The three grids over the same 2 ranks, and a counting wrapper around every communicator a
    // layout uses.
    coll::ProcessGrid gdata(*world_comm, coll::GridShape{2, 1, 1});
    coll::ProcessGrid gtensor(*world_comm, coll::GridShape{1, 1, 2});
    coll::ProcessGrid gpipe(*world_comm, coll::GridShape{1, 2, 1});
    coll::CountingCommunicator c_data(gdata.data());
    coll::CountingCommunicator c_tensor(gtensor.tensor()), c_tensor_data(gtensor.data());
    coll::CountingCommunicator c_pipe(gpipe.pipeline()), c_pipe_data(gpipe.data());

    Model tmodel = models::make_gpt_tensor_parallel(gopt, *ops, c_tensor);

    pipeline::UnitCosts uc;
    uc.parameters = pipeline::unit_parameter_counts(model);
    for (const models::UnitFlops& f : models::gpt_unit_flops(shape, T)) uc.flops.push_back(f.total());
    const pipeline::StageCut cut = pipeline::cut_stages(pipeline::PartitionMethod::flops, uc, N);
    engine::PipelineStage st = engine::make_pipeline_stage(model, cut, c_pipe);
    std::unique_ptr<coll::CountingCommunicator> c_tied;
    if (st.place.tied_comm) {
      c_tied = std::make_unique<coll::CountingCommunicator>(*st.place.tied_comm);
      st.place.tied_comm = c_tied.get();
    }
    const pipeline::Stage list = pipeline::one_f_one_b(N, m, st.place.stage);

    EngineOptions o;
    o.stage = 1;
    o.seed = 7;
    o.lr = [](int64_t) { return 1e-4f; };
    o.gradient_accumulation_steps = m;
    EngineOptions od = o;
    od.gradient_accumulation_steps = m / N;
    Engine one(model, *dev, *stream, *alone, o);
    Engine dp(model, *dev, *stream, c_data, od);
    Engine tp(tmodel, *dev, *stream, c_tensor_data, o, PipelinePlace{}, TensorPlace{&c_tensor});
    Engine pp(st.view.model, *dev, *stream, c_pipe_data, o, st.place);

    auto batch = [&](int64_t index) {
      Batch b;
      b.inputs = Tensor::empty(*dev, Shape{B, T}, ScalarType::i32, MemCategory::activations);
      b.targets = Tensor::empty(*dev, Shape{B, T}, ScalarType::i32, MemCategory::activations);
      for (int i = 0; i < B * T; ++i) {
        b.inputs.data_as<int32_t>()[i] = static_cast<int32_t>((index * 131 + i * 7) % shape.vocab_size);
        b.targets.data_as<int32_t>()[i] = static_cast<int32_t>((index * 17 + i * 3) % shape.vocab_size);
      }
      return b;
    };

    std::vector<double> t_one, t_layout[kL];
    std::vector<Sent> sent[kL];
    std::vector<coll::CountingCommunicator*> counters[kL] = {
        {&c_data}, {&c_tensor, &c_tensor_data}, {&c_pipe, &c_pipe_data}};
    if (c_tied) counters[2].push_back(c_tied.get());
    for (int r = 0; r < warmup + reps; ++r) {
      std::fprintf(stderr, "[rank %d] repetition %d of %d\n", rank, r + 1, warmup + reps);
      const int64_t base = int64_t{r} * m;  // the step's global batch: micro-batches base .. base+m-1
      const double t1 = slowest_rank_seconds(raw, [&] { one.step([&](int mb) { return batch(base + mb); }); });
      for (int l = 0; l < kL; ++l) {
        for (coll::CountingCommunicator* c : counters[l]) c->reset();
        const double t = slowest_rank_seconds(raw, [&] {
          if (l == 0) dp.step([&](int mb) { return batch(base + N * mb + rank); });
          if (l == 1) tp.step([&](int mb) { return batch(base + mb); });
          if (l == 2) pp.pipeline_step(list, [&](int mb) { return batch(base + mb); });
        });
        Sent s;
        for (coll::CountingCommunicator* c : counters[l]) add(s, *c);
        if (r < warmup) continue;
        t_layout[l].push_back(t);
        sent[l].push_back(s);
      }
      if (r >= warmup) t_one.push_back(t1);
    }

    // Formulas, per rank and step (ring volumes, as CountingCommunicator counts them).
    const double ring_rs = double(N - 1) / N;  // reduce-scatter / all-gather: (N-1)/N of the buffer
    const double ring_ar = 2.0 * (N - 1) / N;  // all-reduce: 2 (N-1)/N
    const double exchange = ring_rs * 4 * 4 * N;  // (norm, loss) all-gather: 4 floats per rank
    const double act = double(B) * T * shape.n_embd * 4;  // one boundary activation, fp32
    const int64_t psi = dp.partition().parameter_numel(), psi_p = dp.partition().padded_numel_total();
    const models::TensorParallelTraffic tf = models::gpt_tensor_parallel_traffic(gopt, N, B, T);
    struct Formula {
      double main = 0, extra = 0;
      std::string main_name, extra_name;
    };
    auto formula = [&](int l, int stage) {
      Formula f;
      if (l == 0) {
        f.main = 2 * ring_rs * 4 * double(psi_p);
        f.main_name = "ZeRO 1: reduce-scatter of the gradients + all-gather of the parameters, 2 (N-1)/N x 4 Psi_p";
        f.extra = ring_ar * 4;
        f.extra_name = "the gradient norm's all-reduce of one float";
      } else if (l == 1) {
        f.main = tf.wire_bytes() * m;
        f.main_name = "models::gpt_tensor_parallel_traffic(...).wire_bytes() x m (Megatron's 4 x 2 (T-1)/T x b s h per block, plus the ends)";
        f.extra = exchange;
        f.extra_name = "(norm, loss) all-gather over the tensor group";
      } else {
        f.main = m * act;
        f.main_name = "one boundary activation [B, T, C] fp32 per micro-batch in this stage's direction (x 2 directions over the pair)";
        const double tied = ring_ar * 4 * double(shape.vocab_size) * shape.n_embd;
        f.extra = tied + exchange + (stage == 0 ? m * 8.0 * 4 : 0.0);
        f.extra_name = "the tied wte gradient's all-reduce over the two stages (2 (N-1)/N x V C x 4), the (norm, loss) "
                       "all-gather over the pipeline" + std::string(stage == 0 ? ", the activations' 8-word headers" : "");
      }
      return f;
    };

    // Every rank's bytes to rank 0: per layout the first repetition's by kind, and the min and max
    // of the total over repetitions (a step's count does not vary).
    constexpr int kW = coll::kCallKinds + 2;
    std::vector<double> mine(kL * kW), all(static_cast<size_t>(N) * kL * kW);
    for (int l = 0; l < kL; ++l) {
      std::vector<double> tot;
      for (const Sent& s : sent[l]) tot.push_back(s.total());
      const Stats ts = stats_of(tot);
      for (int k = 0; k < coll::kCallKinds; ++k) mine[static_cast<size_t>(l * kW + k)] = sent[l].front().by_kind[k];
      mine[static_cast<size_t>(l * kW + coll::kCallKinds)] = ts.min;
      mine[static_cast<size_t>(l * kW + coll::kCallKinds + 1)] = ts.max;
    }
    MPI_Gather(mine.data(), kL * kW, MPI_DOUBLE, all.data(), kL * kW, MPI_DOUBLE, 0, raw);

    const double tokens = double(m) * B * T;
    const Stats s_one = stats_of(t_one);
    for (int l = 0; l < kL; ++l) {
      const Stats s = stats_of(t_layout[l]);
      Result r;
      r.name = std::string("step time, ") + kLayouts[l] + " vs 1 rank, global batch " + std::to_string(m) + " x " +
               std::to_string(B) + " sequences of " + std::to_string(T);
      r.params = {{"layout", kLayouts[l]},
                  {"micro_batches", m},
                  {"micro_batch", {B, T}},
                  {"zero_stage", 1},
                  {"tokens_per_s_median", tokens / s.median},
                  {"one_rank_tokens_per_s_median", tokens / s_one.median},
                  {"one_rank_min_s", s_one.min},
                  {"one_rank_max_s", s_one.max},
                  {"samples_s", t_layout[l]},
                  {"one_rank_samples_s", t_one}};
      if (l == 0) r.params["accumulation_per_rank"] = m / N;
      if (l == 2) r.params["schedule"] = "1f1b", r.params["cut_units"] = {cut.begin(1)};
      r.metric = "time";
      r.unit = "s";
      r.value = s;
      r.reference_name = "1 rank: the whole model and all micro-batches on one rank (both ranks at once, "
                         "each its own copy), same run, interleaved; ratio = speed-up over one rank";
      r.reference_median = s_one.median;
      report.add(std::move(r));
    }
    for (int l = 0; l < kL; ++l)
      for (int w = 0; w < N; ++w) {
        const double* v = all.data() + (static_cast<size_t>(w) * kL + static_cast<size_t>(l)) * kW;
        Sent s;
        for (int k = 0; k < coll::kCallKinds; ++k) s.by_kind[k] = v[k];
        const Formula f = formula(l, w);
        Result r;
        r.name = std::string("bytes sent per step, ") + kLayouts[l] + ", rank " + std::to_string(w);
        r.params = {{"layout", kLayouts[l]},
                    {"rank", w},
                    {"by_kind", kinds_json(s)},
                    {"formula_main", f.main},
                    {"formula_main_is", f.main_name},
                    {"formula_extra", f.extra},
                    {"formula_extra_is", f.extra_name}};
        if (l == 0) r.params["parameters"] = psi, r.params["padded_parameters"] = psi_p,
                    r.params["zero_paper_unpadded"] = 2 * ring_rs * 4 * double(psi);
        if (l == 1) r.params["tensor_all_reduces_per_micro_batch"] = tf.calls,
                    r.params["tensor_payload_bytes_per_micro_batch"] = tf.bytes;
        if (l == 2) r.params["stage"] = w;
        r.metric = "bytes";
        r.unit = "bytes per step (ring volume this rank sends)";
        r.value = Stats{s.total(), v[coll::kCallKinds], v[coll::kCallKinds + 1], reps};
        r.reference_name = "formula (formula_main + formula_extra); ratio = formula / measured";
        r.reference_median = f.main + f.extra;
        // The check: the count equals the formula.
        r.goal = Goal{"ratio_equals", 1.0};
        report.add(std::move(r));
      }

    if (rank == 0) {
      nlohmann::json doc = report.to_json();
      std::string cmd = "mpirun --allow-run-as-root --oversubscribe -x OPENBLAS_NUM_THREADS=1 -np 2";
      for (int i = 0; i < argc; ++i) cmd += " " + std::string(argv[i]);
      doc["command"] = cmd;
      doc["model"] = {{"n_layer", shape.n_layer}, {"n_embd", shape.n_embd}, {"n_head", shape.n_head},
                      {"vocab_size", shape.vocab_size}, {"seq_len", shape.seq_len},
                      {"parameters", models::gpt_parameter_count(shape)}};
      doc["goal"] = "issue 19 states no numeric goal for the comparison: the step times are recorded; "
                    "the bytes each rank sends must equal the formulas (ratio 1.0)";
      doc["load_average_1_5_15_min"] = {{"before", load_before}, {"after", load_average()}};
      doc["threads_per_rank"] = {{"openblas", 1}, {"onetbb", 1}};
      std::printf("%s\n", doc.dump(2).c_str());
    }
    MPI_Comm_free(&raw);
    return 0;
  });
}
