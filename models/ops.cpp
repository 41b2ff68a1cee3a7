// The checks every backend shares: shapes and types of each op's operands, so a wrong call
// fails the same way, with the same message, on cpu and on cuda, before anything is enqueued.
#include "models/ops.hpp"

#include <string>

namespace zero::models {
namespace {

std::string str(const Tensor& t) { return t.describe(); }

class Check {
 public:
  Check(const char* op, DeviceKind kind) : op_(op), kind_(kind) {}

  [[noreturn]] void fail(const std::string& what) const { ZERO_FAIL(std::string(op_) + ": " + what); }

  void defined(const char* name, const Tensor& t) const {
    if (!t) fail(std::string(name) + " is missing (an empty tensor)");
  }
  void type(const char* name, const Tensor& t, ScalarType want) const {
    defined(name, t);
    if (t.type() != want)
      fail(std::string(name) + " is " + str(t) + ", expected type " + std::string(to_string(want)));
  }
  void shape(const char* name, const Tensor& t, const Shape& want) const {
    defined(name, t);
    if (!(t.shape() == want)) fail(std::string(name) + " is " + str(t) + ", expected shape " + want.str());
  }
  void rank(const char* name, const Tensor& t, int r) const {
    defined(name, t);
    if (t.shape().rank() != r)
      fail(std::string(name) + " is " + str(t) + ", expected " + std::to_string(r) + " dimensions");
  }
  void at_least_rank(const char* name, const Tensor& t, int r) const {
    defined(name, t);
    if (t.shape().rank() < r)
      fail(std::string(name) + " is " + str(t) + ", expected at least " + std::to_string(r) +
           " dimension(s)");
  }
  void numel(const char* name, const Tensor& t, int64_t n) const {
    defined(name, t);
    if (t.numel() != n)
      fail(std::string(name) + " is " + str(t) + ", expected " + std::to_string(n) + " elements");
  }
  // The activation type of the call: a float type the backend computes in.
  ScalarType activation(const char* name, const Tensor& t) const {
    defined(name, t);
    const ScalarType a = t.type();
    if (kind_ == DeviceKind::cpu && a != ScalarType::f32 && a != ScalarType::f64 &&
        a != ScalarType::bf16 && a != ScalarType::f16)
      fail(std::string(name) + " is " + str(t) +
           ": the cpu backend's activations are fp32, fp64, bf16 or fp16");
    if (kind_ == DeviceKind::cuda && a == ScalarType::f64)
      fail(std::string(name) + " is " + str(t) + ": fp64 is the cpu backend's reference precision");
    if (a == ScalarType::i32) fail(std::string(name) + " is " + str(t) + ", expected a float type");
    return a;
  }
  void same(const char* name, const Tensor& t, const Tensor& like) const {
    type(name, t, like.type());
    shape(name, t, like.shape());
  }
  void same_count(const char* name, const Tensor& t, const Tensor& like) const {
    type(name, t, like.type());
    numel(name, t, like.numel());
  }
  // A parameter: a float type; fp64 exactly when the activations are.
  void param(const char* name, const Tensor& t, const Shape& want, ScalarType a) const {
    shape(name, t, want);
    if (t.type() == ScalarType::i32) fail(std::string(name) + " is " + str(t) + ", expected a float type");
    if ((t.type() == ScalarType::f64) != (a == ScalarType::f64))
      fail(std::string(name) + " is " + str(t) + " but the activations are " +
           std::string(to_string(a)) + ": fp64 parameters go with fp64 activations only");
  }
  // A gradient of a parameter shaped `want`: fp32, or the activation-matching float type.
  void grad(const char* name, const Tensor& t, const Shape& want, ScalarType a) const {
    param(name, t, want, a);
  }
  void stats(const char* name, const Tensor& t, int64_t rows, ScalarType a) const {
    type(name, t, a == ScalarType::f64 ? ScalarType::f64 : ScalarType::f32);
    numel(name, t, rows);
  }

