// The cpu backend of models/ops.hpp: each op becomes one task on the Ops object's stream that
// runs a kernel of kernels.hpp.
//
// Lifetimes: a task captures its operand Tensors by value; the copies share ownership of the
// storage, so the memory stays alive until the task has run even when the caller drops its
// handles right after enqueuing. (A view owns nothing: its memory is the caller's to keep, as
// tensor.hpp says.) Tasks never touch the CpuOps object, so it may go before its tasks have run.
//
// Types: the activation type picks the kernels: fp32 -> kernels.hpp with F = float, fp64 -> F =
// double, bf16 / fp16 -> kernels16.hpp (16-bit storage, fp32 math). Parameters and gradients in
// other storage types are handed to the kernels as cpu::Param / cpu::Grad, which read 16-bit
// parameters as fp32 and add to 16-bit gradients with one rounding.
//
// Errors: a bad token id or target throws zero::Error inside the task; the stream keeps it as its
// sticky error and check_errors() (stream.synchronize()) rethrows it.
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "models/cpu/kernels.hpp"
#include "models/cpu/kernels16.hpp"
#include "models/ops.hpp"

namespace zero::models {
namespace {

using cpu::Grad;
using cpu::Param;

// Whether activation type a is 16-bit storage (the kernels16.hpp path).
bool act16(ScalarType a) { return a == ScalarType::bf16 || a == ScalarType::f16; }

// Calls fn(std::type_identity<F>{}) with F the compute type of activation type a.
template <class Fn>
void with_compute_type(ScalarType a, const Fn& fn) {
  if (a == ScalarType::f64) {
    fn(std::type_identity<double>{});
  } else {
    ZERO_REQUIRE(a == ScalarType::f32, "cpu ops: activations of type " +
                                           std::string(to_string(a)) +
                                           " (expected fp32, fp64, bf16 or fp16)");
    fn(std::type_identity<float>{});
  }
}

template <class F>
F* ptr(const Tensor& t) {
  return t ? t.data_as<F>() : nullptr;
}
// An absent (empty) parameter or gradient becomes a null F pointer: the kernels skip it.
template <class F>
Param<F> param(const Tensor& t) {
  return t ? Param<F>(t.data(), t.type()) : Param<F>(static_cast<const F*>(nullptr));
}
template <class F>
Grad<F> grad(const Tensor& t) {
  return t ? Grad<F>(t.data(), t.type()) : Grad<F>(static_cast<F*>(nullptr));
}

// The probabilities pair has no 16-bit kernels on cpu (the models there use the lse pair).
void refuse_probabilities16(const char* op, const Tensor& qkv) {
  if (!act16(qkv.type())) return;
  ZERO_FAIL(std::string(op) + ": qkv is " + qkv.describe() +
            ": the cpu backend's probabilities pair computes in fp32 or fp64 only"
            "\nHINT: use attention_forward_lse / attention_backward_lse (blocked_attention() is "
            "true on cpu), or fp32 activations with GptOptions::attention_probabilities");
}

class CpuOps final : public Ops {
 public:
  CpuOps(Device& device, Stream& stream) : Ops(device, stream) {}

 private:
  template <class Fn>
  void enqueue(Fn fn) {
    stream().launch_host(std::move(fn));
  }

  void do_embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                            const Tensor& wpe) override {
    enqueue([out, tokens, wte, wpe] {
      if (act16(out.type()))
        return cpu::k16::embedding_forward(out.type(), out.data(), tokens.data_as<int32_t>(),
                                           param<float>(wte), param<float>(wpe), true,
                                           tokens.shape()[0], tokens.shape()[1], wte.shape()[1], 0,
                                           wte.shape()[0], wte.shape()[0], "embedding_forward");
      with_compute_type(out.type(), [&]<class F>(std::type_identity<F>) {
        cpu::embedding_forward<F>(ptr<F>(out), tokens.data_as<int32_t>(), param<F>(wte),
                                  param<F>(wpe), tokens.shape()[0], tokens.shape()[1],
                                  wte.shape()[1], wte.shape()[0]);
      });
    });
  }

