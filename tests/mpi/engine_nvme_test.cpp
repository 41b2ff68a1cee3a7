// Optimizer state on NVMe (EngineOptions::nvme, docs/nvme-offload.md) on the cpu backend, on 1, 2
// and 4 ranks: a small GPT trained with master, m and v in swap files is bitwise the training
// with cpu offload (state in RAM), at stages 1-3, with and without pipelined reads and writes and
// with 1, 2 and 4 swap buffers; checkpoints move between the two (saved with nvme, resumed
// with cpu offload and back) bitwise; the swap's files and traffic are what the layout says.
//
// Bitwise: the swap changes where the floats wait between steps, not AdamW's arithmetic or its
// order, so no tolerance anywhere.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstring>
#include <filesystem>

#include "core/world.hpp"
#include "models/gpt.hpp"
#include "offload/swap_store.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/checkpoint/helpers.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;

namespace {

const models::GptShape kGpt{2, 16, 2, 13, 8};
constexpr int kSteps = 6, kSaveAt = 2;

coll::Communicator& world() { return *test::env().comm; }

Batch gpt_batch(Device& dev, int64_t index) {
  std::vector<int32_t> tok(16), tgt(16);
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = static_cast<int32_t>((index * 7 + static_cast<int64_t>(i) * 3) % 13);
    tgt[i] = (tok[i] * 2 + 1) % 13;  // a learnable next token
  }
  Batch b;
  b.inputs = Tensor::empty(dev, Shape{2, 8}, ScalarType::i32, MemCategory::activations);
  b.targets = Tensor::empty(dev, Shape{2, 8}, ScalarType::i32, MemCategory::activations);
  std::memcpy(b.inputs.data(), tok.data(), tok.size() * 4);
  std::memcpy(b.targets.data(), tgt.data(), tgt.size() * 4);
  return b;
}

struct Trainer {
  std::unique_ptr<Device> dev = make_device(DeviceKind::cpu);
  std::unique_ptr<Stream> stream = dev->create_stream("compute");
  std::unique_ptr<models::Ops> ops = models::make_ops(*dev, *stream);
  Model model;
  std::unique_ptr<Engine> engine;
  explicit Trainer(const EngineOptions& o) : model(models::make_gpt({kGpt, o.param_type, ScalarType::f32}, *ops)) {
    engine = std::make_unique<Engine>(model, *dev, *stream, world(), o);
  }
  std::vector<double> run(int from, int to) {
    std::vector<double> losses;
    const int ga = engine->options().gradient_accumulation_steps;
    for (int step = from; step < to; ++step)
      losses.push_back(engine->step([&](int m) {
        return gpt_batch(*dev, (int64_t{step} * world().size() + world().rank()) * ga + m);
      }).loss);
    return losses;
  }
  std::vector<std::vector<float>> params() {
    std::vector<std::vector<float>> out;
    for (int p = 0; p < static_cast<int>(model.params.size()); ++p) out.push_back(engine->parameter(p));
    return out;
  }
};

EngineOptions options(int stage, ScalarType type, int ga) {
  EngineOptions o;
  o.stage = stage;
  o.param_type = type;
  o.gradient_accumulation_steps = ga;
  o.gradient_clipping = 0.5f;
  o.adam.weight_decay = 0.01f;
  o.lr = [](int64_t t) { return 1e-2f * std::min(1.0f, static_cast<float>(t) / 4.0f); };
  o.seed = 7;
  o.param_persistence_threshold = 300;  // a mix of whole and partitioned groups at stage 3
  o.offload_optimizer = true;
  o.pin = offload::PinPolicy::off;  // the arithmetic is the point; pinning has its own tests
  if (type == ScalarType::f16) {
    optim::LossScalerOptions ls;
    ls.enabled = true;
    ls.initial_scale_power = 20;  // some overflow steps first
    ls.hysteresis = 1;
    o.loss_scaler = ls;
  }
  return o;
}

// Each rank its own swap directory (the store adds rank<r> anyway).
EngineOptions with_nvme(EngineOptions o, const std::string& path, int buffers, bool read, bool write) {
  o.nvme.path = path;
  o.nvme.buffer_count = buffers;
  o.nvme.pipeline_read = read;
  o.nvme.pipeline_write = write;
  o.nvme.aio.block_size = 8192;  // several pieces per group file
  return o;
}

// One directory every rank sees, for the checkpoints: rank 0 makes it and broadcasts its name.
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