 private:
  const char* op_;
  DeviceKind kind_;
};

}  // namespace

void Ops::embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                            const Tensor& wpe) {
  const Check c("embedding_forward", device_.kind());
  c.type("tokens", tokens, ScalarType::i32);
  c.rank("tokens", tokens, 2);
  const ScalarType a = c.activation("out", out);
  c.rank("wte", wte, 2);
  c.rank("wpe", wpe, 2);
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1], C = wte.shape()[1];
  c.param("wte", wte, wte.shape(), a);
  c.param("wpe", wpe, Shape{wpe.shape()[0], C}, a);
  if (T > wpe.shape()[0])
    c.fail("a sequence of " + std::to_string(T) + " tokens is longer than the " +
           std::to_string(wpe.shape()[0]) + " positions of wpe");
  c.shape("out", out, Shape{B, T, C});
  do_embedding_forward(out, tokens, wte, wpe);
}

void Ops::embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                             const Tensor& tokens) {
  const Check c("embedding_backward", device_.kind());
  c.type("tokens", tokens, ScalarType::i32);
  c.rank("tokens", tokens, 2);
  const ScalarType a = c.activation("dout", dout);
  c.rank("dwte", dwte, 2);
  c.rank("dwpe", dwpe, 2);
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1], C = dwte.shape()[1];
  c.shape("dout", dout, Shape{B, T, C});
  c.grad("dwte", dwte, dwte.shape(), a);
  c.grad("dwpe", dwpe, Shape{dwpe.shape()[0], C}, a);
  if (T > dwpe.shape()[0])
    c.fail("a sequence of " + std::to_string(T) + " tokens is longer than the " +
           std::to_string(dwpe.shape()[0]) + " positions of dwpe");
  do_embedding_backward(dwte, dwpe, dout, tokens);
}

void Ops::layernorm_forward(const Tensor& y, const Tensor& mean, const Tensor& rstd,
                            const Tensor& x, const Tensor& w, const Tensor& b) {
  const Check c("layernorm_forward", device_.kind());
  const ScalarType a = c.activation("x", x);
  c.at_least_rank("x", x, 1);
  const int64_t C = x.shape().back(), rows = x.shape().rows();
  c.same("y", y, x);
  c.stats("mean", mean, rows, a);
  c.stats("rstd", rstd, rows, a);
  c.param("w", w, Shape{C}, a);
  c.param("b", b, Shape{C}, a);
  do_layernorm_forward(y, mean, rstd, x, w, b);
}

void Ops::layernorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& db,
                             const Tensor& dy, const Tensor& x, const Tensor& w,
                             const Tensor& mean, const Tensor& rstd) {
  const Check c("layernorm_backward", device_.kind());
  const ScalarType a = c.activation("x", x);
  c.at_least_rank("x", x, 1);
  const int64_t C = x.shape().back(), rows = x.shape().rows();
  c.same("dx", dx, x);
  c.same("dy", dy, x);
  c.param("w", w, Shape{C}, a);
  c.grad("dw", dw, Shape{C}, a);
  c.grad("db", db, Shape{C}, a);
  c.stats("mean", mean, rows, a);
  c.stats("rstd", rstd, rows, a);
  do_layernorm_backward(dx, dw, db, dy, x, w, mean, rstd);
}

void Ops::linear_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b) {
  const Check c("linear_forward", device_.kind());
  const ScalarType a = c.activation("x", x);
  c.at_least_rank("x", x, 1);
  c.rank("w", w, 2);
  const int64_t C = x.shape().back(), rows = x.shape().rows(), OC = w.shape()[1];
  c.param("w", w, Shape{C, OC}, a);
  if (b) c.param("b", b, Shape{OC}, a);
  c.type("y", y, a);
  c.numel("y", y, rows * OC);
  if (y.shape().back() != OC) c.fail("y is " + str(y) + ", expected a last dimension of " + std::to_string(OC));
  do_linear_forward(y, x, w, b);
}

namespace {
// dy [N, OC] of the activation type with x's rows N; returns OC.
int64_t check_dy(const Check& c, const Tensor& dy, ScalarType a, int64_t rows, int64_t oc) {
  c.type("dy", dy, a);
  c.numel("dy", dy, rows * oc);
  if (dy.shape().back() != oc)
    c.fail("dy is " + str(dy) + ", expected a last dimension of " + std::to_string(oc));
  return oc;
}
}  // namespace