  void do_embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                             const Tensor& tokens) override {
    enqueue([dwte, dwpe, dout, tokens] {
      if (act16(dout.type()))
        return cpu::k16::embedding_backward(dout.type(), grad<float>(dwte), grad<float>(dwpe), true,
                                            dout.data(), tokens.data_as<int32_t>(),
                                            tokens.shape()[0], tokens.shape()[1], dwte.shape()[1],
                                            0, dwte.shape()[0], dwte.shape()[0],
                                            "embedding_backward");
      with_compute_type(dout.type(), [&]<class F>(std::type_identity<F>) {
        cpu::embedding_backward<F>(grad<F>(dwte), grad<F>(dwpe), ptr<F>(dout),
                                   tokens.data_as<int32_t>(), tokens.shape()[0],
                                   tokens.shape()[1], dwte.shape()[1], dwte.shape()[0]);
      });
    });
  }

  void do_layernorm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd,
                            const Tensor& x, const Tensor& w, const Tensor& b) override {
    enqueue([y, mean, rstd, x, w, b] {
      if (act16(x.type()))
        return cpu::k16::layernorm_forward(x.type(), y.data(), ptr<float>(mean), ptr<float>(rstd),
                                           x.data(), param<float>(w), param<float>(b),
                                           x.shape().rows(), x.shape().back());
      with_compute_type(x.type(), [&]<class F>(std::type_identity<F>) {
        cpu::layernorm_forward<F>(ptr<F>(y), ptr<F>(mean), ptr<F>(rstd), ptr<F>(x), param<F>(w),
                                  param<F>(b), x.shape().rows(), x.shape().back());
      });
    });
  }

  void do_layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db,
                             const Tensor& dy, const Tensor& x, const Tensor& w,
                             const Tensor& mean, const Tensor& rstd) override {
    enqueue([dx, dw, db, dy, x, w, mean, rstd] {
      if (act16(x.type()))
        return cpu::k16::layernorm_backward(x.type(), dx.data(), grad<float>(dw), grad<float>(db),
                                            dy.data(), x.data(), param<float>(w),
                                            ptr<float>(mean), ptr<float>(rstd), x.shape().rows(),
                                            x.shape().back());
      with_compute_type(x.type(), [&]<class F>(std::type_identity<F>) {
        cpu::layernorm_backward<F>(ptr<F>(dx), grad<F>(dw), grad<F>(db), ptr<F>(dy), ptr<F>(x),
                                   param<F>(w), ptr<F>(mean), ptr<F>(rstd), x.shape().rows(),
                                   x.shape().back());
      });
    });
  }

  void do_linear_forward(const Tensor& y, const Tensor& x, const Tensor& w,
                         const Tensor& b) override {
    enqueue([y, x, w, b] {
      if (act16(x.type()))
        return cpu::k16::linear_forward(x.type(), y.data(), x.data(), param<float>(w),
                                        param<float>(b), b.defined(), x.shape().rows(),
                                        x.shape().back(), w.shape()[1]);
      with_compute_type(x.type(), [&]<class F>(std::type_identity<F>) {
        cpu::linear_forward<F>(ptr<F>(y), ptr<F>(x), param<F>(w), param<F>(b), b.defined(),
                               x.shape().rows(), x.shape().back(), w.shape()[1]);
      });
    });
  }

  void do_linear_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w) override {
    enqueue([dx, dy, w] {
      if (act16(dx.type()))
        return cpu::k16::linear_backward_input(dx.type(), dx.data(), dy.data(), param<float>(w),
                                               dx.shape().rows(), dx.shape().back(),
                                               w.shape()[1]);
      with_compute_type(dx.type(), [&]<class F>(std::type_identity<F>) {
        cpu::linear_backward_input<F>(ptr<F>(dx), ptr<F>(dy), param<F>(w), dx.shape().rows(),
                                      dx.shape().back(), w.shape()[1]);
      });
    });
  }

  void do_linear_backward_weight(const Tensor& dw, const Tensor& db, const Tensor& dy,
                                 const Tensor& x) override {
    enqueue([dw, db, dy, x] {
      if (act16(x.type()))
        return cpu::k16::linear_backward_weight(x.type(), grad<float>(dw), grad<float>(db),
                                                db.defined(), dy.data(), x.data(),
                                                x.shape().rows(), x.shape().back(), dw.shape()[1]);
      with_compute_type(x.type(), [&]<class F>(std::type_identity<F>) {
        cpu::linear_backward_weight<F>(grad<F>(dw), grad<F>(db), db.defined(), ptr<F>(dy),
                                       ptr<F>(x), x.shape().rows(), x.shape().back(),
                                       dw.shape()[1]);
      });
    });
  }

  void do_linear_t_forward(const Tensor& y, const Tensor& x, const Tensor& w) override {
    enqueue([y, x, w] {
      if (act16(x.type()))
        return cpu::k16::linear_t_forward(x.type(), y.data(), x.data(), param<float>(w),
                                          x.shape().rows(), x.shape().back(), w.shape()[0]);
      with_compute_type(x.type(), [&]<class F>(std::type_identity<F>) {
        cpu::linear_t_forward<F>(ptr<F>(y), ptr<F>(x), param<F>(w), x.shape().rows(),
                                 x.shape().back(), w.shape()[0]);
      });
    });
  }

  void do_linear_t_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w) override {
    enqueue([dx, dy, w] {
      if (act16(dx.type()))
        return cpu::k16::linear_t_backward_input(dx.type(), dx.data(), dy.data(), param<float>(w),
                                                 dx.shape().rows(), dx.shape().back(),
                                                 w.shape()[0]);
      with_compute_type(dx.type(), [&]<class F>(std::type_identity<F>) {
        cpu::linear_t_backward_input<F>(ptr<F>(dx), ptr<F>(dy), param<F>(w), dx.shape().rows(),
                                        dx.shape().back(), w.shape()[0]);
      });
    });
  }

  void do_linear_t_backward_weight(const Tensor& dw, const Tensor& dy, const Tensor& x) override {
    enqueue([dw, dy, x] {
      if (act16(x.type()))
        return cpu::k16::linear_t_backward_weight(x.type(), grad<float>(dw), dy.data(), x.data(),
                                                  x.shape().rows(), x.shape().back(),
                                                  dw.shape()[0]);
      with_compute_type(x.type(), [&]<class F>(std::type_identity<F>) {
        cpu::linear_t_backward_weight<F>(grad<F>(dw), ptr<F>(dy), ptr<F>(x), x.shape().rows(),
                                         x.shape().back(), dw.shape()[0]);
      });
    });
  }

  void do_gelu_forward(const Tensor& y, const Tensor& x) override {
    enqueue([y, x] {
      if (act16(x.type())) return cpu::k16::gelu_forward(x.type(), y.data(), x.data(), x.numel());
      with_compute_type(x.type(), [&]<class F>(std::type_identity<F>) {
        cpu::gelu_forward<F>(ptr<F>(y), ptr<F>(x), x.numel());
      });
    });
  }

  void do_gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) override {
    enqueue([dx, dy, x] {
      if (act16(x.type()))
        return cpu::k16::gelu_backward(x.type(), dx.data(), dy.data(), x.data(), x.numel());
      with_compute_type(x.type(), [&]<class F>(std::type_identity<F>) {
        cpu::gelu_backward<F>(ptr<F>(dx), ptr<F>(dy), ptr<F>(x), x.numel());
      });
    });
  }

  void do_attention_forward(const Tensor& out, const Tensor& probs, const Tensor& qkv,
                            int n_head) override {
    refuse_probabilities16("attention_forward", qkv);
    enqueue([out, probs, qkv, n_head] {
      with_compute_type(qkv.type(), [&]<class F>(std::type_identity<F>) {
        const Shape& s = qkv.shape();
        cpu::attention_forward<F>(ptr<F>(out), ptr<F>(probs), ptr<F>(qkv), s[0], s[1], s[2] / 3,
                                  n_head);
      });
    });
  }

  void do_attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                             const Tensor& probs, int n_head) override {
    refuse_probabilities16("attention_backward", qkv);
    enqueue([dqkv, dout, qkv, probs, n_head] {
      with_compute_type(qkv.type(), [&]<class F>(std::type_identity<F>) {
        const Shape& s = qkv.shape();
        cpu::attention_backward<F>(ptr<F>(dqkv), ptr<F>(dout), ptr<F>(qkv), ptr<F>(probs), s[0],
                                   s[1], s[2] / 3, n_head);
      });
    });
  }

  bool blocked_attention() const noexcept override { return true; }

  void do_attention_forward_lse(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                int n_head) override {
    enqueue([out, lse, qkv, n_head] {
      if (act16(qkv.type())) {
        const Shape& s = qkv.shape();
        return cpu::k16::attention_forward_lse(qkv.type(), out.data(), ptr<float>(lse), qkv.data(),
                                               s[0], s[1], s[2] / 3, n_head);
      }
      with_compute_type(qkv.type(), [&]<class F>(std::type_identity<F>) {
        const Shape& s = qkv.shape();
        cpu::attention_forward_lse<F>(ptr<F>(out), ptr<F>(lse), ptr<F>(qkv), s[0], s[1],
                                      s[2] / 3, n_head);
      });
    });
  }

  void do_attention_backward_lse(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& out, const Tensor& lse, int n_head) override {
    enqueue([dqkv, dout, qkv, out, lse, n_head] {
      if (act16(qkv.type())) {
        const Shape& s = qkv.shape();
        return cpu::k16::attention_backward_lse(qkv.type(), dqkv.data(), dout.data(), qkv.data(),
                                                out.data(), ptr<float>(lse), s[0], s[1], s[2] / 3,
                                                n_head);
      }
      with_compute_type(qkv.type(), [&]<class F>(std::type_identity<F>) {
        const Shape& s = qkv.shape();
        cpu::attention_backward_lse<F>(ptr<F>(dqkv), ptr<F>(dout), ptr<F>(qkv), ptr<F>(out),
                                       ptr<F>(lse), s[0], s[1], s[2] / 3, n_head);
      });
    });
  }

  void do_add(const Tensor& out, const Tensor& a, const Tensor& b) override {
    enqueue([out, a, b] {
      if (act16(a.type())) return cpu::k16::add(a.type(), out.data(), a.data(), b.data(), a.numel());
      with_compute_type(a.type(), [&]<class F>(std::type_identity<F>) {
        cpu::add<F>(ptr<F>(out), ptr<F>(a), ptr<F>(b), a.numel());
      });
    });
  }

  void do_accumulate(const Tensor& acc, const Tensor& x) override {
    enqueue([acc, x] {
      if (act16(x.type()))
        return cpu::k16::accumulate(x.type(), grad<float>(acc), x.data(), x.numel());
      with_compute_type(x.type(), [&]<class F>(std::type_identity<F>) {
        cpu::accumulate<F>(grad<F>(acc), ptr<F>(x), x.numel());
      });
    });
  }

  void do_cross_entropy_forward(const Tensor& loss, const Tensor& losses, const Tensor& logits,
                                const Tensor& targets) override {
    enqueue([loss, losses, logits, targets] {
      if (act16(logits.type())) {
        *loss.data_as<float>() = cpu::k16::cross_entropy_forward(
            logits.type(), ptr<float>(losses), logits.data(), targets.data_as<int32_t>(),
            logits.shape().rows(), logits.shape().back());
        return;
      }
      with_compute_type(logits.type(), [&]<class F>(std::type_identity<F>) {
        const F mean = cpu::cross_entropy_forward<F>(ptr<F>(losses), ptr<F>(logits),
                                                     targets.data_as<int32_t>(),
                                                     logits.shape().rows(), logits.shape().back());
        // The loss has the statistics type: fp64 with fp64 activations, else fp32.
        if (loss.type() == ScalarType::f64)
          *loss.data_as<double>() = static_cast<double>(mean);
        else
          *loss.data_as<F>() = mean;  // the statistics type, F
      });
    });
  }

  void do_cross_entropy_backward(const Tensor& dlogits, const Tensor& logits,
                                 const Tensor& targets, float scale) override {
    enqueue([dlogits, logits, targets, scale] {
      if (act16(logits.type()))
        return cpu::k16::cross_entropy_backward(logits.type(), dlogits.data(), logits.data(),
                                                targets.data_as<int32_t>(), logits.shape().rows(),
                                                logits.shape().back(), scale);
      with_compute_type(logits.type(), [&]<class F>(std::type_identity<F>) {
        cpu::cross_entropy_backward<F>(ptr<F>(dlogits), ptr<F>(logits),
                                       targets.data_as<int32_t>(), logits.shape().rows(),
                                       logits.shape().back(), static_cast<F>(scale));
      });
    });
  }

  // ---- vocabulary-parallel ends --------------------------------------------------------------

  void do_embedding_forward_shard(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                  const Tensor& wpe, int64_t v0, int64_t V) override {
    enqueue([out, tokens, wte, wpe, v0, V] {
      if (act16(out.type()))
        return cpu::k16::embedding_forward(out.type(), out.data(), tokens.data_as<int32_t>(),
                                           param<float>(wte), param<float>(wpe), wpe.defined(),
                                           tokens.shape()[0], tokens.shape()[1], wte.shape()[1],
                                           v0, wte.shape()[0], V, "embedding_forward_shard");
      with_compute_type(out.type(), [&]<class F>(std::type_identity<F>) {
        cpu::embedding_forward_shard<F>(ptr<F>(out), tokens.data_as<int32_t>(), param<F>(wte),
                                        param<F>(wpe), wpe.defined(), tokens.shape()[0],
                                        tokens.shape()[1], wte.shape()[1], v0, wte.shape()[0], V);
      });
    });
  }

  void do_embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                   const Tensor& tokens, int64_t v0, int64_t V) override {
    enqueue([dwte, dwpe, dout, tokens, v0, V] {
      if (act16(dout.type()))
        return cpu::k16::embedding_backward(dout.type(), grad<float>(dwte), grad<float>(dwpe),
                                            dwpe.defined(), dout.data(), tokens.data_as<int32_t>(),
                                            tokens.shape()[0], tokens.shape()[1], dwte.shape()[1],
                                            v0, dwte.shape()[0], V, "embedding_backward_shard");
      with_compute_type(dout.type(), [&]<class F>(std::type_identity<F>) {
        cpu::embedding_backward_shard<F>(grad<F>(dwte), grad<F>(dwpe), dwpe.defined(), ptr<F>(dout),
                                         tokens.data_as<int32_t>(), tokens.shape()[0],
                                         tokens.shape()[1], dwte.shape()[1], v0, dwte.shape()[0], V);
      });
    });
  }

  void do_cross_entropy_shard_max(const Tensor& rowmax, const Tensor& logits) override {
    enqueue([rowmax, logits] {
      if (act16(logits.type()))
        return cpu::k16::cross_entropy_shard_max(logits.type(), ptr<float>(rowmax), logits.data(),
                                                 logits.shape().rows(), logits.shape().back());
      with_compute_type(logits.type(), [&]<class F>(std::type_identity<F>) {
        cpu::cross_entropy_shard_max<F>(ptr<F>(rowmax), ptr<F>(logits), logits.shape().rows(),
                                        logits.shape().back());
      });
    });
  }

  void do_cross_entropy_shard_sums(const Tensor& sums, const Tensor& logits, const Tensor& rowmax,
                                   const Tensor& targets, int64_t v0, int64_t V) override {
    enqueue([sums, logits, rowmax, targets, v0, V] {
      if (act16(logits.type()))
        return cpu::k16::cross_entropy_shard_sums(logits.type(), ptr<float>(sums), logits.data(),
                                                  ptr<float>(rowmax), targets.data_as<int32_t>(),
                                                  logits.shape().rows(), v0, logits.shape().back(),
                                                  V);
      with_compute_type(logits.type(), [&]<class F>(std::type_identity<F>) {
        cpu::cross_entropy_shard_sums<F>(ptr<F>(sums), ptr<F>(logits), ptr<F>(rowmax),
                                         targets.data_as<int32_t>(), logits.shape().rows(), v0,
                                         logits.shape().back(), V);
      });
    });
  }

  void do_cross_entropy_shard_loss(const Tensor& loss, const Tensor& losses, const Tensor& rowmax,
                                   const Tensor& sums, const Tensor& targets) override {
    enqueue([loss, losses, rowmax, sums, targets] {
      // The statistics type is the compute type: fp64 with fp64 activations, else fp32.
      with_compute_type(rowmax.type(), [&]<class F>(std::type_identity<F>) {
        *loss.data_as<F>() = cpu::cross_entropy_shard_loss<F>(ptr<F>(losses), ptr<F>(rowmax), ptr<F>(sums),
                                                              targets.data_as<int32_t>(), targets.numel());
      });
    });
  }

  void do_cross_entropy_shard_backward(const Tensor& dlogits, const Tensor& logits,
                                       const Tensor& rowmax, const Tensor& sums,
                                       const Tensor& targets, int64_t v0, int64_t V,
                                       float scale) override {
    enqueue([dlogits, logits, rowmax, sums, targets, v0, V, scale] {
      if (act16(logits.type()))
        return cpu::k16::cross_entropy_shard_backward(
            logits.type(), dlogits.data(), logits.data(), ptr<float>(rowmax), ptr<float>(sums),
            targets.data_as<int32_t>(), logits.shape().rows(), v0, logits.shape().back(), V,
            scale);
      with_compute_type(logits.type(), [&]<class F>(std::type_identity<F>) {
        cpu::cross_entropy_shard_backward<F>(ptr<F>(dlogits), ptr<F>(logits), ptr<F>(rowmax),
                                             ptr<F>(sums), targets.data_as<int32_t>(),
                                             logits.shape().rows(), v0, logits.shape().back(), V,
                                             static_cast<F>(scale));
      });
    });
  }

  void do_zero(const Tensor& t) override {
    enqueue([t] {
      // 1 MiB per task: big gradient buffers are zeroed by all threads.
      constexpr size_t kChunk = size_t{1} << 20;
      const size_t bytes = t.bytes();
      auto* p = static_cast<unsigned char*>(t.data());
      tbb::parallel_for(size_t{0}, (bytes + kChunk - 1) / kChunk, [&](size_t i) {
        std::memset(p + i * kChunk, 0, std::min(kChunk, bytes - i * kChunk));
      });
    });
  }

  void do_check_errors() override { stream().synchronize(); }
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops(Device& device, Stream& stream) {
  ZERO_REQUIRE(device.kind() == DeviceKind::cpu && stream.kind() == DeviceKind::cpu,
               "make_cpu_ops: " + device.name() + " with stream " + stream.name() +
                   " is not a cpu device and stream");
  return std::make_unique<CpuOps>(device, stream);
}

}  // namespace zero::models
