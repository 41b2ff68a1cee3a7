#include "runtime/engine/state_kernels.hpp"

#include <vector>

#include "optim/clip.hpp"
#include "core/error.hpp"

namespace zero {

namespace {

// Host code on the compute stream's worker thread. The lambdas capture raw pointers: the caller
// keeps the buffers alive until the stream has passed the call (StateKernels' contract).
class CpuStateKernels final : public StateKernels {
 public:
  CpuStateKernels(Stream& s, optim::HostAdam& adam) : stream_(s), adam_(adam) {}

  void accumulate(float* acc, const void* x, DType t, size_t n) override {
    if (n == 0) return;
    stream_.launch_host([acc, x, t, n] {
      if (t == DType::f32) {
        const float* xs = static_cast<const float*>(x);
        for (size_t i = 0; i < n; ++i) acc[i] += xs[i];
        return;
      }
      std::vector<float> widened(n);
      zero::convert(x, t, widened.data(), DType::f32, n);
      for (size_t i = 0; i < n; ++i) acc[i] += widened[i];
    });
  }

  void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) override {
    if (n == 0) return;
    stream_.launch_host([=] { zero::convert(src, src_type, dst, dst_type, n); });
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
