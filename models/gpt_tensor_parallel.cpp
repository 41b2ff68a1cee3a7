#include "models/gpt_tensor_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.hpp"
#include "models/gpt_ends.hpp"

namespace zero::models {

void check_tensor_parallel(const GptShape& s, int degree) {
  const std::string keys = " (zero_train.model.n_head, zero_train.parallel.tensor)";
  ZERO_REQUIRE(degree >= 1, "tensor parallel: the degree must be at least 1, got " +
                                std::to_string(degree) + " (zero_train.parallel.tensor)");
  // Attention is split by whole heads: each rank runs H/T of them on its own.
  ZERO_REQUIRE(s.n_head % degree == 0,
               "tensor parallel: n_head " + std::to_string(s.n_head) +
                   " is not divisible by the tensor-parallel degree " + std::to_string(degree) +
                   ": pick a degree that divides the heads" + keys);
  // Implied by the above when n_head divides n_embd; checked for shapes that skip that check.
  ZERO_REQUIRE((4 * static_cast<int64_t>(s.n_embd)) % degree == 0 && s.n_embd % degree == 0,
               "tensor parallel: the MLP's 4 x n_embd = " + std::to_string(4 * static_cast<int64_t>(s.n_embd)) +
                   " columns (and n_embd " + std::to_string(s.n_embd) +
                   ") are not divisible by the tensor-parallel degree " + std::to_string(degree) +
                   " (zero_train.model.n_embd, zero_train.parallel.tensor)");
  // The token embedding and the tied head are split by vocabulary rows, equal parts per rank.
  ZERO_REQUIRE(s.vocab_size % degree == 0,
               "tensor parallel: vocab_size " + std::to_string(s.vocab_size) +
                   " is not divisible by the tensor-parallel degree " + std::to_string(degree) +
                   ": the embedding and the LM head are split by vocabulary rows; pad the vocabulary to a "
                   "multiple of the degree (zero_train.model.vocab_size, zero_train.parallel.tensor)");
}

void check_sequence_parallel(const GptShape& s, int degree) {
  check_tensor_parallel(s, degree);
  ZERO_REQUIRE(s.seq_len % degree == 0,
               "sequence parallel: seq_len " + std::to_string(s.seq_len) +
                   " is not divisible by the tensor-parallel degree " + std::to_string(degree) +
                   ": each tensor rank keeps 1/degree of the sequence between the blocks; pick a sequence "
                   "length divisible by the degree (zero_train.model.seq_len, zero_train.parallel.tensor)");
}

std::vector<int> add_tensor_parallel_block_params(std::vector<ParamSpec>& params, const GptOptions& o,
                                                  int layer, int rank, int degree) {
  check_tensor_parallel(o.shape, degree);
  ZERO_REQUIRE(rank >= 0 && rank < degree, "tensor parallel: rank " + std::to_string(rank) +
                                               " is outside the tensor group of " + std::to_string(degree));
  const int64_t C = o.shape.n_embd, T = degree;
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(o.shape.n_layer));
  const std::string h = "h." + std::to_string(layer) + ".";
  std::vector<int> ids;
  // The same names, initialisation and decay as make_gpt's block (models/gpt.cpp); a test
  // compares the degree-1 table with make_gpt's.
  auto add = [&](const std::string& name, Shape full, ParamInit init, float std_dev, TensorSplit split,
                 int dim = 0, int blocks = 1) {
    ParamSpec p;
    p.name = h + name;
    p.type = o.param_type;
    p.weight_decay = full.rank() >= 2;
    p.init = init;
    p.init_std = std_dev;
    p.slice = ParamSlice{split, full, dim, blocks, rank, degree};
    if (split == TensorSplit::sliced) {
      p.shape = full.rank() == 1 ? Shape{full[0] / T}
                : dim == 0       ? Shape{full[0] / T, full[1]}
                                 : Shape{full[0], full[1] / T};
    } else {
      p.shape = full;
    }
    check_param_slice(p);
    params.push_back(std::move(p));
    ids.push_back(static_cast<int>(params.size()) - 1);
  };
  const auto rep = TensorSplit::replicated, cut = TensorSplit::sliced;
  add("ln_1.weight", Shape{C}, ParamInit::ones, 0.02f, rep);
  add("ln_1.bias", Shape{C}, ParamInit::zeros, 0.02f, rep);
  add("attn.c_attn.weight", Shape{C, 3 * C}, ParamInit::normal, 0.02f, cut, 1, 3);  // q | k | v
  add("attn.c_attn.bias", Shape{3 * C}, ParamInit::zeros, 0.02f, cut, 0, 3);
  add("attn.c_proj.weight", Shape{C, C}, ParamInit::normal, proj_std, cut, 0);      // input rows
  add("attn.c_proj.bias", Shape{C}, ParamInit::zeros, 0.02f, rep);
  add("ln_2.weight", Shape{C}, ParamInit::ones, 0.02f, rep);
  add("ln_2.bias", Shape{C}, ParamInit::zeros, 0.02f, rep);
  add("mlp.c_fc.weight", Shape{C, 4 * C}, ParamInit::normal, 0.02f, cut, 1);        // columns
  add("mlp.c_fc.bias", Shape{4 * C}, ParamInit::zeros, 0.02f, cut, 0);
  add("mlp.c_proj.weight", Shape{4 * C, C}, ParamInit::normal, proj_std, cut, 0);   // input rows
  add("mlp.c_proj.bias", Shape{C}, ParamInit::zeros, 0.02f, rep);
  return ids;
}

