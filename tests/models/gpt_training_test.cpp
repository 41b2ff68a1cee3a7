// A tiny GPT learns the embedded addition task on the cpu backend: one process, AdamW from
// optim/, the Units driven as the engine drives them at stage 0. The loss must fall and the
// exact-match accuracy on held-out problems (never in a training sequence) must reach 90%.
#include <catch2/catch_test_macros.hpp>

#include <algorithm>
#include <cmath>

#include "models/data/addition_task.hpp"
#include "models/gpt.hpp"
#include "optim/host_adam.hpp"
#include "tests/models/model_runner.hpp"

using namespace zero;
using namespace zero::models;
using zero::test::ModelRunner;

namespace {

Batch device_batch(ModelRunner& r, const data::TokenBatch& tb) {
  return r.make_batch(Shape{tb.rows, tb.cols}, tb.inputs, Shape{tb.rows, tb.cols}, tb.targets);
}

// Teacher-forced argmax at every position, scored as whole problems.
data::AdditionScore evaluate(ModelRunner& r, const data::TokenBatch& tb, int vocab) {
  r.forward(device_batch(r, tb));
  const std::vector<double> logits = r.last_output();
  std::vector<int32_t> pred(static_cast<size_t>(tb.rows) * tb.cols);
  for (size_t i = 0; i < pred.size(); ++i) {
    const double* row = logits.data() + i * static_cast<size_t>(vocab);
    pred[i] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  }
  return data::AdditionTask::score(tb, pred);
}

}  // namespace

TEST_CASE("gpt training: a tiny GPT learns 2-digit addition and generalises to held-out sums") {
  auto device = make_device(DeviceKind::cpu);
  auto stream = device->create_stream("compute");
  auto ops = make_ops(*device, *stream);

  const data::AdditionTask task({.digits = 2, .seed = 1, .held_out_fraction = 0.1});
  // One 10-character problem per row ("07+45=250\n" is 9 inputs + 1): every row starts a
  // problem at position 0, so the attention patterns are learnt for one set of absolute
  // positions. Packing three per row needed 2-3x the steps and escaped the loss plateau (~1.53,
  // the carries not yet found) at a seed-dependent step; one per row reached 100% held-out
  // accuracy at 600 steps for each of five model seeds tried.
  const int T = task.min_seq_len();
  REQUIRE(task.problems_per_sequence(T) == 1);
  const GptShape shape{2, 64, 4, data::AdditionTask::kVocabSize, 16};
  Model m = make_gpt({shape, ScalarType::f32, ScalarType::f32}, *ops);
  ModelRunner r(m, *ops, 1234, ScalarType::f32);

  optim::HostAdam adam(1);
  optim::AdamParams hp;
  hp.beta2 = 0.99f;
  std::vector<std::vector<float>> mom(m.params.size()), var(m.params.size());
  for (size_t i = 0; i < m.params.size(); ++i) {
    mom[i].assign(static_cast<size_t>(m.params[i].numel()), 0.0f);
    var[i] = mom[i];
  }
  const data::TokenBatch held_out = task.held_out_batch(0, 256, T);  // 256 unseen problems
  const data::AdditionScore before = evaluate(r, held_out, shape.vocab_size);

  const int steps = 700, B = 96;
  double first = 0, last = 0;
  for (int step = 1; step <= steps; ++step) {
    r.zero_grads();
    const double loss = r.forward_backward(device_batch(r, task.batch(int64_t{step} * B, B, T)));
    if (step == 1) first = loss;
    if (step > steps - 20) last += loss / 20;  // mean of the last 20 steps
    // Warm-up, then cosine decay to a tenth.
    const float lr = 3e-3f * std::min(1.0f, static_cast<float>(step) / 50.0f) *
                     (0.55f + 0.45f * std::cos(3.14159265f * static_cast<float>(step) / steps));
    for (size_t i = 0; i < m.params.size(); ++i) {
      hp.weight_decay = m.params[i].weight_decay ? 0.01f : 0.0f;
      const Tensor& p = r.param_tensor(i);
      adam.step(hp, {step, lr, 1.0f}, p.data_as<float>(), mom[i].data(), var[i].data(),
                r.grad_tensor(i).data(), DType::f32, static_cast<size_t>(p.numel()));
    }
  }
  const data::AdditionScore after = evaluate(r, held_out, shape.vocab_size);
  const double acc = static_cast<double>(after.correct) / static_cast<double>(after.problems);
  INFO("loss " << first << " -> " << last << "; held-out exact match " << before.correct << "/"
               << before.problems << " -> " << after.correct << "/" << after.problems);
  CHECK(after.problems == 256);
  CHECK(before.correct <= 8);  // chance: about 1 in 1000 for three digits
  CHECK(last < 0.1 * first);
  CHECK(acc >= 0.9);
}
