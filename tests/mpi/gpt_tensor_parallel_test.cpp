// Issue 19, the whole tensor-parallel GPT (models::make_gpt_tensor_parallel) on T = world ranks
// (one tensor group) against make_gpt run alone on every rank: same parameters (each shard the
// matching slice of the whole, cut by param_slice_element), same batch. Compared: the loss, the
// logits, and every parameter's gradient (each rank's shard against the matching slice of the
// whole gradient; replicated ones whole), joint, split B/W and checkpointed. Also: degree 1 is
// make_gpt (its parameter table, and bitwise its loss, logits and gradients), and controls with
// a wrong slice (c_attn's heads; wte's vocabulary range) must fail.
//
// Bound: 1e-5 of each tensor's largest magnitude (loss: of the loss). The split changes only
// summation order: each row-split product is T partial sums added in rank order by the
// all-reduce instead of one BLAS sum, and the column-split input gradients likewise; every
// other op is the same arithmetic on the same values. A reordered fp32 sum of K <= 128 terms
// moves by a few ulps of its largest partial sum; through 2 blocks and the head (at most ~8 such
// sums chained into any gradient) that stays a few tens of 2^-24 relative, well under 1e-5
// (~170 ulps). Measured with ZERO_TEST_PRINT=1: see docs/tensor-parallel.md, "Tested".
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "collectives/grid.hpp"
#include "models/gpt.hpp"
#include "models/gpt_tensor_parallel.hpp"
#include "models/gpt_unit.hpp"
#include "models/ops.hpp"
#include "tests/models/model_runner.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;
using Catch::Matchers::ContainsSubstring;

namespace {

constexpr int64_t kB = 2;
// 2 blocks, 8 heads (4 or 2 per rank), a vocabulary of 64 (16 or 32 rows per rank).
const models::GptShape kShape{2, 32, 8, 64, 8};
constexpr uint64_t kSeed = 4321;
constexpr double kBound = 1e-5;

bool print() { return std::getenv("ZERO_TEST_PRINT") != nullptr; }

coll::ProcessGrid& grid() {
  const int n = test::env().comm->size();
  static coll::ProcessGrid g(*test::env().comm, coll::grid_shape_for(n, 1, n));
  return g;
}
// Every rank its own tensor group of one (data axis = the world): degree 1.
coll::ProcessGrid& grid_of_one() {
  static coll::ProcessGrid g(*test::env().comm, coll::grid_shape_for(test::env().comm->size(), 1, 1));
  return g;
}

models::GptOptions options(bool sequence_parallel = false) {
  models::GptOptions o;
  o.shape = kShape;
  o.sequence_parallel = sequence_parallel;
  return o;
}

// Random N(0,1) values, the same on every rank (a named counter stream).
std::vector<double> noise(const std::string& name, int64_t n) {
  ParamSpec p;
  p.name = name;
  p.shape = Shape{n};
  p.init_std = 1.0f;
  std::vector<float> v(static_cast<size_t>(n));
  init_param_values(p, 99, 0, n, v.data());
  return {v.begin(), v.end()};
}

// The part of `whole` that `spec` holds (param_slice_element's map).
std::vector<double> slice_of(const ParamSpec& spec, const std::vector<double>& whole) {
  std::vector<double> out(static_cast<size_t>(spec.numel()));
  for (int64_t i = 0; i < spec.numel(); ++i)
    out[static_cast<size_t>(i)] = whole.at(static_cast<size_t>(param_slice_element(spec, i)));
  return out;
}

// max |a - b| / max |b|: the difference relative to the reference tensor's scale.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return scale > 0 ? d / scale : d;
}

enum class Mode { joint, split, checkpoint };

struct Result {
  double loss = 0;
  std::vector<double> logits;
  std::vector<std::vector<double>> grads;
};

// One model on its own stream: its parameters, a batch, one forward and backward.
struct Run {
  std::unique_ptr<Stream> stream = test::env().device->create_stream("gpt");
  std::unique_ptr<models::Ops> ops = models::make_ops(*test::env().device, *stream);
  Model model;
  std::unique_ptr<test::ModelRunner> runner;

