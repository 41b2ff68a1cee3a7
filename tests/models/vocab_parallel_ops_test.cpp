// The cpu backend's vocabulary-parallel ops (models/ops.hpp, "Vocabulary-parallel ends";
// models/cpu/vocab_kernels.cpp) against the whole ops on the same inputs: S shards combined on
// the host as the tensor group's all-reduces would (tests/models/vocab_shards.hpp).
//
// Bounds. One shard is the whole op bit for bit (the same exps summed in the same order, the same
// formulas). With S shards: the embedding is bitwise (one shard's term plus zeros), the wte rows
// and wpe's gradient bitwise (the same rows summed in the same order); the cross-entropy's sum
// of exps is S partial sums added in rank order instead of one sum of V terms, which moves it by
// a few ulps: 1e-6 relative (~8 ulps) on the losses and the logits' gradient.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <memory>

#include "core/device.hpp"
#include "models/ops.hpp"
#include "tests/models/vocab_shards.hpp"

using namespace zero;
using Catch::Matchers::ContainsSubstring;

namespace {

struct Cpu {
  std::unique_ptr<Device> device = make_device(DeviceKind::cpu);
  std::unique_ptr<Stream> stream = device->create_stream("compute");
  std::unique_ptr<models::Ops> ops = models::make_ops(*device, *stream);
};

constexpr double kSplitBound = 1e-6;

}  // namespace

TEST_CASE("vocab shards: one shard of the whole vocabulary is the whole op bit for bit") {
  Cpu cpu;
  test::VocabRunner run(*cpu.ops, ScalarType::f32);
  const test::VocabProblem p;
  const test::VocabInputs in = test::vocab_inputs(p, ScalarType::f32, 1);
  const test::VocabOutputs whole = run.whole(p, in), one = run.shards(p, in, 1);
  CHECK(one.emb == whole.emb);
  CHECK(one.dwte == whole.dwte);
  CHECK(one.dwpe == whole.dwpe);
  CHECK(one.losses == whole.losses);
  CHECK(one.loss == whole.loss);
  CHECK(one.dlogits == whole.dlogits);
}

TEST_CASE("vocab shards: shards combined as the tensor group would give the whole op") {
  Cpu cpu;
  test::VocabRunner run(*cpu.ops, ScalarType::f32);
  const test::VocabProblem p;
  const test::VocabInputs in = test::vocab_inputs(p, ScalarType::f32, 2);
  const test::VocabOutputs whole = run.whole(p, in);
  for (int S : {2, 3, 4}) {
    INFO(S << " shards");
    const test::VocabOutputs got = run.shards(p, in, S);
    CHECK(got.emb == whole.emb);      // wte[token] + wpe[t], plus zeros
    CHECK(got.dwte == whole.dwte);    // each row summed alike, once
    CHECK(got.dwpe == whole.dwpe);
    CHECK(test::vocab_rel_diff(got.losses, whole.losses) <= kSplitBound);
    CHECK(std::fabs(got.loss - whole.loss) <= kSplitBound * std::fabs(whole.loss));
    CHECK(test::vocab_rel_diff(got.dlogits, whole.dlogits) <= kSplitBound);
  }
}

TEST_CASE("vocab shards: 16-bit activations: one shard is the whole op and shards combine within a rounding") {
  // The 16-bit kernels (models/cpu/kernels16.hpp) of the shard ops run the whole ops' row code on
  // widened rows: one shard is the whole op bit for bit. With S shards the gradients' rows are
  // summed alike (bitwise); the embedding's two terms are rounded to S separately before the
  // host adds them, and the logits' gradient rounds a softmax whose sum moved by fp32 ulps: each
  // within one rounding, u = 2^-8 (bf16) or 2^-11 (fp16) of the largest entry; the fp32 losses
  // within kSplitBound as in fp32.
  Cpu cpu;
  for (const ScalarType a : {ScalarType::bf16, ScalarType::f16}) {
    INFO("activations " << to_string(a));
    const double u = a == ScalarType::bf16 ? 0x1p-8 : 0x1p-11;
    test::VocabRunner run(*cpu.ops, a);
    const test::VocabProblem p;
    const test::VocabInputs in = test::vocab_inputs(p, a, 4);
    const test::VocabOutputs whole = run.whole(p, in), one = run.shards(p, in, 1);
    CHECK(one.emb == whole.emb);
    CHECK(one.dwte == whole.dwte);
    CHECK(one.dwpe == whole.dwpe);
    CHECK(one.losses == whole.losses);
    CHECK(one.loss == whole.loss);
    CHECK(one.dlogits == whole.dlogits);
    for (int S : {2, 3, 4}) {
      INFO(S << " shards");
      const test::VocabOutputs got = run.shards(p, in, S);
      CHECK(test::vocab_rel_diff(got.emb, whole.emb) <= u);
      CHECK(got.dwte == whole.dwte);
      CHECK(got.dwpe == whole.dwpe);
      CHECK(test::vocab_rel_diff(got.losses, whole.losses) <= kSplitBound);
      CHECK(test::vocab_rel_diff(got.dlogits, whole.dlogits) <= u);
    }
  }
}