namespace {

// What a tensor group of more than one rank needs beyond make_gpt's checks: types the
// collectives sum, and a communicator of the device's kind (TensorGroup checks that).
void check_tensor_parallel_types(const GptOptions& o, const coll::Communicator& tensor, const std::string& who) {
  if (tensor.size() == 1) return;  // no all-reduce runs
  const ScalarType a = o.activation_type;
  ZERO_REQUIRE(to_dtype(a).has_value(), who + ": activations must be fp32, bf16 or fp16 (the all-reduce sums "
                                              "those), got " + std::string(to_string(a)));
  ZERO_REQUIRE(o.param_type != ScalarType::i32 && o.param_type != ScalarType::f64,
               who + ": parameters must be fp32, bf16 or fp16, got " + std::string(to_string(o.param_type)));
}

// A parameter of the ends: whole on every rank (replicated), as make_gpt lists it.
ParamSpec replicated(const GptOptions& o, std::string name, Shape shape, ParamInit init, int rank, int degree) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = shape;
  p.type = o.param_type;
  p.weight_decay = shape.rank() >= 2;
  p.init = init;
  p.init_std = 0.02f;
  p.slice = ParamSlice{TensorSplit::replicated, shape, 0, 1, rank, degree};
  check_param_slice(p);
  return p;
}

}  // namespace

std::vector<ParamSpec> gpt_tensor_parallel_params(const GptOptions& o, int rank, int degree) {
  check_tensor_parallel(o.shape, degree);
  ZERO_REQUIRE(rank >= 0 && rank < degree, "tensor parallel: rank " + std::to_string(rank) +
                                               " is outside the tensor group of " + std::to_string(degree));
  const GptShape& s = o.shape;
  const int64_t C = s.n_embd;
  // make_gpt's order: wte, wpe, the blocks, ln_f (models/gpt.cpp; a test compares the tables).
  std::vector<ParamSpec> params;
  // wte [V, C]: rows [rank, rank + 1) V / degree (the vocabulary-parallel embedding and head).
  ParamSpec wte = replicated(o, "wte.weight", Shape{s.vocab_size, C}, ParamInit::normal, rank, degree);
  wte.shape = Shape{s.vocab_size / degree, C};
  wte.slice.split = TensorSplit::sliced;
  check_param_slice(wte);
  params.push_back(std::move(wte));
  params.push_back(replicated(o, "wpe.weight", Shape{s.seq_len, C}, ParamInit::normal, rank, degree));
  for (int l = 0; l < s.n_layer; ++l) (void)add_tensor_parallel_block_params(params, o, l, rank, degree);
  params.push_back(replicated(o, "ln_f.weight", Shape{C}, ParamInit::ones, rank, degree));
  params.push_back(replicated(o, "ln_f.bias", Shape{C}, ParamInit::zeros, rank, degree));
  return params;
}

Model make_gpt_tensor_parallel(const GptOptions& o, Ops& ops, coll::Communicator& tensor) {
  check_gpt_options(o, ops);
  check_tensor_parallel(o.shape, tensor.size());
  check_tensor_parallel_types(o, tensor, "gpt (tensor parallel)");
  if (o.sequence_parallel) check_sequence_parallel(o.shape, tensor.size());
  const GptShape& s = o.shape;
  const int rank = tensor.rank(), degree = tensor.size();
  Model m;
  m.name = "gpt(n_layer " + std::to_string(s.n_layer) + ", n_embd " + std::to_string(s.n_embd) + ", n_head " +
           std::to_string(s.n_head) + ", vocab " + std::to_string(s.vocab_size) + ", seq_len " +
           std::to_string(s.seq_len) + ")";
  if (degree > 1) m.name += " tensor rank " + std::to_string(rank) + " of " + std::to_string(degree);
  if (degree > 1 && o.sequence_parallel) m.name += ", sequence parallel";
  m.sharded_activations = degree > 1 && o.sequence_parallel;
  m.params = gpt_tensor_parallel_params(o, rank, degree);
  const int wte = 0, wpe = 1;
  // Each Unit its own group (its own event); degree 1 needs no communicator: make_gpt's Units
  // exactly.
  auto group = [&](const std::string& name) {
    return degree > 1 ? TensorGroup(tensor, ops.device(), "gpt unit " + name) : TensorGroup();
  };
  m.units.push_back(std::make_unique<GptEmbedding>("embedding", std::vector<int>{wte, wpe}, ops, o, group("embedding")));
  for (int l = 0; l < s.n_layer; ++l) {
    std::vector<int> ids;
    for (int i = 0; i < 12; ++i) ids.push_back(2 + 12 * l + i);
    const std::string name = "h." + std::to_string(l);
    m.units.push_back(std::make_unique<GptBlock>(name, std::move(ids), ops, o, group(name)));
  }
  const int lnf = 2 + 12 * s.n_layer;
  m.units.push_back(
      std::make_unique<GptHead>("head", std::vector<int>{lnf, lnf + 1, wte}, ops, o, group("head")));
  return m;
}