  void build(Model m) {
    model = std::move(m);
    runner = std::make_unique<test::ModelRunner>(model, *ops, kSeed);
  }
  Batch batch() {
    const int64_t T = kShape.seq_len;
    std::vector<int32_t> tokens, targets;
    for (int64_t i = 0; i < kB * T; ++i) {
      tokens.push_back(static_cast<int32_t>((i * 37 + 11) % kShape.vocab_size));
      // Every 5th target ignored (-1): the counting convention must match.
      targets.push_back(i % 5 == 3 ? -1 : static_cast<int32_t>((i * 53 + 7) % kShape.vocab_size));
    }
    return runner->make_batch(Shape{kB, T}, tokens, Shape{kB, T}, targets);
  }
  Result run(Mode mode) {
    const Batch batch = this->batch();
    std::vector<bool> ckpt(model.units.size(), mode == Mode::checkpoint);
    Result r;
    r.loss = runner->forward(batch, ckpt);
    r.logits = runner->last_output();
    const float scale = 0.75f;  // a non-trivial seed, as loss scaling / accumulation give
    if (mode == Mode::split) {
      std::vector<UnitContext> kept = runner->backward_input(scale);
      runner->backward_weight(kept);
    } else {
      runner->backward(scale);
    }
    for (size_t i = 0; i < model.params.size(); ++i) r.grads.push_back(runner->grad(i));
    return r;
  }
  int64_t all_reduce_calls() const {
    int64_t n = 0;
    for (const auto& u : model.units) n += dynamic_cast<const models::GptUnit&>(*u).all_reduce_calls();
    return n;
  }
};

// make_gpt with every parameter at its initial value plus N(0, 0.05^2) noise (so biases are
// not zero and LayerNorm weights not one: a bias added twice would otherwise be invisible).
struct Reference : Run {
  std::vector<std::vector<double>> values;
  Result result;
  explicit Reference(Mode mode) {
    build(models::make_gpt(options(), *ops));
    for (size_t i = 0; i < model.params.size(); ++i) {
      std::vector<double> v = runner->param(i);
      const std::vector<double> n = noise(model.params[i].name + "/perturb", model.params[i].numel());
      for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(v[k] + 0.05 * n[k]);
      runner->set_param(i, v);
      values.push_back(std::move(v));
    }
    result = run(mode);
  }
};

// make_gpt_tensor_parallel on `tensor`, holding its slices of the reference's values. `wrong`:
// the parameters whose name contains it hold the next rank's slice (a control).
struct Sharded : Run {
  Sharded(coll::Communicator& tensor, const Reference& ref, const std::string& wrong = "", bool sp = false) {
    build(models::make_gpt_tensor_parallel(options(sp), *ops, tensor));
    REQUIRE(model.params.size() == ref.model.params.size());
    for (size_t i = 0; i < model.params.size(); ++i) {
      ParamSpec spec = model.params[i];
      REQUIRE(spec.name == ref.model.params[i].name);
      if (!wrong.empty() && spec.name.find(wrong) != std::string::npos)
        spec.slice.rank = (spec.slice.rank + 1) % spec.slice.degree;
      runner->set_param(i, slice_of(spec, ref.values[i]));
    }
  }
};

// Columns [t, t + 1) V / T of logits [rows, V]: what tensor rank t of T computes.
std::vector<double> logit_columns(const std::vector<double>& logits, int t, int T) {
  const int64_t V = kShape.vocab_size, Vs = V / T, rows = static_cast<int64_t>(logits.size()) / V;
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = t * Vs; j < (t + 1) * Vs; ++j) out.push_back(logits[static_cast<size_t>(r * V + j)]);
  return out;
}

// Checks the loss and every gradient against the reference; returns the largest difference.
double compare(const Reference& ref, const Sharded& tp, const Result& got) {
  const int t = grid().tensor().rank(), T = grid().tensor().size();
  double worst = 0;
  auto check = [&](const std::string& what, double d) {
    if (print()) std::printf("[rank %d of %d] %-28s %.3g\n", t, T, what.c_str(), d);
    CHECK(d <= kBound);
    worst = std::max(worst, d);
  };
  check("loss", std::fabs(got.loss - ref.result.loss) / std::fabs(ref.result.loss));
  for (size_t i = 0; i < tp.model.params.size(); ++i) {
    INFO(tp.model.params[i].name);
    check(tp.model.params[i].name, rel_diff(got.grads[i], slice_of(tp.model.params[i], ref.result.grads[i])));
  }
  return worst;
}

}  // namespace

