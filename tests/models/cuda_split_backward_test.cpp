// The split backward on the cuda backend: the split ops (cuBLAS halves of linear_backward and
// linear_t_backward) against the joint ones, and every Unit of a GPT and of the MLP run as
// backward_input + backward_weight against backward, bit for bit, fp32 and bf16, checkpointing on
// and off, two micro-batches accumulating. Runs where a GPU exists (or under the CUDA emulator,
// scripts/cuda-emu-tests.sh); reports Skipped elsewhere.
#include <catch2/catch_test_macros.hpp>

#include <random>

#include "models/gpt.hpp"
#include "models/mlp.hpp"
#include "tests/cuda_support.hpp"
#include "tests/models/split_check.hpp"

using namespace zero;
using namespace zero::models;
using zero::test::BackwardOrder;
using zero::test::BackwardResult;
using zero::test::ModelRunner;

namespace {

struct Cuda {
  std::unique_ptr<Device> device = make_device(DeviceKind::cuda);
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<Ops> ops = make_ops(*device, *stream);
};

// Bitwise: the split enqueues the same cuBLAS calls and kernels in the same order on the same
// tensors as the joint backward (no tolerance).
void require_same(const Model& m, const BackwardResult& joint, const BackwardResult& split) {
  REQUIRE(joint.losses == split.losses);
  for (size_t i = 0; i < m.params.size(); ++i) {
    INFO("gradient of " << m.params[i].name);
    CHECK(joint.grads[i] == split.grads[i]);
  }
  for (size_t k = 0; k < joint.dx.size(); ++k)
    for (size_t u = 0; u < m.units.size(); ++u) {
      INFO("grad_input of unit " << m.units[u]->name() << ", micro-batch " << k);
      CHECK(joint.dx[k][u] == split.dx[k][u]);
    }
}

}  // namespace

TEST_CASE("cuda split backward: the linear halves are the joint ops bit for bit") {
  if (!zero::test::have_gpu()) SKIP("no GPU");
  Cuda g;
  Model none;  // a runner without parameters, for its host <-> device copies
  ModelRunner io(none, *g.ops, 0);
  std::mt19937 rng(3);
  const int64_t N = 37, C = 24, OC = 40, V = 29;
  for (ScalarType a : {ScalarType::f32, ScalarType::bf16}) {
    for (ScalarType gt : {ScalarType::f32, a}) {
      INFO("activations " << to_string(a) << ", gradients " << to_string(gt));
      auto random = [&](Shape s, ScalarType t) {
        Tensor x = Tensor::empty(g.ops->device(), s, t, MemCategory::activations);
        std::vector<double> v(static_cast<size_t>(s.numel()));
        for (double& e : v) e = static_cast<double>(static_cast<int>(rng() % 2001) - 1000) / 700.0;
        io.write(x, v);
        return x;
      };
      auto copy_of = [&](const Tensor& t) {
        Tensor c = Tensor::empty(g.ops->device(), t.shape(), t.type(), MemCategory::gradients);
        io.write(c, io.read(t));
        return c;
      };
      const Tensor x = random({N, C}, a), w = random({C, OC}, a), dy = random({N, OC}, a);
      const Tensor dx1 = random({N, C}, a), dx2 = random({N, C}, a);
      const Tensor dw1 = random({C, OC}, gt), db1 = random({OC}, gt);
      const Tensor dw2 = copy_of(dw1), db2 = copy_of(db1);
      g.ops->linear_backward(dx1, dw1, db1, dy, x, w);
      g.ops->linear_backward_input(dx2, dy, w);
      g.ops->linear_backward_weight(dw2, db2, dy, x);
      CHECK(io.read(dx1) == io.read(dx2));
      CHECK(io.read(dw1) == io.read(dw2));
      CHECK(io.read(db1) == io.read(db2));

      const Tensor wt = random({V, C}, a), dyt = random({N, V}, a);
      const Tensor dwt1 = random({V, C}, gt), dwt2 = copy_of(dwt1);
      g.ops->linear_t_backward(dx1, dwt1, dyt, x, wt);
      g.ops->linear_t_backward_input(dx2, dyt, wt);
      g.ops->linear_t_backward_weight(dwt2, dyt, x);
      CHECK(io.read(dx1) == io.read(dx2));
      CHECK(io.read(dwt1) == io.read(dwt2));
    }
  }
}

TEST_CASE("cuda split backward: every GPT Unit's B then W equals backward bitwise") {
  if (!zero::test::have_gpu()) SKIP("no GPU");
  Cuda g;
  const GptShape s{2, 32, 4, 40, 16};
  const int B = 2, T = 16;
  for (ScalarType type : {ScalarType::f32, ScalarType::bf16}) {
    Model m = make_gpt({s, type, type}, *g.ops);
    for (const auto& u : m.units) CHECK(u->splits_backward());
    // Gradients in the parameter's type: bf16 ones go through the fp32 workspace and one
    // rounding per "+=", the path a reordering would change.
    ModelRunner r(m, *g.ops, 77);
    std::mt19937 rng(1);
    std::vector<Batch> batches;
    for (int k = 0; k < 2; ++k) {
      std::vector<int32_t> tokens(B * T), targets(B * T);
      for (auto& t : tokens) t = static_cast<int32_t>(rng() % 40);
      for (size_t i = 0; i < targets.size(); ++i) targets[i] = i % 5 == 4 ? -1 : static_cast<int32_t>(rng() % 40);
      batches.push_back(r.make_batch(Shape{B, T}, tokens, Shape{B, T}, targets));
    }
    for (bool checkpoint : {false, true}) {
      const std::vector<bool> plan = checkpoint_plan(m, checkpoint ? std::optional<long long>(99) : std::nullopt);
      const BackwardResult joint = run_backward(r, m, batches, plan, BackwardOrder::joint, 0.5f);
      for (BackwardOrder order : {BackwardOrder::split_each, BackwardOrder::split_later}) {
        INFO(to_string(type) << ", checkpointing " << checkpoint << ", " << to_string(order));
        require_same(m, joint, run_backward(r, m, batches, plan, order, 0.5f));
      }
    }
  }
}

TEST_CASE("cuda split backward: every MLP Unit's B then W equals backward bitwise") {
  if (!zero::test::have_gpu()) SKIP("no GPU");
  Cuda g;
  const MlpShape s{16, 32, 2, 4};
  MlpTeacherTask task(s, 4);
  Model m = make_mlp({s, ScalarType::f32, ScalarType::f32}, *g.ops);
  for (const auto& u : m.units) CHECK(u->splits_backward());
  ModelRunner r(m, *g.ops, 9);
  std::vector<Batch> batches;
  for (int k = 0; k < 2; ++k) {
    std::vector<float> feat;
    std::vector<int32_t> labels;
    task.batch(32 * k, 32, feat, labels);
    batches.push_back(r.make_feature_batch(Shape{32, 16}, ScalarType::f32,
                                           std::vector<double>(feat.begin(), feat.end()), labels));
  }
  for (bool checkpoint : {false, true}) {
    const std::vector<bool> plan = checkpoint_plan(m, checkpoint ? std::optional<long long>(99) : std::nullopt);
    const BackwardResult joint = run_backward(r, m, batches, plan, BackwardOrder::joint, 0.5f);
    for (BackwardOrder order : {BackwardOrder::split_each, BackwardOrder::split_later}) {
      INFO("checkpointing " << checkpoint << ", " << to_string(order));
      require_same(m, joint, run_backward(r, m, batches, plan, order, 0.5f));
    }
  }
}
