// parallel_chunks: one element-wise pass over [0, n) cut into fixed chunks on oneTBB's threads.
//
// The chunk boundaries depend only on n and `chunk`, never on the thread count, so a pass whose
// every element's result depends only on that element (a copy, a fill, a conversion, acc += x)
// writes the same bits on any number of threads. Used by the cpu device's copies and fills and
// by the engine's host state kernels (accumulate, convert). The pieces run on oneTBB's workers,
// so the process's thread budget (tbb::global_control, runtime/train/run.cpp) bounds them.
#pragma once

#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstddef>

namespace zero {

// Calls f(begin, end) for consecutive pieces of `chunk` elements (the last one shorter), in
// parallel; a range of at most `serial_chunks` pieces is one call f(0, n) on the calling thread
// (a task per piece would cost more than it saves). n == 0 calls nothing.
template <class F>
void parallel_chunks(size_t n, size_t chunk, size_t serial_chunks, const F& f) {
  if (n == 0) return;
  const size_t count = (n + chunk - 1) / chunk;
  if (count <= serial_chunks) return f(size_t{0}, n);
  tbb::parallel_for(size_t{0}, count,
                    [&](size_t c) { f(c * chunk, std::min(n, (c + 1) * chunk)); });
}

}  // namespace zero