TEST_CASE("gpt tensor parallel: the whole model equals make_gpt (joint, split B/W, checkpointed)") {
  for (Mode mode : {Mode::joint, Mode::split, Mode::checkpoint}) {
    INFO("mode " << static_cast<int>(mode));
    const Reference ref(mode);
    Sharded tp(grid().tensor(), ref);
    const Result got = tp.run(mode);
    const double worst = compare(ref, tp, got);
    if (print()) std::printf("[rank %d] mode %d: worst %.3g\n", grid().tensor().rank(), static_cast<int>(mode), worst);
    // The head's output is this rank's vocabulary columns of the logits.
    CHECK(rel_diff(got.logits, logit_columns(ref.result.logits, grid().tensor().rank(), grid().tensor().size())) <=
          kBound);
    // Two all-reduces per block forward, two backward (checkpointing repeats the forward two);
    // the embedding one; the head two forward (max, sums) and one backward: what was handed to
    // the all-reduces is the formula's count and bytes.
    const int per_block = mode == Mode::checkpoint ? 6 : 4;
    CHECK(tp.all_reduce_calls() == (grid().tensor().size() > 1 ? per_block * kShape.n_layer + 4 : 0));
    const models::TensorParallelTraffic measured = models::measured_tensor_parallel_traffic(tp.model);
    const models::TensorParallelTraffic formula = models::gpt_tensor_parallel_traffic(
        options(), grid().tensor().size(), kB, kShape.seq_len, mode == Mode::checkpoint ? kShape.n_layer : 0);
    CHECK(measured == formula);
  }
}

TEST_CASE("gpt tensor parallel: degree 1 is make_gpt bit for bit") {
  Reference ref(Mode::joint);
  Sharded one(grid_of_one().tensor(), ref);
  REQUIRE(grid_of_one().tensor().size() == 1);
  // The parameter table: make_gpt's, with degree-1 slice markers.
  for (size_t i = 0; i < one.model.params.size(); ++i) {
    const ParamSpec& a = one.model.params[i];
    const ParamSpec& b = ref.model.params[i];
    INFO(b.name);
    CHECK(a.name == b.name);
    CHECK(a.shape == b.shape);
    CHECK(a.type == b.type);
    CHECK(a.init == b.init);
    CHECK(a.init_std == b.init_std);
    CHECK(a.weight_decay == b.weight_decay);
    CHECK(a.slice.split != TensorSplit::none);
    CHECK(a.slice.degree == 1);
    CHECK(a.slice.full == b.shape);
  }
  REQUIRE(one.model.units.size() == ref.model.units.size());
  for (size_t u = 0; u < one.model.units.size(); ++u) {
    CHECK(one.model.units[u]->name() == ref.model.units[u]->name());
    const auto a = one.model.units[u]->param_ids(), b = ref.model.units[u]->param_ids();
    CHECK(std::vector<int>(a.begin(), a.end()) == std::vector<int>(b.begin(), b.end()));
  }
  for (Mode mode : {Mode::joint, Mode::checkpoint}) {
    for (bool sp : {false, true}) {  // sequence parallelism has nothing to split at degree 1
      INFO("sequence parallel " << sp);
      Reference r(mode);
      Sharded s(grid_of_one().tensor(), r, "", sp);
      const Result got = s.run(mode);
      CHECK(got.loss == r.result.loss);  // bitwise: the same ops in the same order
      CHECK(got.logits == r.result.logits);
      CHECK(got.grads == r.result.grads);
      CHECK(s.all_reduce_calls() == 0);
      CHECK(models::measured_tensor_parallel_traffic(s.model).gs_calls == 0);
    }
  }
}