void Ops::linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                          const Tensor& x, const Tensor& w) {
  const Check c("linear_backward", device_.kind());
  const ScalarType a = c.activation("x", x);
  c.at_least_rank("x", x, 1);
  c.rank("w", w, 2);
  const int64_t C = x.shape().back(), rows = x.shape().rows(), OC = w.shape()[1];
  c.param("w", w, Shape{C, OC}, a);
  check_dy(c, dy, a, rows, OC);
  if (dx) c.same("dx", dx, x);
  c.grad("dw", dw, Shape{C, OC}, a);
  if (db) c.grad("db", db, Shape{OC}, a);
  if (dx) do_linear_backward_input(dx, dy, w);
  do_linear_backward_weight(dw, db, dy, x);
}

void Ops::linear_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  const Check c("linear_backward_input", device_.kind());
  const ScalarType a = c.activation("dx", dx);
  c.at_least_rank("dx", dx, 1);
  c.rank("w", w, 2);
  const int64_t C = dx.shape().back(), rows = dx.shape().rows(), OC = w.shape()[1];
  c.param("w", w, Shape{C, OC}, a);
  check_dy(c, dy, a, rows, OC);
  do_linear_backward_input(dx, dy, w);
}

void Ops::linear_backward_weight(const Tensor& dw, const Tensor& db, const Tensor& dy,
                                 const Tensor& x) {
  const Check c("linear_backward_weight", device_.kind());
  const ScalarType a = c.activation("x", x);
  c.at_least_rank("x", x, 1);
  c.rank("dw", dw, 2);
  const int64_t C = x.shape().back(), rows = x.shape().rows(), OC = dw.shape()[1];
  c.grad("dw", dw, Shape{C, OC}, a);
  check_dy(c, dy, a, rows, OC);
  if (db) c.grad("db", db, Shape{OC}, a);
  do_linear_backward_weight(dw, db, dy, x);
}

void Ops::linear_t_forward(const Tensor& y, const Tensor& x, const Tensor& w) {
  const Check c("linear_t_forward", device_.kind());
  const ScalarType a = c.activation("x", x);
  c.at_least_rank("x", x, 1);
  c.rank("w", w, 2);
  const int64_t C = x.shape().back(), rows = x.shape().rows(), V = w.shape()[0];
  c.param("w", w, Shape{V, C}, a);
  c.type("y", y, a);
  c.numel("y", y, rows * V);
  if (y.shape().back() != V) c.fail("y is " + str(y) + ", expected a last dimension of " + std::to_string(V));
  do_linear_t_forward(y, x, w);
}

void Ops::linear_t_backward(const Tensor& dx, const Tensor& dw, const Tensor& dy, const Tensor& x,
                            const Tensor& w) {
  const Check c("linear_t_backward", device_.kind());
  const ScalarType a = c.activation("x", x);
  c.at_least_rank("x", x, 1);
  c.rank("w", w, 2);
  const int64_t C = x.shape().back(), rows = x.shape().rows(), V = w.shape()[0];
  c.param("w", w, Shape{V, C}, a);
  check_dy(c, dy, a, rows, V);
  c.same("dx", dx, x);
  c.grad("dw", dw, Shape{V, C}, a);
  do_linear_t_backward_input(dx, dy, w);
  do_linear_t_backward_weight(dw, dy, x);
}

void Ops::linear_t_backward_input(const Tensor& dx, const Tensor& dy, const Tensor& w) {
  const Check c("linear_t_backward_input", device_.kind());
  const ScalarType a = c.activation("dx", dx);
  c.at_least_rank("dx", dx, 1);
  c.rank("w", w, 2);
  const int64_t C = dx.shape().back(), rows = dx.shape().rows(), V = w.shape()[0];
  c.param("w", w, Shape{V, C}, a);
  check_dy(c, dy, a, rows, V);
  do_linear_t_backward_input(dx, dy, w);
}

void Ops::linear_t_backward_weight(const Tensor& dw, const Tensor& dy, const Tensor& x) {
  const Check c("linear_t_backward_weight", device_.kind());
  const ScalarType a = c.activation("x", x);
  c.at_least_rank("x", x, 1);
  c.rank("dw", dw, 2);
  const int64_t C = x.shape().back(), rows = x.shape().rows(), V = dw.shape()[0];
  c.grad("dw", dw, Shape{V, C}, a);
  check_dy(c, dy, a, rows, V);
  do_linear_t_backward_weight(dw, dy, x);
}

void Ops::gelu_forward(const Tensor& y, const Tensor& x) {
  const Check c("gelu_forward", device_.kind());
  c.activation("x", x);
  c.same_count("y", y, x);
  do_gelu_forward(y, x);
}

