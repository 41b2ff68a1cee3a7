// The activation header of a pipeline boundary (engine_state.hpp): written by pipeline_step and
// pipeline_evaluate before each activation they send, read by the next stage before it posts
// (first step) or checks (later steps) the activation's receive.
#include <string>

#include "core/error.hpp"
#include "runtime/engine/engine_state.hpp"

namespace zero::engine {

std::array<int32_t, kPipeHeader> encode_header(const PipeBoundary& b) {
  static_assert(kPipeHeader >= 2 + Shape::kMaxRank, "the header holds every dimension");
  std::array<int32_t, kPipeHeader> h{};
  h[0] = static_cast<int32_t>(b.type);
  h[1] = b.shape.rank();
  for (int d = 0; d < b.shape.rank(); ++d) h[static_cast<size_t>(2 + d)] = static_cast<int32_t>(b.shape[d]);
  return h;
}

PipeBoundary decode_header(const int32_t* h, const std::string& where, int from) {
  bool ok = h[0] >= 0 && h[0] <= static_cast<int>(ScalarType::i32) && h[1] >= 1 && h[1] <= Shape::kMaxRank;
  for (int d = 0; ok && d < h[1]; ++d) ok = h[2 + d] >= 0;
  ZERO_REQUIRE(ok, where + ": a malformed activation header from pipeline stage " + std::to_string(from) +
                       " (type " + std::to_string(h[0]) + ", rank " + std::to_string(h[1]) +
                       ")\nHINT: every rank of a pipeline must run the same zero-train build and "
                       "the same schedule");
  const Shape shape = h[1] == 1   ? Shape{h[2]}
                      : h[1] == 2 ? Shape{h[2], h[3]}
                      : h[1] == 3 ? Shape{h[2], h[3], h[4]}
                                  : Shape{h[2], h[3], h[4], h[5]};
  return PipeBoundary{static_cast<ScalarType>(h[0]), shape};
}

}  // namespace zero::engine