TEST_CASE("gpt tensor parallel: the comparison sees a shard with the wrong heads") {
  // The control that the test can fail: c_attn holds the next rank's heads while attn.c_proj
  // keeps this rank's rows (rotating both alike would only renumber the heads).
  if (grid().tensor().size() == 1) SKIP("needs a tensor group of 2 or more");
  const Reference ref(Mode::joint);
  Sharded tp(grid().tensor(), ref, "c_attn");
  const Result got = tp.run(Mode::joint);
  const double d = std::fabs(got.loss - ref.result.loss) / std::fabs(ref.result.loss);
  if (print()) std::printf("[rank %d] wrong heads: loss differs by %.3g\n", grid().tensor().rank(), d);
  CHECK(d > 100 * kBound);
}

TEST_CASE("gpt tensor parallel: the comparison sees a shard with the wrong vocabulary range") {
  // wte holds the next rank's rows: the embedding looks up, and the head scores, the wrong
  // vocabulary entries for this rank's range.
  if (grid().tensor().size() == 1) SKIP("needs a tensor group of 2 or more");
  const Reference ref(Mode::joint);
  Sharded tp(grid().tensor(), ref, "wte");
  const Result got = tp.run(Mode::joint);
  const double d = std::fabs(got.loss - ref.result.loss) / std::fabs(ref.result.loss);
  if (print()) std::printf("[rank %d] wrong vocabulary range: loss differs by %.3g\n", grid().tensor().rank(), d);
  CHECK(d > 100 * kBound);
}

TEST_CASE("gpt tensor parallel: the traffic formula is Megatron's per layer, plus the ends") {
  for (int T : {2, 4, 8}) {
    INFO("degree " << T);
    models::GptOptions o = options();
    o.shape.n_layer = 3;
    const int64_t b = 4, s = 8, C = kShape.n_embd, a = b * s * C * 4;  // fp32 activations
    const models::TensorParallelTraffic t = models::gpt_tensor_parallel_traffic(o, T, b, s);
    CHECK(t.calls == 4 * 3 + 4);
    CHECK(t.bytes == (4 * 3 + 2) * a + 3 * b * s * 4);
    CHECK(t.wire_bytes() == 2.0 * (T - 1) / T * double(t.bytes));
    // One more layer adds Megatron's 4 all-reduces of b s h: 4 x 2 (T-1)/T x b s h bytes sent.
    models::GptOptions more = o;
    more.shape.n_layer = 4;
    const double per_layer = models::gpt_tensor_parallel_traffic(more, T, b, s).wire_bytes() - t.wire_bytes();
    CHECK(per_layer == 4 * 2.0 * (T - 1) / T * double(a));
    // Recomputing a block repeats its 2 forward all-reduces; bf16 activations halve them.
    CHECK(models::gpt_tensor_parallel_traffic(o, T, b, s, 3).bytes == t.bytes + 3 * 2 * a);
    models::GptOptions half = o;
    half.activation_type = ScalarType::bf16;
    half.param_type = ScalarType::bf16;
    CHECK(models::gpt_tensor_parallel_traffic(half, T, b, s).bytes == (4 * 3 + 2) * a / 2 + 3 * b * s * 4);
  }
  CHECK(models::gpt_tensor_parallel_traffic(options(), 1, kB, 8) == models::TensorParallelTraffic{});
}

TEST_CASE("gpt tensor parallel: bad degrees and ranks are clear errors") {
  models::GptShape four = kShape;
  four.n_head = 4;
  models::GptOptions o = options();
  o.shape = four;
  CHECK_THROWS_WITH(models::gpt_tensor_parallel_params(o, 0, 8), ContainsSubstring("n_head 4"));
  CHECK_THROWS_WITH(models::gpt_tensor_parallel_params(options(), 2, 2), ContainsSubstring("rank 2"));
  models::GptShape odd_vocab = kShape;
  odd_vocab.vocab_size = 50257;  // GPT-2's: odd
  CHECK_THROWS_WITH(models::check_tensor_parallel(odd_vocab, 2),
                    ContainsSubstring("vocab_size 50257") && ContainsSubstring("degree 2") &&
                        ContainsSubstring("zero_train.model.vocab_size") &&
                        ContainsSubstring("zero_train.parallel.tensor"));
  CHECK_NOTHROW(models::check_tensor_parallel(odd_vocab, 1));
}

// ---- sequence parallelism (Korthikanti et al. 2022) ------------------------------------------