void Ops::gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const Check c("gelu_backward", device_.kind());
  c.activation("x", x);
  c.same_count("dx", dx, x);
  c.same_count("dy", dy, x);
  do_gelu_backward(dx, dy, x);
}

namespace {
void check_attention(const Check& c, const Tensor& qkv, int n_head, int64_t* B, int64_t* T,
                     int64_t* C) {
  c.activation("qkv", qkv);
  c.rank("qkv", qkv, 3);
  *B = qkv.shape()[0];
  *T = qkv.shape()[1];
  if (qkv.shape()[2] % 3 != 0) c.fail("qkv is " + str(qkv) + ": its last dimension must be 3 * C");
  *C = qkv.shape()[2] / 3;
  if (n_head <= 0 || *C % n_head != 0)
    c.fail("C = " + std::to_string(*C) + " does not split into " + std::to_string(n_head) + " heads");
}
}  // namespace

void Ops::attention_forward(const Tensor& out, const Tensor& probs, const Tensor& qkv, int n_head) {
  const Check c("attention_forward", device_.kind());
  int64_t B = 0, T = 0, C = 0;
  check_attention(c, qkv, n_head, &B, &T, &C);
  c.type("out", out, qkv.type());
  c.shape("out", out, Shape{B, T, C});
  c.type("probs", probs, qkv.type());
  c.shape("probs", probs, Shape{B, n_head, T, T});
  do_attention_forward(out, probs, qkv, n_head);
}

void Ops::attention_backward(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                             const Tensor& probs, int n_head) {
  const Check c("attention_backward", device_.kind());
  int64_t B = 0, T = 0, C = 0;
  check_attention(c, qkv, n_head, &B, &T, &C);
  c.same("dqkv", dqkv, qkv);
  c.type("dout", dout, qkv.type());
  c.shape("dout", dout, Shape{B, T, C});
  c.type("probs", probs, qkv.type());
  c.shape("probs", probs, Shape{B, n_head, T, T});
  do_attention_backward(dqkv, dout, qkv, probs, n_head);
}

namespace {
void check_blocked(const Check& c, const Ops& ops) {
  if (!ops.blocked_attention())
    c.fail("the " + std::string(to_string(ops.device().kind())) +
           " backend has no blocked attention (blocked_attention() is false); use "
           "attention_forward / attention_backward with the probabilities");
}
}  // namespace

void Ops::attention_forward_lse(const Tensor& out, const Tensor& lse, const Tensor& qkv,
                                int n_head) {
  const Check c("attention_forward_lse", device_.kind());
  check_blocked(c, *this);
  int64_t B = 0, T = 0, C = 0;
  check_attention(c, qkv, n_head, &B, &T, &C);
  c.type("out", out, qkv.type());
  c.shape("out", out, Shape{B, T, C});
  c.stats("lse", lse, B * n_head * T, qkv.type());
  c.shape("lse", lse, Shape{B, n_head, T});
  do_attention_forward_lse(out, lse, qkv, n_head);
}

void Ops::attention_backward_lse(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& out, const Tensor& lse, int n_head) {
  const Check c("attention_backward_lse", device_.kind());
  check_blocked(c, *this);
  int64_t B = 0, T = 0, C = 0;
  check_attention(c, qkv, n_head, &B, &T, &C);
  c.same("dqkv", dqkv, qkv);
  c.type("dout", dout, qkv.type());
  c.shape("dout", dout, Shape{B, T, C});
  c.type("out", out, qkv.type());
  c.shape("out", out, Shape{B, T, C});
  c.stats("lse", lse, B * n_head * T, qkv.type());
  c.shape("lse", lse, Shape{B, n_head, T});
  do_attention_backward_lse(dqkv, dout, qkv, out, lse, n_head);
}

void Ops::do_attention_forward_lse(const Tensor&, const Tensor&, const Tensor&, int) {
  ZERO_FAIL("attention_forward_lse: not implemented by this backend");
}

void Ops::do_attention_backward_lse(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                    const Tensor&, int) {
  ZERO_FAIL("attention_backward_lse: not implemented by this backend");
}

void Ops::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  const Check c("add", device_.kind());
  c.activation("a", a);
  c.same_count("b", b, a);
  c.same_count("out", out, a);
  do_add(out, a, b);
}

