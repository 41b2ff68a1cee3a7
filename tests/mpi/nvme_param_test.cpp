// Parameters on NVMe (EngineOptions::param_nvme_path, offload_param.device "nvme") on the cpu
// backend, 1, 2 and 4 ranks: the same training as offload_param on the host, bitwise; the
// counters of the tier; checkpoints saved from the drive and loaded into host offload (and back);
// the errors of a bad nvme_path and of a shard larger than a swap buffer.
//
// Bitwise: the drive only stores the bytes host AdamW wrote (the 16-bit working copy); what is
// copied up before each all-gather is the same bytes whether they came from RAM or from a file.
// offload_param needs offload_optimizer (the host optimizer writes the shards), so every run here
// offloads the optimizer too; the variants are the speculative host step (kept, dropped, off:
// the paths by which the new shard reaches the drive), accumulation, how many shards stay in RAM
// (max_in_cpu), how many swap buffers (1: every read evicts) and prefetching.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.hpp"
#include "models/gpt.hpp"
#include "models/mlp.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/checkpoint/helpers.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;
using Catch::Matchers::ContainsSubstring;

namespace {

const models::MlpShape kMlp{12, 24, 2, 5};  // 1,037 parameters: divides by no world size here
constexpr int kSteps = 8;
constexpr int kMicro = 8;

coll::Communicator& world() { return *test::env().comm; }

Batch mlp_batch(Device& dev, int64_t index) {
  static const models::MlpTeacherTask task(kMlp, 11);
  std::vector<float> feat;
  std::vector<int32_t> labels;
  task.batch(index * kMicro, kMicro, feat, labels);
  Batch b;
  b.inputs = Tensor::empty(dev, Shape{kMicro, kMlp.in_features}, ScalarType::f32, MemCategory::activations);
  b.targets = Tensor::empty(dev, Shape{kMicro}, ScalarType::i32, MemCategory::activations);
  std::memcpy(b.inputs.data(), feat.data(), feat.size() * 4);
  std::memcpy(b.targets.data(), labels.data(), labels.size() * 4);
  return b;
}

struct Trainer {
  std::unique_ptr<Device> dev = make_device(DeviceKind::cpu);
  std::unique_ptr<Stream> stream = dev->create_stream("compute");
  std::unique_ptr<models::Ops> ops = models::make_ops(*dev, *stream);
  Model model;
  std::unique_ptr<Engine> engine;
  explicit Trainer(const EngineOptions& o) : model(models::make_mlp({kMlp, o.param_type, ScalarType::f32}, *ops)) {
    engine = std::make_unique<Engine>(model, *dev, *stream, world(), o);
  }
  int skipped = 0;  // fp16 overflow steps
  void run(int from, int to, std::vector<double>& losses) {
    const int ga = engine->options().gradient_accumulation_steps;
    for (int step = from; step < to; ++step) {
      const StepStats st = engine->step([&](int m) {
        return mlp_batch(*dev, (int64_t{step} * world().size() + world().rank()) * ga + m);
      });
      losses.push_back(st.loss);
      skipped += !st.applied;
    }
  }
  std::vector<std::vector<float>> params() {
    std::vector<std::vector<float>> out;
    for (int p = 0; p < static_cast<int>(model.params.size()); ++p) out.push_back(engine->parameter(p));
    return out;
  }
};

EngineOptions options(ScalarType type, int ga, float clip) {
  EngineOptions o;
  o.stage = 3;
  o.param_type = type;
  o.gradient_accumulation_steps = ga;
  o.gradient_clipping = clip;
  o.adam.weight_decay = 0.01f;
  o.lr = [](int64_t t) { return 1e-2f * std::min(1.0f, static_cast<float>(t) / 4.0f); };
  o.seed = 7;
  o.param_persistence_threshold = 200;  // a mix of whole and partitioned groups
  o.offload_optimizer = true;
  o.offload_param = true;
  o.pin = offload::PinPolicy::off;  // the arithmetic is the point; pinning has its own tests
  return o;
}

// This rank's own fresh directory for the swap files (each rank of a run makes one; the store
// adds zero-swap/rank<r> under it).
struct NvmeDir {
  checkpoint::test::TempDir dir;
  EngineOptions on(EngineOptions o, int64_t max_in_cpu = 0, int buffers = 5) const {
    o.param_nvme_path = dir.path;
    o.param_max_in_cpu = max_in_cpu;
    o.param_buffer_count = buffers;
    return o;
  }
};

// One directory every rank sees (checkpoints): rank 0 makes it and broadcasts its name.
struct SharedDir {
  std::string path;
  std::unique_ptr<checkpoint::test::TempDir> owned;
  SharedDir() {
    std::vector<float> name(256, 0.0f);
    if (world().rank() == 0) {
      owned = std::make_unique<checkpoint::test::TempDir>();
      for (size_t i = 0; i < owned->path.size(); ++i) name[i] = static_cast<unsigned char>(owned->path[i]);
    }
    world().broadcast(name.data(), name.size(), DType::f32, 0).wait();
    for (float c : name) {
      if (c == 0.0f) break;
      path += static_cast<char>(static_cast<int>(c));
    }
  }
  ~SharedDir() { world().barrier().wait(); }
};

}  // namespace

