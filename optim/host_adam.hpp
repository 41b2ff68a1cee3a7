// HostAdam: the AdamW / Adam step of optim/adam.hpp on the host, for the fp32 master state of a
// rank's shard (ZeRO-Offload's CPU step), at the memory-bandwidth limit.
//
// One pass over memory per step: per element it reads p, m, v (fp32) and the gradient (fp32,
// fp16 or bf16), writes p, m, v and, optionally, the 16-bit copy of p (bf16 or fp16) that goes
// to the device. bytes_per_param() says how many bytes that is; the pass is memory-bound, so
// that figure divided by the machine's bandwidth is the step's time.
//
// Results are specified bit for bit: every element is the fp32 evaluation of the formula in
// adam.hpp in the order written there, each operation rounded once (round to nearest even, no
// fused multiply-add), with the fp32 scalars of adam_scalars(). So the AVX-512, AVX2 and portable
// paths, every thread count, every chunking and every sub-range give the same bits, on any x86
// host. Against the exact (double) formula that is within a few ULPs per step: see
// docs/host-adam.md and tests/optim/host_adam_test.cpp for the bound and its reasoning. The
// 16-bit copy equals to_bfloat16(p) / to_half(p) (core/dtype.hpp) exactly. Assumes the
// default floating-point environment (round to nearest, no flush-to-zero), as dtype.hpp does.
//
// Memory: p, m, v and the gradient are read through the caches with software prefetches
// kPrefetch elements ahead (the hardware prefetchers alone leave 6-10% of the bandwidth unused
// here); p, m, v are written back with ordinary stores (their lines are already in cache). The
// 16-bit copy is write-only and goes to the device next, so it is written with non-temporal
// (streaming) stores that skip the read-for-ownership, whenever it is 32-byte aligned where the
// vector loop starts (e.g. buffers aligned alike); otherwise with ordinary stores.
// Layout: buffers whose addresses are equal modulo 2 MiB (e.g. separate large allocations on
// transparent huge pages) cost this step 30-45% on the development machine (a memory-system
// conflict; see docs/host-adam.md): start each buffer at a different offset, e.g. a page and a
// cache line apart.
//
// Threads: step() runs on a oneTBB task_arena of threads() threads owned by this object; the
// calling thread joins the arena and step() returns when every element is done (it blocks on
// nothing else). The range is cut into fixed chunks of kChunk elements, independent of the thread
// count; a range of one chunk or less runs on the calling thread alone. Several threads may call
// step() on one HostAdam at once for disjoint ranges; they share the arena's threads.
#pragma once

#include <cstddef>
#include <memory>

#include "optim/adam.hpp"
#include "core/dtype.hpp"

namespace zero::optim {

// Bytes of memory traffic one element's step costs: p, m, v and the gradient read, p, m, v
// written, plus the 16-bit copy written when copy_out. 28 for fp32 gradients, 26 for 16-bit
// ones; +2 with a 16-bit copy (+4 for an fp32 copy).
size_t bytes_per_param(DType grad_dtype, bool copy_out, DType copy_dtype);

class HostAdam {
 public:
  // Which vector code runs. `best` picks the widest the CPU supports at run time (AVX-512F, else
  // AVX2 with F16C, else portable); the others are for tests and benchmarks, and throw
  // zero::Error when the CPU lacks them. All give identical results.
  enum class Simd { best, avx512, avx2, portable };

  // Elements per chunk: the unit of parallel work (fixed, so never a function of threads).
  static constexpr size_t kChunk = size_t{1} << 15;
  // Software prefetch distance, in elements of each stream (2 KiB ahead in the fp32 ones).
  // Public for bench/host_adamw.cpp, whose bandwidth-limit kernel copies the access pattern.
  static constexpr size_t kPrefetch = 512;

  // threads: the arena's size; 0 = oneTBB's default (the cores this process may use).
  explicit HostAdam(int threads = 0, Simd simd = Simd::best);
  ~HostAdam();
  HostAdam(const HostAdam&) = delete;
  HostAdam& operator=(const HostAdam&) = delete;

  int threads() const;
  Simd simd() const;  // never `best`: the path actually taken

  // One step over n elements: param, m, v (fp32, updated in place), grad (n elements of
  // grad_dtype, read only) and, when param_copy is not null, n elements of copy_dtype (fp16 or
  // bf16) written with the new parameters. Pass offset pointers for a sub-range: no alignment is
  // needed beyond the element's. The ranges must not overlap each other. The caller owns every
  // buffer and must not touch them until step() returns. n = 0 does nothing.
  void step(const AdamParams& params, const AdamStep& step, float* param, float* m, float* v,
            const void* grad, DType grad_dtype, size_t n, void* param_copy = nullptr,
            DType copy_dtype = DType::bf16);

  // The same step out of place: reads param_in, m_in, v_in and writes param, m, v (each pair
  // either the same buffer or not overlapping at all). Identical bits to step(). param_copy may
  // also be grad itself when copy_dtype is grad_dtype: each element's gradient is read before its
  // copy is written (the NVMe tier writes the new 16-bit parameters over the landed gradients). The engine's
  // speculative host step runs AdamW into a second copy of the state, which it keeps or drops
  // once the global gradient norm is known, so a wrong guess costs no extra memory traffic.
  void step_into(const AdamParams& params, const AdamStep& step, const float* param_in,
                 const float* m_in, const float* v_in, float* param, float* m, float* v,
                 const void* grad, DType grad_dtype, size_t n, void* param_copy = nullptr,
                 DType copy_dtype = DType::bf16);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "avx512", "avx2", "portable" (and "best").
const char* to_string(HostAdam::Simd simd) noexcept;

}  // namespace zero::optim