void Ops::accumulate(const Tensor& acc, const Tensor& x) {
  const Check c("accumulate", device_.kind());
  const ScalarType a = c.activation("x", x);
  c.numel("acc", acc, x.numel());
  // cuda's kernel adds in one type; cpu's stores through Grad, which adds in fp32 and rounds
  // once to a 16-bit acc: any of fp32, bf16, fp16 for activations other than fp64.
  const auto f32_or_16 = [](ScalarType t) {
    return t == ScalarType::f32 || t == ScalarType::bf16 || t == ScalarType::f16;
  };
  if (acc.type() != a &&
      !(device_.kind() == DeviceKind::cpu && f32_or_16(a) && f32_or_16(acc.type())))
    c.type("acc", acc, a);
  do_accumulate(acc, x);
}

void Ops::cross_entropy_forward(const Tensor& loss, const Tensor& losses, const Tensor& logits,
                                const Tensor& targets) {
  const Check c("cross_entropy_forward", device_.kind());
  const ScalarType a = c.activation("logits", logits);
  c.at_least_rank("logits", logits, 1);
  const int64_t rows = logits.shape().rows();
  c.type("targets", targets, ScalarType::i32);
  c.numel("targets", targets, rows);
  c.stats("losses", losses, rows, a);
  c.stats("loss", loss, 1, a);
  do_cross_entropy_forward(loss, losses, logits, targets);
}

void Ops::cross_entropy_backward(const Tensor& dlogits, const Tensor& logits,
                                 const Tensor& targets, float scale) {
  const Check c("cross_entropy_backward", device_.kind());
  c.activation("logits", logits);
  c.at_least_rank("logits", logits, 1);
  c.type("targets", targets, ScalarType::i32);
  c.numel("targets", targets, logits.shape().rows());
  c.same("dlogits", dlogits, logits);
  do_cross_entropy_backward(dlogits, logits, targets, scale);
}

namespace {
// A vocabulary shard [vocab_begin, vocab_begin + Vs) inside [0, vocab_size).
void check_shard(const Check& c, int64_t Vs, int64_t vocab_begin, int64_t vocab_size) {
  if (Vs < 1 || vocab_begin < 0 || vocab_begin + Vs > vocab_size)
    c.fail("the shard [" + std::to_string(vocab_begin) + ", " + std::to_string(vocab_begin + Vs) +
           ") is not a non-empty part of the vocabulary [0, " + std::to_string(vocab_size) + ")");
}
}  // namespace

void Ops::embedding_forward_shard(const Tensor& out, const Tensor& tokens, const Tensor& wte,
                                  const Tensor& wpe, int64_t vocab_begin, int64_t vocab_size) {
  const Check c("embedding_forward_shard", device_.kind());
  c.type("tokens", tokens, ScalarType::i32);
  c.rank("tokens", tokens, 2);
  const ScalarType a = c.activation("out", out);
  c.rank("wte", wte, 2);
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1], C = wte.shape()[1];
  c.param("wte", wte, wte.shape(), a);
  check_shard(c, wte.shape()[0], vocab_begin, vocab_size);
  if (wpe) {
    c.rank("wpe", wpe, 2);
    c.param("wpe", wpe, Shape{wpe.shape()[0], C}, a);
    if (T > wpe.shape()[0])
      c.fail("a sequence of " + std::to_string(T) + " tokens is longer than the " +
             std::to_string(wpe.shape()[0]) + " positions of wpe");
  }
  c.shape("out", out, Shape{B, T, C});
  do_embedding_forward_shard(out, tokens, wte, wpe, vocab_begin, vocab_size);
}

void Ops::embedding_backward_shard(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                   const Tensor& tokens, int64_t vocab_begin, int64_t vocab_size) {
  const Check c("embedding_backward_shard", device_.kind());
  c.type("tokens", tokens, ScalarType::i32);
  c.rank("tokens", tokens, 2);
  const ScalarType a = c.activation("dout", dout);
  c.rank("dwte", dwte, 2);
  const int64_t B = tokens.shape()[0], T = tokens.shape()[1], C = dwte.shape()[1];
  c.shape("dout", dout, Shape{B, T, C});
  c.grad("dwte", dwte, dwte.shape(), a);
  check_shard(c, dwte.shape()[0], vocab_begin, vocab_size);
  if (dwpe) {
    c.rank("dwpe", dwpe, 2);
    c.grad("dwpe", dwpe, Shape{dwpe.shape()[0], C}, a);
    if (T > dwpe.shape()[0])
      c.fail("a sequence of " + std::to_string(T) + " tokens is longer than the " +
             std::to_string(dwpe.shape()[0]) + " positions of dwpe");
  }
  do_embedding_backward_shard(dwte, dwpe, dout, tokens, vocab_begin, vocab_size);
}

