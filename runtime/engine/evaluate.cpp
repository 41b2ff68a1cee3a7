// Forward-only evaluation on held-out data: nothing changes, no activations kept.
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
    if (argmax) *argmax = engine::argmax_rows(s.x, *s.x.model.units.back(), ctx.back().output, "evaluate");
    if (s.x.o.stage == 3) s.params.prefetch(0);  // the next step's first groups again
    return f64 ? loss64 : loss32;
  } catch (...) {
    s.quiesce();
    throw;
  }
}


}  // namespace zero
