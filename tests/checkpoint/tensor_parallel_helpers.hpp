// Shared by the tensor-parallel checkpoint tests (tests/checkpoint/tensor_parallel_test.cpp and
// tests/mpi/checkpoint_test.cpp): a small GPT's shard tables at any degree, and one rank of a
// data x tensor grid: its pieces of the whole parameters (through whole_pieces) and its shard
// values, a pure function of (array, parameter, WHOLE element index) computed from the shard
// side with core's param_slice_element, never from the pieces under test. Test-only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/unit.hpp"
#include "models/gpt_tensor_parallel.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/slice_pieces.hpp"
#include "tests/checkpoint/helpers.hpp"

namespace zero::checkpoint::test {

inline models::GptOptions tp_options() {
  models::GptOptions o;
  o.shape = {2, 16, 4, 20, 8};  // layers, n_embd, heads, vocabulary, positions
  return o;
}

// Tensor rank `rank` of `degree`'s parameter table: wte split by vocabulary rows (as the
// tensor-parallel embedding will be), wpe unsliced, two tensor-parallel blocks (columns with
// q | k | v blocks, rows, replicated LayerNorms and biases), ln_f replicated.
inline std::vector<ParamSpec> shard_specs(int rank, int degree) {
  const models::GptOptions o = tp_options();
  const int64_t V = o.shape.vocab_size, C = o.shape.n_embd, T = o.shape.seq_len;
  std::vector<ParamSpec> p;
  p.push_back({"wte.weight", Shape{V / degree, C}});
  p.back().slice = {TensorSplit::sliced, Shape{V, C}, 0, 1, rank, degree};
  p.push_back({"wpe.weight", Shape{T, C}});
  for (int layer = 0; layer < o.shape.n_layer; ++layer)
    models::add_tensor_parallel_block_params(p, o, layer, rank, degree);
  p.push_back({"ln_f.weight", Shape{C}});
  p.back().slice = {TensorSplit::replicated, Shape{C}, 0, 1, rank, degree};
  for (const ParamSpec& s : p) check_param_slice(s);
  return p;
}

inline std::vector<ParamInfo> table_of(std::vector<ParamSpec> specs) {
  Model m;
  m.params = std::move(specs);
  return param_table(m);
}

// One rank of a data x tensor grid: its pieces of the whole parameters and, per array, its
// shard values in piece order.
struct GridRank {
  std::vector<Piece> pieces;
  std::vector<std::vector<float>> values;  // [array]
};

// Data rank `d` of `D` of tensor rank `t` of `degree`: the shard's parameters concatenated in
// table order are cut into D nearly equal contiguous ranges (a partitioner without padding:
// ranges straddle parameters and split rows). `saving`: parameters that are not sliced
// (replicated, or unsliced like wpe here) are written by tensor rank 0 only: every tensor rank
// holds all of them, and the tiling check refuses a second copy.
inline GridRank grid_rank(int t, int degree, int d, int D, bool saving) {
  const std::vector<ParamSpec> specs = shard_specs(t, degree);
  int64_t total = 0;
  for (const ParamSpec& s : specs) total += s.numel();
  const int64_t lo = total * d / D, hi = total * (d + 1) / D;
  GridRank g;
  g.values.resize(array_names().size());
  int64_t base = 0;
  for (size_t p = 0; p < specs.size(); ++p) {
    const ParamSpec& s = specs[p];
    const int64_t a = std::max(lo, base), b = std::min(hi, base + s.numel());
    base += s.numel();
    if (a >= b) continue;
    if (saving && s.slice.split != TensorSplit::sliced && t != 0) continue;
    const int64_t first = a - (base - s.numel());
    for (const Piece& piece : whole_pieces(s.slice, static_cast<int>(p), first, b - a))
      g.pieces.push_back(piece);
    for (size_t arr = 0; arr < array_names().size(); ++arr)
      for (int64_t i = first; i < first + (b - a); ++i)
        g.values[arr].push_back(value(static_cast<int>(arr), static_cast<int>(p),
                                      param_slice_element(s, i)));
  }
  return g;
}

}  // namespace zero::checkpoint::test
