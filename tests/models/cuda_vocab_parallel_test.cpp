// The cuda backend's vocabulary-parallel ops (models/cuda/embedding.cu's shard kernels,
// models/cuda/cross_entropy_shard.cu) against the cpu backend's and against the whole cuda ops,
// with the shards combined on the host as the tensor group's all-reduces would
// (tests/models/vocab_shards.hpp). Without a GPU every case reports Skipped.
//
// Bounds (as cuda_ops_test's): fp32 1e-5 of the tensor's largest magnitude (identical inputs,
// fp32 arithmetic in another summation order, expf within 2 ulp); bf16 1e-2 (results stored in
// bf16: a couple of roundings of 2^-9). One shard of the whole vocabulary runs the whole ops'
// arithmetic (same block trees, same formulas), so it is compared bit for bit; S shards against
// the whole cuda ops: the embedding and wte's rows bitwise in fp32 (one shard's term plus zeros;
// the same rows summed in the same order), the cross-entropy within 1e-5 (S partial sums of exp).
#include <catch2/catch_test_macros.hpp>

#include <memory>

#include "core/device.hpp"
#include "models/ops.hpp"
#include "tests/cuda_support.hpp"
#include "tests/models/vocab_shards.hpp"

using namespace zero;

namespace {

struct Backend {
  explicit Backend(DeviceKind kind)
      : device(make_device(kind)), stream(device->create_stream("compute")), ops(models::make_ops(*device, *stream)) {}
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> stream;
  std::unique_ptr<models::Ops> ops;
};

double bound(ScalarType a) { return a == ScalarType::f32 ? 1e-5 : 1e-2; }

void compare(const test::VocabOutputs& got, const test::VocabOutputs& want, double b) {
  CHECK(test::vocab_rel_diff(got.emb, want.emb) <= b);
  CHECK(test::vocab_rel_diff(got.dwte, want.dwte) <= b);
  CHECK(test::vocab_rel_diff(got.dwpe, want.dwpe) <= b);
  CHECK(test::vocab_rel_diff(got.losses, want.losses) <= b);
  CHECK(std::fabs(got.loss - want.loss) <= b * std::fabs(want.loss));
  CHECK(test::vocab_rel_diff(got.dlogits, want.dlogits) <= b);
}

}  // namespace

TEST_CASE("cuda vocab shards: one shard of the whole vocabulary is the whole op bit for bit") {
  if (!test::have_gpu()) SKIP("no GPU");
  for (ScalarType a : {ScalarType::f32, ScalarType::bf16}) {
    INFO(to_string(a));
    Backend gpu(DeviceKind::cuda);
    if (a == ScalarType::bf16 && !gpu.device->supports_bf16()) continue;
    test::VocabRunner run(*gpu.ops, a);
    const test::VocabProblem p;
    const test::VocabInputs in = test::vocab_inputs(p, a, 11);
    const test::VocabOutputs whole = run.whole(p, in), one = run.shards(p, in, 1);
    CHECK(one.emb == whole.emb);
    CHECK(one.dwte == whole.dwte);
    CHECK(one.dwpe == whole.dwpe);
    CHECK(one.losses == whole.losses);
    CHECK(one.loss == whole.loss);
    CHECK(one.dlogits == whole.dlogits);
  }
}

TEST_CASE("cuda vocab shards: shards match the cpu backend's shards") {
  if (!test::have_gpu()) SKIP("no GPU");
  for (ScalarType a : {ScalarType::f32, ScalarType::bf16}) {
    INFO(to_string(a));
    Backend gpu(DeviceKind::cuda), cpu(DeviceKind::cpu);
    if (a == ScalarType::bf16 && !gpu.device->supports_bf16()) continue;
    test::VocabRunner run_gpu(*gpu.ops, a), run_cpu(*cpu.ops, ScalarType::f32);
    // A bigger problem too: more columns than a row block's threads, more rows than warps.
    for (const test::VocabProblem& p : {test::VocabProblem{}, test::VocabProblem{4, 40, 64, 2048, 40, 0.5f}}) {
      const test::VocabInputs in = test::vocab_inputs(p, a, 12);
      for (int S : {2, 4}) {
        INFO(S << " shards, V " << p.V);
        compare(run_gpu.shards(p, in, S), run_cpu.shards(p, in, S), bound(a));
      }
    }
  }
}

TEST_CASE("cuda vocab shards: shards combined as the tensor group would give the whole cuda op") {
  if (!test::have_gpu()) SKIP("no GPU");
  Backend gpu(DeviceKind::cuda);
  test::VocabRunner run(*gpu.ops, ScalarType::f32);
  const test::VocabProblem p{4, 40, 64, 2048, 40, 0.5f};
  const test::VocabInputs in = test::vocab_inputs(p, ScalarType::f32, 13);
  const test::VocabOutputs whole = run.whole(p, in);
  for (int S : {2, 4}) {
    INFO(S << " shards");
    const test::VocabOutputs got = run.shards(p, in, S);
    CHECK(got.emb == whole.emb);
    CHECK(got.dwte == whole.dwte);
    CHECK(got.dwpe == whole.dwpe);
    compare(got, whole, 1e-5);
  }
  // The control: shards holding the next range's rows and columns.
  const test::VocabOutputs wrong = run.shards(p, in, 4, 1);
  CHECK(test::vocab_rel_diff(wrong.emb, whole.emb) > 0.1);
  CHECK(test::vocab_rel_diff(wrong.losses, whole.losses) > 0.01);
}