TEST_CASE("nvme params: the same training as offload_param on the host, bitwise") {
  for (ScalarType type : {ScalarType::f32, ScalarType::bf16, ScalarType::f16})
    for (int ga : {1, 2})
      for (float clip : {0.05f, 100.0f})  // the speculative step dropped / kept
        for (int variant = 0; variant < 4; ++variant) {
          // 0: all shards on the drive, 5 buffers; 1: one buffer (every read evicts);
          // 2: half of the shard elements stay in RAM; 3: no prefetching, no speculation.
          // fp16 (a sample): overflow steps first, which store nothing.
          if (type == ScalarType::f16 && (ga != 1 || variant > 1)) continue;
          EngineOptions o = options(type, ga, clip);
          if (type == ScalarType::f16) {
            optim::LossScalerOptions ls;
            ls.enabled = true;
            ls.initial_scale_power = 18;  // a few overflow steps (skipped) first, then applied ones
            ls.hysteresis = 1;
            o.loss_scaler = ls;
          }
          if (variant == 3) {
            o.prefetch_bucket_size = 0;
            o.speculative_host_step = false;
          }
          INFO(to_string(type) << ", accumulation " << ga << ", clipping " << clip << ", variant " << variant);
          Trainer cpu(o);
          std::vector<double> cpu_losses;
          cpu.run(0, kSteps, cpu_losses);
          const int64_t half = cpu.engine->partition().shard_numel_total() / 2;
          NvmeDir d;
          Trainer nvme(d.on(o, variant == 2 ? half : 0, variant == 1 ? 1 : 5));
          std::vector<double> nvme_losses;
          nvme.run(0, kSteps, nvme_losses);
          CHECK(nvme_losses == cpu_losses);
          CHECK(nvme.skipped == cpu.skipped);
          CHECK((type == ScalarType::f16 ? cpu.skipped > 0 : cpu.skipped == 0));
          CHECK(nvme.params() == cpu.params());
          const engine::ParamNvmeCounters c = nvme.engine->param_nvme_counters();
          CHECK(c.bytes_on_drive > 0);
          CHECK(c.bytes_on_drive % 4096 == 0);
          // Every step writes every shard on the drive once (its new values), plus the initial
          // values (not of a shard that is all padding on this rank: its file's zeros are its
          // value). Reads: a shard still in a swap buffer (read ahead, or just written) is not
          // read again, so with 5 buffers a small model may be read once only; with one buffer
          // and two or more shards on the drive every step reads at least one.
          if (type != ScalarType::f16) CHECK(c.bytes_written >= kSteps * c.bytes_on_drive);
          CHECK(c.bytes_written > c.bytes_on_drive);  // some step was applied and stored
          CHECK(c.bytes_written <= (kSteps + 1) * c.bytes_on_drive);
          CHECK(c.bytes_read > 0);
          if (variant == 1 && c.bytes_on_drive > 4096) CHECK(c.bytes_read >= kSteps * 4096);
          CHECK(c.host_buffer_bytes > 0);
          // Every copy-up of a shard on the drive is counted once, ready or waited for; with
          // prefetching and 5 buffers most shards are read ahead (or still there) in time.
          CHECK(c.ready_uses + c.waited_uses > 0);
          if (variant == 0) CHECK(c.ready_uses > c.waited_uses);
          if (variant == 2) {  // part of the shards stay in RAM
            NvmeDir all;
            Trainer full(all.on(o));
            CHECK(c.bytes_on_drive < full.engine->param_nvme_counters().bytes_on_drive);
          }
        }
}

TEST_CASE("nvme params: a checkpoint saved from the drive loads into host offload, and back") {
  SharedDir ck;
  for (ScalarType type : {ScalarType::f32, ScalarType::bf16}) {
    INFO(to_string(type));
    const EngineOptions o = options(type, 1, 0.5f);
    Trainer straight(o);  // the uninterrupted run, host offload
    std::vector<double> straight_losses;
    straight.run(0, kSteps, straight_losses);

    NvmeDir d1, d2;
    std::vector<double> a_losses, b_losses;
    {
      Trainer first(d1.on(o));  // nvme, saved after 3 steps
      first.run(0, 3, a_losses);
      first.engine->save_checkpoint(ck.path, "nvme", world());
    }
    Trainer cpu_resumed(o);  // loaded into host offload
    cpu_resumed.engine->load_checkpoint(ck.path, "nvme", world());
    cpu_resumed.run(3, kSteps, a_losses);
    CHECK(a_losses == straight_losses);
    CHECK(cpu_resumed.params() == straight.params());

    {
      Trainer first(o);  // host offload, saved after 3 steps
      first.run(0, 3, b_losses);
      first.engine->save_checkpoint(ck.path, "cpu", world());
    }
    Trainer nvme_resumed(d2.on(o, 0, 2));  // loaded into shards on the drive
    nvme_resumed.engine->load_checkpoint(ck.path, "cpu", world());
    nvme_resumed.run(3, kSteps, b_losses);
    CHECK(b_losses == straight_losses);
    CHECK(nvme_resumed.params() == straight.params());
  }
}

