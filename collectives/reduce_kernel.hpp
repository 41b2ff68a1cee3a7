// The reduction arithmetic every backend shares (see communicator.hpp, "Arithmetic"):
//   out[i] = op over q = 0 .. n_inputs-1 of inputs[q][i]
// accumulated in fp32 in input order ((x0 + x1) + x2) + ..., for avg divided by `divisor`,
// rounded once to `dtype`. max propagates NaN (equal values: the earlier input wins); every NaN
// result is written as the canonical quiet NaN (0x7fc00000 before rounding). `out` may be one of the inputs (the same pointer:
// element-wise in place); otherwise no overlap. Single-threaded; vectorised with run-time
// dispatch (AVX2 / AVX-512 where present).
#pragma once

#include <cstddef>

#include "collectives/communicator.hpp"

namespace zero::coll {

void host_reduce(DType dtype, ReduceOp op, int divisor, const void* const* inputs, int n_inputs,
                 void* out, size_t count);

}  // namespace zero::coll