TensorParallelTraffic gpt_tensor_parallel_traffic(const GptOptions& o, int degree, int64_t micro_batch,
                                                  int64_t seq_len, int checkpointed_blocks,
                                                  std::optional<ScalarType> grad_type) {
  check_tensor_parallel(o.shape, degree);
  ZERO_REQUIRE(micro_batch >= 0 && seq_len >= 0 && checkpointed_blocks >= 0 &&
                   checkpointed_blocks <= o.shape.n_layer,
               "tensor parallel traffic: micro_batch " + std::to_string(micro_batch) + ", seq_len " +
                   std::to_string(seq_len) + " and checkpointed blocks " + std::to_string(checkpointed_blocks) +
                   " must be non-negative, the last at most n_layer " + std::to_string(o.shape.n_layer));
  TensorParallelTraffic t;
  t.degree = degree;
  if (degree == 1) return t;  // no collective runs
  const int64_t rows = micro_batch * seq_len;
  const int64_t act = rows * o.shape.n_embd * static_cast<int64_t>(size_of(o.activation_type));
  const int64_t stat = rows * static_cast<int64_t>(size_of(ScalarType::f32));
  const int64_t L = o.shape.n_layer, ck = checkpointed_blocks;
  if (!o.sequence_parallel) {
    const int64_t block_calls = 4 * L + 2 * ck;
    t.calls = block_calls + 4;                     // + embedding, head max, head sums, head backward
    t.bytes = (block_calls + 2) * act + 3 * stat;  // the head's max and sums: 1 + 2 rows of fp32
    return t;
  }
  // Sequence parallel: every all-reduce of an activation becomes a reduce-scatter or an
  // all-gather of the same buffer, and each backward all-reduce's conjugate joins it; the
  // replicated LayerNorms' [2, C] gradients are all-reduced (gradients' type).
  const int64_t ln = 2 * o.shape.n_embd * static_cast<int64_t>(size_of(grad_type.value_or(o.param_type)));
  // Blocks 4 forward + 4 backward + 2 re-gathers of the LayerNorm outputs (a recomputed block
  // has them from its recompute, which repeats the forward's 4); embedding 2; head 3 (its
  // re-gather of ln_f's output too).
  t.gs_calls = 10 * L + 2 * ck + 5;
  t.gs_bytes = t.gs_calls * act;
  t.calls = 2 * L + 3;  // ln_1 and ln_2 per block; the head's max, sums and ln_f
  t.bytes = (2 * L + 1) * ln + 3 * stat;
  return t;
}

TensorParallelTraffic measured_tensor_parallel_traffic(const Model& model) {
  TensorParallelTraffic t;
  for (const ParamSpec& p : model.params) t.degree = std::max(t.degree, p.slice.degree);
  for (const auto& u : model.units) {
    const auto* g = dynamic_cast<const GptUnit*>(u.get());
    if (g == nullptr) continue;  // not a GPT Unit: no tensor all-reduces of ours
    t.calls += g->all_reduce_calls();
    t.bytes += g->all_reduce_bytes();
    t.gs_calls += g->gather_scatter_calls();
    t.gs_bytes += g->gather_scatter_bytes();
  }
  return t;
}

TensorParallelBlock::TensorParallelBlock(std::string name, std::vector<int> ids, Ops& ops, const GptOptions& o,
                                         coll::Communicator& tensor)
    : GptBlock(name, std::move(ids), ops, o, TensorGroup(tensor, ops.device(), "tensor parallel block " + name)) {
  check_tensor_parallel(o.shape, tensor.size());
  if (o.sequence_parallel) check_sequence_parallel(o.shape, tensor.size());
  const ScalarType a = o.activation_type;
  ZERO_REQUIRE(to_dtype(a).has_value(),
               "tensor parallel block " + name_ + ": activations must be fp32, bf16 or fp16 (the "
               "all-reduce sums those), got " + std::string(to_string(a)));
  ZERO_REQUIRE(o.param_type != ScalarType::i32 && o.param_type != ScalarType::f64,
               "tensor parallel block " + name_ + ": parameters must be fp32, bf16 or fp16, got " +
                   std::string(to_string(o.param_type)));
}

}  // namespace zero::models