TEST_CASE("nvme offload: the same training as cpu offload bitwise at stages 1-3") {
  checkpoint::test::TempDir swap;
  struct Variant {
    int buffers;
    bool read, write;
  };
  for (ScalarType type : {ScalarType::bf16, ScalarType::f32, ScalarType::f16})
    for (int stage = 1; stage <= 3; ++stage) {
      const int ga = stage == 2 ? 2 : 1;
      const EngineOptions o = options(stage, type, ga);
      Trainer cpu(o);
      const std::vector<double> want = cpu.run(0, kSteps);
      const std::vector<std::vector<float>> want_params = cpu.params();
      for (const Variant v : {Variant{4, true, true}, Variant{1, false, false}, Variant{2, true, false},
                              Variant{2, false, true}}) {
        if (type != ScalarType::bf16 && v.buffers != 4) continue;  // the variants on one type
        INFO("stage " << stage << ", " << to_string(type) << ", buffers " << v.buffers << ", pipeline read "
                      << v.read << " write " << v.write);
        Trainer nvme(with_nvme(o, swap.path, v.buffers, v.read, v.write));
        CHECK(nvme.run(0, kSteps) == want);
        CHECK(nvme.params() == want_params);
        // Each applied step read and wrote every group's state (fp16 skips its overflow steps,
        // which touch no state): the state really moved.
        const Engine::NvmeTraffic t = nvme.engine->nvme_traffic();
        CHECK(t.on_drive == nvme.engine->expected_nvme_state().total());
        if (type != ScalarType::f16) {
          CHECK(t.read >= kSteps * t.on_drive);
          CHECK(t.written >= kSteps * t.on_drive);
        }
      }
    }
  // The store removed its files and directories with the engines.
  CHECK(std::filesystem::is_empty(swap.path));
}

TEST_CASE("nvme offload: the state is in the files, one read and one write per group a step") {
  checkpoint::test::TempDir swap;
  const EngineOptions o = with_nvme(options(2, ScalarType::bf16, 1), swap.path, 2, true, true);
  Trainer t(o);
  const Engine::ModelStateBytes drive = t.engine->expected_nvme_state();
  const Engine::ModelStateBytes host = t.engine->expected_host_state();
  CHECK(drive.master > 0);
  CHECK(drive.optimizer == 2 * drive.master);
  CHECK(host.master == 0);  // nothing of master, m, v in RAM but the swap buffers
  CHECK(host.optimizer % (3 * offload::kAioAlignment) == 0);  // 3 buffers of whole 4096-byte blocks
  // The ledger's third space holds the files, the host only the swap buffers.
  const LedgerSnapshot snap = t.dev->ledger().snapshot();
  CHECK(snap.at(MemSpace::nvme, MemCategory::master_weights).current == drive.master);
  CHECK(snap.at(MemSpace::nvme, MemCategory::optimizer_states).current == drive.optimizer);
  CHECK(snap.at(MemSpace::host, MemCategory::master_weights).current == 0);
  CHECK(snap.at(MemSpace::host, MemCategory::optimizer_states).current == host.optimizer);
  CHECK_THAT(t.engine->memory_report(), Catch::Matchers::ContainsSubstring("optimizer state on NVMe"));
  // A group is read only after its previous write-back: after k steps (without settling) at
  // least k - 1 steps' write-backs and k steps' reads have completed (set-up's initial writes
  // come first: one pass, plus the access buffer's group).
  const uint64_t initial = t.engine->nvme_traffic(true).written;
  for (int k = 1; k <= 4; ++k) {
    t.run(k - 1, k);
    const Engine::NvmeTraffic now = t.engine->nvme_traffic();
    INFO("after step " << k << ": written " << now.written - initial << ", read " << now.read);
    CHECK(now.written - initial >= static_cast<uint64_t>(k - 1) * drive.total());
    CHECK(now.read >= static_cast<uint64_t>(k) * drive.total());
  }
  const Engine::NvmeTraffic before = t.engine->nvme_traffic(true);
  t.run(4, 5);
  const Engine::NvmeTraffic after = t.engine->nvme_traffic(true);
  CHECK(after.read - before.read == drive.total());
  CHECK(after.written - before.written == drive.total());
  CHECK(after.io_seconds > before.io_seconds);
  // The files are where the docs say, one per group with state here.
  const std::string dir = swap.path + "/zero-swap/rank" + std::to_string(World::get().rank());
  uint64_t bytes = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir))
    if (f.path().extension() == ".swp") bytes += std::filesystem::file_size(f.path());
  CHECK(bytes == drive.total());
}