void Ops::cross_entropy_shard_max(const Tensor& rowmax, const Tensor& logits) {
  const Check c("cross_entropy_shard_max", device_.kind());
  const ScalarType a = c.activation("logits", logits);
  c.at_least_rank("logits", logits, 1);
  if (logits.shape().back() < 1) c.fail("logits is " + str(logits) + ": a shard has at least one column");
  c.stats("rowmax", rowmax, logits.shape().rows(), a);
  do_cross_entropy_shard_max(rowmax, logits);
}

void Ops::cross_entropy_shard_sums(const Tensor& sums, const Tensor& logits, const Tensor& rowmax,
                                   const Tensor& targets, int64_t vocab_begin, int64_t vocab_size) {
  const Check c("cross_entropy_shard_sums", device_.kind());
  const ScalarType a = c.activation("logits", logits);
  c.at_least_rank("logits", logits, 1);
  const int64_t rows = logits.shape().rows();
  check_shard(c, logits.shape().back(), vocab_begin, vocab_size);
  c.type("targets", targets, ScalarType::i32);
  c.numel("targets", targets, rows);
  c.stats("rowmax", rowmax, rows, a);
  c.stats("sums", sums, 2 * rows, a);
  do_cross_entropy_shard_sums(sums, logits, rowmax, targets, vocab_begin, vocab_size);
}

void Ops::cross_entropy_shard_loss(const Tensor& loss, const Tensor& losses, const Tensor& rowmax,
                                   const Tensor& sums, const Tensor& targets) {
  const Check c("cross_entropy_shard_loss", device_.kind());
  c.type("targets", targets, ScalarType::i32);
  const int64_t rows = targets.numel();
  c.defined("rowmax", rowmax);
  const ScalarType a = rowmax.type() == ScalarType::f64 ? ScalarType::f64 : ScalarType::f32;
  c.stats("rowmax", rowmax, rows, a);
  c.stats("sums", sums, 2 * rows, a);
  c.stats("losses", losses, rows, a);
  c.stats("loss", loss, 1, a);
  do_cross_entropy_shard_loss(loss, losses, rowmax, sums, targets);
}

void Ops::cross_entropy_shard_backward(const Tensor& dlogits, const Tensor& logits,
                                       const Tensor& rowmax, const Tensor& sums,
                                       const Tensor& targets, int64_t vocab_begin,
                                       int64_t vocab_size, float scale) {
  const Check c("cross_entropy_shard_backward", device_.kind());
  const ScalarType a = c.activation("logits", logits);
  c.at_least_rank("logits", logits, 1);
  const int64_t rows = logits.shape().rows();
  check_shard(c, logits.shape().back(), vocab_begin, vocab_size);
  c.type("targets", targets, ScalarType::i32);
  c.numel("targets", targets, rows);
  c.stats("rowmax", rowmax, rows, a);
  c.stats("sums", sums, 2 * rows, a);
  c.same("dlogits", dlogits, logits);
  do_cross_entropy_shard_backward(dlogits, logits, rowmax, sums, targets, vocab_begin, vocab_size, scale);
}

void Ops::zero(const Tensor& t) {
  const Check c("zero", device_.kind());
  c.defined("t", t);
  do_zero(t);
}

void Ops::check_errors() { do_check_errors(); }

std::unique_ptr<Ops> make_ops(Device& device, Stream& stream) {
  ZERO_REQUIRE(device.kind() == stream.kind(),
               "make_ops: stream " + stream.name() + " is not a stream of " + device.name());
  if (device.kind() == DeviceKind::cpu) return make_cpu_ops(device, stream);
  return make_cuda_ops(device, stream);
}

#if !defined(ZERO_HAVE_CUDA)
std::unique_ptr<Ops> make_cuda_ops(Device& device, Stream&) {
  ZERO_FAIL("the model kernels for " + device.name() +
            " need the cuda backend, and this build has none (nvcc was not found at build time)");
}
#endif

}  // namespace zero::models