TEST_CASE("vocab shards: a shard holding another range's rows is caught (control)") {
  Cpu cpu;
  test::VocabRunner run(*cpu.ops, ScalarType::f32);
  const test::VocabProblem p;
  const test::VocabInputs in = test::vocab_inputs(p, ScalarType::f32, 3);
  const test::VocabOutputs whole = run.whole(p, in), got = run.shards(p, in, 3, 1);
  CHECK(test::vocab_rel_diff(got.emb, whole.emb) > 0.1);
  CHECK(test::vocab_rel_diff(got.losses, whole.losses) > 0.01);
}

TEST_CASE("vocab shards: token ids are checked against the whole vocabulary") {
  Cpu cpu;
  models::Ops& ops = *cpu.ops;
  test::VocabRunner run(ops, ScalarType::f32);
  const Tensor wte = run.upload(Shape{4, 8}, ScalarType::f32, std::vector<float>(32, 0.5f));
  Tensor emb = Tensor::empty(ops.device(), Shape{1, 2, 8}, ScalarType::f32, MemCategory::activations);
  // Token 11 is outside this shard [4, 8) but inside the vocabulary of 12: valid, contributes 0.
  ops.embedding_forward_shard(emb, run.upload_ids(Shape{1, 2}, {11, 5}), wte, Tensor(), 4, 12);
  const std::vector<float> e = run.download(emb);
  CHECK(e[0] == 0.0f);
  CHECK(e[8] == 0.5f);
  // Token 12 is outside the vocabulary.
  ops.embedding_forward_shard(emb, run.upload_ids(Shape{1, 2}, {12, 5}), wte, Tensor(), 4, 12);
  CHECK_THROWS_WITH(ops.check_errors(), ContainsSubstring("token id 12") && ContainsSubstring("[0, 12)"));
}

TEST_CASE("vocab shards: a target outside the vocabulary is reported; bad shards are refused") {
  Cpu cpu;  // a fresh stream: the previous case's error stays with its stream
  models::Ops& ops = *cpu.ops;
  test::VocabRunner run(ops, ScalarType::f32);
  const Tensor wte = run.upload(Shape{4, 8}, ScalarType::f32, std::vector<float>(32, 0.5f));
  Tensor emb = Tensor::empty(ops.device(), Shape{1, 2, 8}, ScalarType::f32, MemCategory::activations);
  const Tensor logits = run.upload(Shape{2, 4}, ScalarType::f32, std::vector<float>(8, 0.0f));
  const Tensor m = run.upload(Shape{2}, ScalarType::f32, {0.0f, 0.0f});
  const Tensor sums = Tensor::empty(ops.device(), Shape{2, 2}, ScalarType::f32, MemCategory::activations);
  // A shard that does not fit the vocabulary is refused at the call (checked first: the bad
  // target below leaves its error on the stream).
  CHECK_THROWS_WITH(ops.embedding_forward_shard(emb, run.upload_ids(Shape{1, 2}, {0, 1}), wte, Tensor(), 10, 12),
                    ContainsSubstring("embedding_forward_shard") && ContainsSubstring("[10, 14)"));
  CHECK_THROWS_WITH(ops.cross_entropy_shard_sums(sums, logits, m, run.upload_ids(Shape{2}, {0, 1}), -1, 12),
                    ContainsSubstring("not a non-empty part of the vocabulary"));
  ops.cross_entropy_shard_sums(sums, logits, m, run.upload_ids(Shape{2}, {-1, 12}), 4, 12);
  CHECK_THROWS_WITH(ops.check_errors(), ContainsSubstring("target 12"));
}