TEST_CASE("gpt sequence parallel: the whole model equals make_gpt (joint, split B/W, checkpointed)") {
  // The same bound as tensor parallelism: sequence parallelism changes only which rank sums what
  // (the reduce-scatter sums the same rank-order partials the all-reduce did; the LayerNorm
  // gradients are T shard sums added in rank order instead of one sum over all rows).
  if (grid().tensor().size() == 1) SKIP("needs a tensor group of 2 or more");
  const int T = grid().tensor().size();
  for (Mode mode : {Mode::joint, Mode::split, Mode::checkpoint}) {
    INFO("mode " << static_cast<int>(mode));
    const Reference ref(mode);
    Sharded tp(grid().tensor(), ref, "", true);
    const Result got = tp.run(mode);
    const double worst = compare(ref, tp, got);
    if (print()) std::printf("[rank %d] sequence parallel, mode %d: worst %.3g\n", grid().tensor().rank(),
                             static_cast<int>(mode), worst);
    CHECK(rel_diff(got.logits, logit_columns(ref.result.logits, grid().tensor().rank(), T)) <= kBound);
    const models::TensorParallelTraffic measured = models::measured_tensor_parallel_traffic(tp.model);
    const models::TensorParallelTraffic formula = models::gpt_tensor_parallel_traffic(
        options(true), T, kB, kShape.seq_len, mode == Mode::checkpoint ? kShape.n_layer : 0);
    CHECK(measured == formula);
    // Per block 4 forward, 4 backward and 2 re-gathers, or (checkpointed) 4 again in the
    // recompute instead of the re-gathers; embedding 2; head 3.
    CHECK(measured.gs_calls == 10 * kShape.n_layer + 5 + (mode == Mode::checkpoint ? 2 * kShape.n_layer : 0));
  }
}

TEST_CASE("gpt sequence parallel: gradients accumulate over micro-batches") {
  // Two micro-batches into the same gradients (gradient accumulation): the LayerNorms' summed
  // shard gradients must be added to what the gradients hold, not summed with it over the group
  // (that would count the first micro-batch T times).
  if (grid().tensor().size() == 1) SKIP("needs a tensor group of 2 or more");
  for (Mode mode : {Mode::joint, Mode::split}) {
    INFO("mode " << static_cast<int>(mode));
    Reference ref(mode);
    ref.result = ref.run(mode);  // the second micro-batch: gradients of both
    Sharded tp(grid().tensor(), ref, "", true);
    (void)tp.run(mode);
    const Result got = tp.run(mode);
    const double worst = compare(ref, tp, got);
    if (print()) std::printf("[rank %d] sequence parallel, two micro-batches, mode %d: worst %.3g\n",
                             grid().tensor().rank(), static_cast<int>(mode), worst);
  }
}