TEST_CASE("nvme params: a bad nvme_path or a too small buffer_size is a clear error") {
  const EngineOptions o = options(ScalarType::bf16, 1, 1.0f);
  NvmeDir d;
  EngineOptions missing = d.on(o);
  missing.param_nvme_path = d.dir.path + "/no-such-dir";
  CHECK_THROWS_WITH(Trainer(missing), ContainsSubstring(missing.param_nvme_path));
  const std::string file = d.dir.path + "/a-file";
  std::ofstream(file) << "x";
  EngineOptions not_dir = d.on(o);
  not_dir.param_nvme_path = file;
  CHECK_THROWS_WITH(Trainer(not_dir), ContainsSubstring(file));
  EngineOptions small = d.on(o);
  small.param_buffer_size = 4;
  CHECK_THROWS_WITH(Trainer(small), ContainsSubstring("offload_param.buffer_size (4)"));
  // Nothing is left behind by the engines that failed to start.
  CHECK_FALSE(std::filesystem::exists(d.dir.path + "/zero-swap"));
}

// The host holds the shards in RAM up to max_in_cpu and the swap buffers: the ledger's host
// parameters are what expected_host_state() plans, and less than with every shard in RAM.
TEST_CASE("nvme params: the ledger shows the swap buffers instead of the shards") {
  for (int buffers : {1, 3})
    for (bool half_in_cpu : {false, true}) {
      INFO(buffers << " buffers" << (half_in_cpu ? ", half of the shards in RAM" : ""));
      auto dev = make_device(DeviceKind::cpu);
      auto stream = dev->create_stream("compute");
      auto ops = models::make_ops(*dev, *stream);
      const models::GptShape shape{2, 64, 4, 64, 32};
      Model model = models::make_gpt({shape, ScalarType::bf16, ScalarType::f32}, *ops);
      NvmeDir d;
      EngineOptions o = d.on(options(ScalarType::bf16, 1, 1.0f), 0, buffers);
      o.param_persistence_threshold = 0;  // every group partitioned
      size_t shards = 0;
      {
        auto cdev = make_device(DeviceKind::cpu);
        auto cstream = cdev->create_stream("compute");
        auto cops = models::make_ops(*cdev, *cstream);
        Model cmodel = models::make_gpt({shape, ScalarType::bf16, ScalarType::f32}, *cops);
        EngineOptions c = options(ScalarType::bf16, 1, 1.0f);
        c.param_persistence_threshold = 0;
        Engine cpu(cmodel, *cdev, *cstream, world(), c);
        shards = static_cast<size_t>(cpu.partition().shard_numel_total()) * 2;
        if (half_in_cpu) o.param_max_in_cpu = cpu.partition().shard_numel_total() / 2;
      }
      Engine engine(model, *dev, *stream, world(), o);
      INFO(engine.memory_report());
      const LedgerSnapshot snap = dev->ledger().snapshot();
      const Engine::ModelStateBytes h = engine.expected_host_state();
      CHECK(snap.at(MemSpace::host, MemCategory::parameters).current == h.parameters);
      const engine::ParamNvmeCounters c = engine.param_nvme_counters();
      // Host parameters: the updated shard on its way up (HostOffload's out, 2 bytes per
      // element), the shards kept in RAM, and the swap buffers (page multiples, at most one per
      // shard on the drive).
      CHECK(c.host_buffer_bytes % 4096 == 0);
      CHECK(c.host_buffer_bytes <= static_cast<uint64_t>(buffers) * c.bytes_on_drive);
      if (buffers == 1) CHECK(h.parameters < 2 * shards);  // less than every shard in RAM
      if (half_in_cpu) {
        CHECK(h.parameters > shards + c.host_buffer_bytes);
        CHECK(h.parameters <= shards + shards / 2 + c.host_buffer_bytes);
      }
      if (!half_in_cpu) CHECK(h.parameters == shards + c.host_buffer_bytes);
      // And it trains: one step reads the shards up and writes the new ones back.
      engine.step([&](int) {
        Batch b;
        b.inputs = Tensor::empty(*dev, Shape{2, 32}, ScalarType::i32, MemCategory::activations);
        b.targets = Tensor::empty(*dev, Shape{2, 32}, ScalarType::i32, MemCategory::activations);
        for (int i = 0; i < 64; ++i) {
          b.inputs.data_as<int32_t>()[i] = (i * 7) % 64;
          b.targets.data_as<int32_t>()[i] = (i * 3 + 1) % 64;
        }
        return b;
      });
      CHECK(engine.param_nvme_counters().bytes_written >= c.bytes_written + c.bytes_on_drive);
    }
}
