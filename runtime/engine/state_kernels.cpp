#include "runtime/engine/state_kernels.hpp"

#include <algorithm>

#include "optim/clip.hpp"
#include "core/error.hpp"
#include "core/parallel_chunks.hpp"

namespace zero {

namespace {

// Element-wise host work in fixed chunks on oneTBB's threads: every element's result is the same
// whichever thread computes it, so the bits do not depend on the thread count. At stage 0/1 with
// gradient accumulation these passes touch every gradient element once per micro-batch (124M of
// them for GPT-2): on one thread they were a tenth of a step.
constexpr size_t kChunk = size_t{1} << 16;

// Host code on the compute stream's worker thread. The lambdas capture raw pointers: the caller
// keeps the buffers alive until the stream has passed the call (StateKernels' contract).
class CpuStateKernels final : public StateKernels {
 public:
  CpuStateKernels(Stream& s, optim::HostAdam& adam) : stream_(s), adam_(adam) {}

  void accumulate(float* acc, const void* x, DType t, size_t n) override {
    if (n == 0) return;
    stream_.launch_host([acc, x, t, n] {
      parallel_chunks(n, kChunk, 1, [&](size_t i0, size_t i1) {
        zero::accumulate_widened(acc + i0, static_cast<const unsigned char*>(x) + i0 * size_of(t), t, i1 - i0);
      });
    });
  }

  void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) override {
    if (n == 0) return;
    stream_.launch_host([=] {
      const size_t ss = size_of(src_type), ds = size_of(dst_type);
      parallel_chunks(n, kChunk, 1, [&](size_t i0, size_t i1) {
        zero::convert(static_cast<const unsigned char*>(src) + i0 * ss, src_type,
                      static_cast<unsigned char*>(dst) + i0 * ds, dst_type, i1 - i0);
      });
    });
  }

  void squared_norm(const void* x, DType t, size_t n, float* out) override {
    stream_.launch_host([=] { *out = optim::local_squared_norm(x, t, n); });
  }

  void adam(const optim::AdamParams& params, const optim::AdamStep& step, float* param, float* m,
            float* v, const void* grad, DType grad_type, size_t n, void* param_copy,
            DType copy_type) override {
    if (n == 0) return;
    stream_.launch_host([=, this] {
      adam_.step(params, step, param, m, v, grad, grad_type, n, param_copy, copy_type);
    });
  }

 private:
  Stream& stream_;
  optim::HostAdam& adam_;
};

}  // namespace

std::unique_ptr<StateKernels> make_state_kernels(Device& device, Stream& stream,
                                                 optim::HostAdam& host_adam) {
  if (device.kind() == DeviceKind::cpu) return std::make_unique<CpuStateKernels>(stream, host_adam);
#ifdef ZERO_HAVE_CUDA
  return make_cuda_state_kernels(device, stream);
#else
  ZERO_FAIL("engine on " + device.name() + ": this build has no cuda backend (configure with "
            "-DZERO_CUDA=ON where nvcc is installed)");
#endif
}

}  // namespace zero
