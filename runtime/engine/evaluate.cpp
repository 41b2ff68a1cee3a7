// Forward-only evaluation on held-out data: nothing changes, no activations kept.
#include <algorithm>
#include <optional>

#include "runtime/engine/engine_state.hpp"

namespace zero {

double Engine::evaluate(const Batch& batch, std::vector<int32_t>* argmax) {
  State& s = *s_;
  try {
    const size_t U = s.x.model.units.size();
    std::vector<UnitContext> ctx(U);
    Tensor prev;
    if (s.x.o.stage == 3) s.params.release_all();  // gathered on demand below, one Unit at a time
    for (size_t u = 0; u < U; ++u) {
      UnitContext& c = ctx[u];
      s.params.use(static_cast<int>(u));
      c.batch = &batch;
      c.input = prev;
      c.checkpoint = true;  // keep no activations for a backward that never comes
      c.params = s.params.views(static_cast<int>(u));
      s.x.model.units[u]->forward(c);
      c.params.clear();
      prev = c.output;
      if (s.x.o.stage == 3) s.params.release_all(); else s.x.compute_point()->synchronize();
    }
    double loss64 = 0;
    float loss32 = 0;
    const bool f64 = ctx.back().loss.type() == ScalarType::f64;
    copy_to_host(s.x.dev, s.x.compute, f64 ? static_cast<void*>(&loss64) : static_cast<void*>(&loss32), ctx.back().loss);
    s.x.compute.synchronize();
    if (argmax) {
      const Tensor& out = ctx.back().output;
      const std::optional<DType> lt = out ? to_dtype(out.type()) : std::nullopt;
      ZERO_REQUIRE(out && out.shape().rank() >= 1 && (out.type() == ScalarType::f64 || lt),
                   "evaluate: the model's last Unit gives no floating-point logits to take the argmax of");
      const int64_t V = out.shape()[out.shape().rank() - 1];
      const int64_t rows = out.numel() / V;
      std::vector<double> logits(static_cast<size_t>(out.numel()));
      if (out.type() == ScalarType::f64) {
        copy_to_host(s.x.dev, s.x.compute, logits.data(), out);
        s.x.compute.synchronize();
      } else {  // fp32, or the 16-bit logits of a GPU run, widened exactly
        std::vector<unsigned char> raw(static_cast<size_t>(out.numel()) * size_of(*lt));
        copy_to_host(s.x.dev, s.x.compute, raw.data(), out);
        s.x.compute.synchronize();
        std::vector<float> f(logits.size());
        convert(raw.data(), *lt, f.data(), DType::f32, f.size());
        std::copy(f.begin(), f.end(), logits.begin());
      }
      argmax->assign(static_cast<size_t>(rows), 0);
      for (int64_t r = 0; r < rows; ++r) {
        const double* row = logits.data() + r * V;
        (*argmax)[static_cast<size_t>(r)] = static_cast<int32_t>(std::max_element(row, row + V) - row);
      }
    }
    if (s.x.o.stage == 3) s.params.prefetch(0);  // the next step's first groups again
    return f64 ? loss64 : loss32;
  } catch (...) {
    s.quiesce();
    throw;
  }
}


}  // namespace zero