TEST_CASE("nvme offload: checkpoints move between nvme and cpu offload bitwise") {
  SharedDir dir;
  checkpoint::test::TempDir swap;
  for (int stage = 1; stage <= 3; ++stage) {
    const EngineOptions cpu = options(stage, ScalarType::bf16, 1);
    const EngineOptions nvme = with_nvme(cpu, swap.path, 2, true, true);
    Trainer whole(cpu);
    const std::vector<double> want = whole.run(0, kSteps);
    const std::vector<std::vector<float>> want_params = whole.params();
    for (bool save_nvme : {true, false}) {
      INFO("stage " << stage << (save_nvme ? ": saved with nvme, resumed with cpu offload"
                                           : ": saved with cpu offload, resumed with nvme"));
      const std::string tag = "s" + std::to_string(stage) + (save_nvme ? "n" : "c");
      std::vector<double> got;
      {
        Trainer first(save_nvme ? nvme : cpu);
        got = first.run(0, kSaveAt);
        first.engine->save_checkpoint(dir.path, tag, world());
      }
      Trainer second(save_nvme ? cpu : nvme);
      second.engine->load_checkpoint(dir.path, tag, world());
      const std::vector<double> rest = second.run(kSaveAt, kSteps);
      got.insert(got.end(), rest.begin(), rest.end());
      CHECK(got == want);
      CHECK(second.params() == want_params);
    }
  }
}

TEST_CASE("nvme offload: sub-groups cut the swap into pieces and change no bit") {
  checkpoint::test::TempDir swap;
  SharedDir dir;
  for (ScalarType type : {ScalarType::bf16, ScalarType::f32})
    for (int stage = 1; stage <= 3; ++stage) {
      const EngineOptions o = options(stage, type, stage == 2 ? 2 : 1);
      Trainer cpu(o);
      const std::vector<double> want = cpu.run(0, kSteps);
      const std::vector<std::vector<float>> want_params = cpu.params();
      // 211 cuts parameters in odd places (bf16, with and without pipelining: dozens of small
      // files, slow); 1000 leaves small groups whole and cuts the big ones.
      struct Cut {
        int64_t sub;
        bool pipelined;
      };
      for (const Cut c : {Cut{211, true}, Cut{211, false}, Cut{1000, true}}) {
        const int64_t sub = c.sub;
        const bool pipelined = c.pipelined;
        if (sub == 211 && type != ScalarType::bf16) continue;
        INFO("stage " << stage << ", " << to_string(type) << ", sub_group_size " << sub << ", pipelined "
                      << pipelined);
        EngineOptions n = with_nvme(o, swap.path, pipelined ? 2 : 1, pipelined, pipelined);
        n.nvme.sub_group_size = sub;
        Trainer nvme(n);
        // The host holds (buffers + 1) sub-groups of state at most, whole 4096-byte blocks each.
        const size_t per = 3 * offload::SwapStore::padded(static_cast<size_t>(sub) * 4);
        CHECK(nvme.engine->expected_host_state().optimizer <= static_cast<size_t>(n.nvme.buffer_count + 1) * per);
        const LedgerSnapshot snap = nvme.dev->ledger().snapshot();
        CHECK(snap.at(MemSpace::host, MemCategory::optimizer_states).current ==
              nvme.engine->expected_host_state().optimizer);
        // The new 16-bit shard goes up from the landing buffer: no second owned-size buffer.
        CHECK(snap.at(MemSpace::host, MemCategory::parameters).current == 0);
        CHECK(nvme.engine->expected_host_state().parameters == 0);
        CHECK(nvme.run(0, kSteps) == want);
        CHECK(nvme.params() == want_params);
        const Engine::NvmeTraffic t = nvme.engine->nvme_traffic();
        CHECK(t.on_drive == nvme.engine->expected_nvme_state().total());
        CHECK(t.read >= kSteps * t.on_drive);
      }
      // Saved from sub-groups, resumed in RAM: the same training.
      {
        EngineOptions n = with_nvme(o, swap.path, 2, true, true);
        n.nvme.sub_group_size = 211;
        std::vector<double> got;
        {
          Trainer first(n);
          got = first.run(0, kSaveAt);
          first.engine->save_checkpoint(dir.path, "sub" + std::to_string(stage) + std::string(to_string(type)), world());
        }
        Trainer second(o);
        second.engine->load_checkpoint(dir.path, "sub" + std::to_string(stage) + std::string(to_string(type)), world());
        const std::vector<double> rest = second.run(kSaveAt, kSteps);
        got.insert(got.end(), rest.begin(), rest.end());
        CHECK(got == want);
        CHECK(second.params() == want_params);
      }
    }
  CHECK(std::filesystem::is_empty(swap.path));
}
