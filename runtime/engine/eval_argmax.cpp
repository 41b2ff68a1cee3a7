// The most likely next token of every row of the model's logits, for evaluation (evaluate.cpp,
// pipeline_evaluate.cpp). With tensor slices (TensorPlace) the last Unit's output holds only
// this rank's vocabulary columns (models::make_gpt_tensor_parallel: rank t of T holds ids
// [t V/T, (t+1) V/T)); each rank takes its columns' best, and the tensor group's bests are
// exchanged (an all-gather of (value, id) per row: 2 words, bits moved unchanged) and the
// largest value wins, ties to the lower id, as over whole logits. The logits are never gathered.
#include <algorithm>
#include <cstring>
#include <optional>

#include "runtime/engine/engine_state.hpp"

namespace zero::engine {
namespace {

// The logits [.., V] on the host, widened exactly to double (fp64, fp32 or 16-bit).
std::vector<double> host_logits(Context& x, const Tensor& out) {
  const std::optional<DType> lt = to_dtype(out.type());
  std::vector<double> logits(static_cast<size_t>(out.numel()));
  if (out.type() == ScalarType::f64) {
    copy_to_host(x.dev, x.compute, logits.data(), out);
    x.compute.synchronize();
    return logits;
  }
  std::vector<unsigned char> raw(static_cast<size_t>(out.numel()) * size_of(*lt));
  copy_to_host(x.dev, x.compute, raw.data(), out);
  x.compute.synchronize();
  std::vector<float> f(logits.size());
  convert(raw.data(), *lt, f.data(), DType::f32, f.size());
  std::copy(f.begin(), f.end(), logits.begin());
  return logits;
}

}  // namespace

std::vector<int32_t> argmax_rows(Context& x, const Unit& last, const Tensor& out, const std::string& what) {
  ZERO_REQUIRE(out && out.shape().rank() >= 1 && (out.type() == ScalarType::f64 || to_dtype(out.type())),
               what + ": the model's last Unit gives no floating-point logits to take the argmax of");
  const int64_t V = out.shape()[out.shape().rank() - 1];
  const int64_t rows = out.numel() / V;
  const std::vector<double> logits = host_logits(x, out);
  // This rank's columns' first id: with tensor slices the offset of its vocabulary slice, read
  // from the last Unit's vocabulary-split parameter (the tied wte, cut by rows).
  int64_t first = 0;
  const bool sliced = x.tensor.active();
  if (sliced) {
    const ParamSlice* vocab = nullptr;
    for (int p : last.param_ids()) {
      const ParamSlice& sl = x.model.params[static_cast<size_t>(p)].slice;
      if (sl.split == TensorSplit::sliced && sl.dim == 0 && sl.blocks == 1) vocab = &sl;
    }
    ZERO_REQUIRE(vocab != nullptr && vocab->full[0] == V * vocab->degree,
                 what + ": on tensor rank " + std::to_string(x.tensor.comm->rank()) + " of " +
                     std::to_string(x.tensor.comm->size()) + " the last Unit's output has " + std::to_string(V) +
                     " columns, which is no vocabulary slice of a parameter it holds");
    first = vocab->rank * V;
  }
  std::vector<float> best(static_cast<size_t>(rows) * 2);  // per row: value, id (as bits)
  for (int64_t r = 0; r < rows; ++r) {
    const double* row = logits.data() + r * V;
    const int32_t id = static_cast<int32_t>(first + (std::max_element(row, row + V) - row));
    const float value = static_cast<float>(row[id - first]);  // exact: the logits are at most fp32 here
    std::memcpy(&best[static_cast<size_t>(2 * r)], &value, 4);
    std::memcpy(&best[static_cast<size_t>(2 * r + 1)], &id, 4);
  }
  std::vector<int32_t> am(static_cast<size_t>(rows));
  if (!sliced) {
    for (int64_t r = 0; r < rows; ++r) std::memcpy(&am[static_cast<size_t>(r)], &best[static_cast<size_t>(2 * r + 1)], 4);
    return am;
  }
  coll::Communicator& tc = *x.tensor.comm;
  const size_t n = best.size(), T = static_cast<size_t>(tc.size());
  std::vector<float> all(n * T);
  if (tc.kind() == DeviceKind::cpu) {
    tc.all_gather(best.data(), all.data(), n, DType::f32).wait();
  } else {  // NCCL moves device buffers
    Tensor t = Tensor::empty(x.dev, Shape{static_cast<int64_t>(n * T)}, ScalarType::f32, MemCategory::other);
    float* mine = t.data_as<float>() + n * static_cast<size_t>(tc.rank());
    x.copy_now(mine, best.data(), n * 4);
    tc.all_gather(mine, t.data(), n, DType::f32, x.compute_point()).wait();
    x.copy_now(all.data(), t.data(), all.size() * 4);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float top = 0;
    int32_t id = 0;
    for (size_t k = 0; k < T; ++k) {  // rank order = id order: a strict > keeps the lower id
      float v;
      int32_t i;
      std::memcpy(&v, &all[k * n + static_cast<size_t>(2 * r)], 4);
      std::memcpy(&i, &all[k * n + static_cast<size_t>(2 * r + 1)], 4);
      if (k == 0 || v > top) {
        top = v;
        id = i;
      }
    }
    am[static_cast<size_t>(r)] = id;
  }
  return am;
}

}  // namespace zero::engine