TEST_CASE("gpt sequence parallel: the stored activations per rank are the whole model's / T") {
  // What one forward leaves stored for backward (the ledger's device activations after the
  // forward, less before it) for make_gpt on one rank, plain tensor parallelism and sequence
  // parallelism at T. Expected, exactly, in fp32 bytes:
  //   whole  B S C (the embedding's output, block 0's input, which the runner keeps as the engine
  //          does) + n_layer (16 B S C + 4 B S + B H S^2) (per block ln_1, qkv [3C], atty, res2,
  //          ln_2, fc and gelu [4C each], the output; the two LayerNorms' mean and rstd; what
  //          attention keeps, K: its probabilities B H S^2, or where the backend has blocked
  //          attention (Ops::blocked_attention, the cpu backend) each row's logsumexp, B H S)
  //          + B S C + 2 B S (ln_f's output, mean and rstd) + B S V (the logits), call it A,
  //          + 1 (the loss)
  //   sequence parallel  A / T + 3 B S + 1: every one of those is split over the group (token
  //          shards of the LayerNorm regions, whose outputs backward gathers again; 1/T of the
  //          heads, the MLP columns and the vocabulary), and the vocabulary-parallel
  //          cross-entropy keeps the whole rows' max and [sum exp; target logit] on each rank.
  //   plain tensor parallel  keeps whole what sequence parallelism splits by tokens: the
  //          embedding output, res2, both LayerNorm outputs and statistics, the output, ln_f's.
  // The peak over forward and backward is printed, not checked: it depends on when the
  // collectives' buffers are released (each is held until the compute stream has passed its
  // collective, whose timing varies run to run).
  if (grid().tensor().size() == 1) SKIP("needs a tensor group of 2 or more");
  const int T = grid().tensor().size();
  const Reference ref(Mode::joint);
  Device& dev = *test::env().device;
  auto current = [&] { return dev.ledger().snapshot().at(MemSpace::device, MemCategory::activations).current; };
  struct Figures {
    int64_t stored = 0, peak = 0;
  };
  auto measure = [&](Run& r) {
    const Batch batch = r.batch();
    r.ops->stream().synchronize();
    dev.ledger().reset_peaks();
    const size_t before = current();
    (void)r.runner->forward(batch, std::vector<bool>(r.model.units.size(), false));
    r.ops->stream().synchronize();
    Figures f;
    f.stored = static_cast<int64_t>(current() - before);
    r.runner->backward(1.0f);
    r.ops->stream().synchronize();
    f.peak = static_cast<int64_t>(dev.ledger().snapshot().at(MemSpace::device, MemCategory::activations).peak - before);
    return f;
  };
  Run one;
  one.build(models::make_gpt(options(), *one.ops));
  Sharded plain_run(grid().tensor(), ref, "", false), seq_run(grid().tensor(), ref, "", true);
  const Figures whole_f = measure(one), plain = measure(plain_run), seq = measure(seq_run);
  const int64_t B = kB, S = kShape.seq_len, C = kShape.n_embd, H = kShape.n_head, V = kShape.vocab_size;
  const int64_t L = kShape.n_layer;
  const int64_t K = one.ops->blocked_attention() ? B * H * S : B * H * S * S;
  const int64_t A = (B * S * C + L * (16 * B * S * C + 4 * B * S + K) + B * S * C + 2 * B * S + B * S * V) * 4;
  const int64_t split_by_tokens = (B * S * C + L * (4 * B * S * C + 4 * B * S) + B * S * C + 2 * B * S) * 4;
  if (print())
    std::printf("[rank %d] stored after forward: one rank %lld, tensor parallel %lld, sequence parallel %lld "
                "bytes (x T = %lld); peak over forward and backward %lld / %lld / %lld\n",
                grid().tensor().rank(), static_cast<long long>(whole_f.stored),
                static_cast<long long>(plain.stored), static_cast<long long>(seq.stored),
                static_cast<long long>(seq.stored * T), static_cast<long long>(whole_f.peak),
                static_cast<long long>(plain.peak), static_cast<long long>(seq.peak));
  CHECK(whole_f.stored == A + 4);
  CHECK(seq.stored == A / T + 3 * B * S * 4 + 4);
  CHECK(plain.stored - seq.stored == split_by_tokens - split_by_tokens / T);
}

TEST_CASE("gpt sequence parallel: the comparison sees a shard with the wrong heads") {
  // The control: c_attn holds the next rank's heads while attn.c_proj keeps this rank's rows.
  // (c_fc's columns move the loss by only 1.8e-4 on 4 ranks: too close to the bound to be a
  // clear control.)
  if (grid().tensor().size() == 1) SKIP("needs a tensor group of 2 or more");
  const Reference ref(Mode::joint);
  Sharded tp(grid().tensor(), ref, "c_attn", true);
  const Result got = tp.run(Mode::joint);
  const double d = std::fabs(got.loss - ref.result.loss) / std::fabs(ref.result.loss);
  if (print()) std::printf("[rank %d] sequence parallel, wrong heads: loss differs by %.3g\n",
                           grid().tensor().rank(), d);
  CHECK(d > 100 * kBound);
}

TEST_CASE("gpt sequence parallel: the traffic formula adds the re-gathers to the ring volume per layer") {
  for (int T : {2, 4, 8}) {
    INFO("degree " << T);
    models::GptOptions o = options(true);
    o.shape.n_layer = 3;
    models::GptOptions plain = o;
    plain.sequence_parallel = false;
    const int64_t b = 4, s = 8, C = kShape.n_embd, a = b * s * C * 4;  // fp32 activations
    const models::TensorParallelTraffic t = models::gpt_tensor_parallel_traffic(o, T, b, s);
    CHECK(t.gs_calls == 10 * 3 + 5);
    CHECK(t.gs_bytes == (10 * 3 + 5) * a);
    CHECK(t.calls == 2 * 3 + 3);
    CHECK(t.bytes == (2 * 3 + 1) * 2 * C * 4 + 3 * b * s * 4);
    // One more layer: a reduce-scatter plus an all-gather per former all-reduce (Megatron's
    // 4 x 2 (T-1)/T x b s h bytes sent), the two re-gathers of the LayerNorm outputs in backward
    // ((T-1)/T x b s h each, so 5 x 2 (T-1)/T x b s h in all), plus the LayerNorms' two [2, C]
    // gradient all-reduces.
    models::GptOptions more = o;
    more.shape.n_layer = 4;
    const double per_layer = models::gpt_tensor_parallel_traffic(more, T, b, s).wire_bytes() - t.wire_bytes();
    CHECK(per_layer == 5 * 2.0 * (T - 1) / T * double(a) + 2 * 2.0 * (T - 1) / T * double(2 * C * 4));
    models::GptOptions more_plain = plain;
    more_plain.shape.n_layer = 4;
    const double per_layer_plain = models::gpt_tensor_parallel_traffic(more_plain, T, b, s).wire_bytes() -
                                   models::gpt_tensor_parallel_traffic(plain, T, b, s).wire_bytes();
    CHECK(per_layer - per_layer_plain == 2.0 * (T - 1) / T * double(a) + 2 * 2.0 * (T - 1) / T * double(2 * C * 4));
    // Recomputing a block repeats its 2 all-gathers and 2 reduce-scatters, which make the 2
    // re-gathers unnecessary.
    CHECK(models::gpt_tensor_parallel_traffic(o, T, b, s, 3).gs_bytes == t.gs_bytes + 3 * 2 * a);
    // bf16 gradients halve the LayerNorm all-reduces.
    CHECK(models::gpt_tensor_parallel_traffic(o, T, b, s, 0, ScalarType::bf16).bytes ==
          (2 * 3 + 1) * 2 * C * 2 + 3 * b * s * 4);
  }
  CHECK(models::gpt_tensor_parallel_traffic(options(true), 1, kB, 8) == models::TensorParallelTraffic{});
}

TEST_CASE("gpt sequence parallel: a sequence the degree does not divide is a clear error") {
  models::GptShape odd = kShape;
  odd.seq_len = 10;
  CHECK_THROWS_WITH(models::check_sequence_parallel(odd, 4),
                    ContainsSubstring("seq_len 10") && ContainsSubstring("degree 4") &&
                        ContainsSubstring("zero_train.model.seq_len") &&
                        ContainsSubstring("zero_train.parallel.tensor"));
  CHECK_NOTHROW(models::check_sequence_parallel(odd, 2));
  if (grid().tensor().size() == 1) return;
  // make_gpt_tensor_parallel refuses it too (10 is not divisible by 4; with 2 ranks use 9).
  models::GptOptions o = options(true);
  o.shape.seq_len = grid().tensor().size() == 4 ? 10 : 9;
  auto stream = test::env().device->create_stream("gpt");
  auto ops = models::make_ops(*test::env().device, *stream);
  CHECK_THROWS_WITH(models::make_gpt_tensor_parallel(o, *ops, grid().tensor()),
                    ContainsSubstring("zero_train.model.seq_len"));
  // A batch shorter than seq_len whose length the degree does not divide: the embedding refuses
  // it on the host, before any collective (every rank throws alike).
  Model m = models::make_gpt_tensor_parallel(options(true), *ops, grid().tensor());
  test::ModelRunner runner(m, *ops, kSeed);
  const int64_t S = grid().tensor().size() == 4 ? 6 : 7;
  const std::vector<int32_t> ids(static_cast<size_t>(S), 1);
  const Batch batch = runner.make_batch(Shape{1, S}, ids, Shape{1, S}, ids);
  CHECK_THROWS_WITH(runner.forward(batch, std::vector<bool>(m.units.size(), false)),
                    ContainsSubstring("sequence parallelism splits the sequence of " + std::to_string(S)) &&
                        ContainsSubstring("zero_train.parallel.tensor"));
}
