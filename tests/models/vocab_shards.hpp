// Test support for the vocabulary-parallel ops (models/ops.hpp, "Vocabulary-parallel ends"):
// runs them for S shards of one vocabulary on one Ops, combining the shards' per-row numbers on
// the host exactly as the tensor group's all-reduces would (max; fp32 sums in rank order), and
// the whole ops on the same inputs. Used by the cpu test (vocab_parallel_ops_test) and the cuda
// one (cuda_vocab_parallel_test). Test-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "core/tensor.hpp"
#include "models/ops.hpp"

namespace zero::test {

struct VocabProblem {
  int64_t B = 3, T = 5, C = 24, V = 12, Tmax = 7;
  float scale = 0.75f;
  int64_t N() const { return B * T; }
};

struct VocabInputs {
  std::vector<float> wte, wpe, dout, logits;  // [V,C], [Tmax,C], [B,T,C], [N,V]
  std::vector<int32_t> tokens, targets;       // [B,T]; targets with -1 rows
};

// Values already rounded to `a` (so every backend starts from the same numbers).
inline VocabInputs vocab_inputs(const VocabProblem& p, ScalarType a, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto vec = [&](int64_t n, float span) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) {
      x = span * u(gen);
      if (a == ScalarType::bf16) x = to_float(to_bfloat16(x));
      if (a == ScalarType::f16) x = to_float(to_half(x));
    }
    return v;
  };
  VocabInputs in;
  in.wte = vec(p.V * p.C, 1.0f);
  in.wpe = vec(p.Tmax * p.C, 1.0f);
  in.dout = vec(p.N() * p.C, 1.0f);
  in.logits = vec(p.N() * p.V, 4.0f);
  for (int64_t i = 0; i < p.N(); ++i) {
    in.tokens.push_back(static_cast<int32_t>((i * 7 + 3) % p.V));  // repeats: rows summed per token
    in.targets.push_back(i % 4 == 1 ? -1 : static_cast<int32_t>((i * 5 + 2) % p.V));
  }
  return in;
}

struct VocabOutputs {
  std::vector<float> emb;      // [B,T,C] the embedding (shards: summed in rank order)
  std::vector<float> dwte;     // [V,C] (shards: their rows side by side)
  std::vector<float> dwpe;     // [Tmax,C]
  std::vector<float> losses;   // [N]
  float loss = 0;
  std::vector<float> dlogits;  // [N,V] (shards: their columns side by side)
};

class VocabRunner {
 public:
  VocabRunner(models::Ops& ops, ScalarType a) : ops_(ops), a_(a) {}

  Tensor upload(Shape s, ScalarType t, const std::vector<float>& v) {
    Tensor x = Tensor::empty(ops_.device(), s, t, MemCategory::activations);
    std::vector<unsigned char> raw(x.bytes());
    convert(v.data(), DType::f32, raw.data(), *to_dtype(t), v.size());
    copy_from_host(ops_.device(), ops_.stream(), x, raw.data());
    ops_.stream().synchronize();
    return x;
  }
  Tensor upload_ids(Shape s, const std::vector<int32_t>& v) {
    Tensor x = Tensor::empty(ops_.device(), s, ScalarType::i32, MemCategory::activations);
    copy_from_host(ops_.device(), ops_.stream(), x, v.data());
    ops_.stream().synchronize();
    return x;
  }
  std::vector<float> download(const Tensor& t) {
    std::vector<unsigned char> raw(t.bytes());
    copy_to_host(ops_.device(), ops_.stream(), raw.data(), t);
    ops_.stream().synchronize();
    std::vector<float> v(static_cast<size_t>(t.numel()));
    convert(raw.data(), *to_dtype(t.type()), v.data(), DType::f32, v.size());
    return v;
  }
  Tensor zeros(Shape s) {
    Tensor x = Tensor::zeros(ops_.device(), ops_.stream(), s, ScalarType::f32, MemCategory::gradients);
    ops_.stream().synchronize();
    return x;
  }

  // The whole ops (embedding_forward / _backward, cross_entropy_forward / _backward).
  VocabOutputs whole(const VocabProblem& p, const VocabInputs& in) {
    VocabOutputs o;
    const Tensor tokens = upload_ids(Shape{p.B, p.T}, in.tokens), targets = upload_ids(Shape{p.N()}, in.targets);
    const Tensor wte = upload(Shape{p.V, p.C}, a_, in.wte), wpe = upload(Shape{p.Tmax, p.C}, a_, in.wpe);
    const Tensor out = Tensor::empty(ops_.device(), Shape{p.B, p.T, p.C}, a_, MemCategory::activations);
    ops_.embedding_forward(out, tokens, wte, wpe);
    const Tensor dwte = zeros(Shape{p.V, p.C}), dwpe = zeros(Shape{p.Tmax, p.C});
    ops_.embedding_backward(dwte, dwpe, upload(Shape{p.B, p.T, p.C}, a_, in.dout), tokens);
    const Tensor logits = upload(Shape{p.N(), p.V}, a_, in.logits);
    const Tensor losses = Tensor::empty(ops_.device(), Shape{p.N()}, ScalarType::f32, MemCategory::activations);
    const Tensor loss = Tensor::empty(ops_.device(), Shape{1}, ScalarType::f32, MemCategory::activations);
    ops_.cross_entropy_forward(loss, losses, logits, targets);
    const Tensor dlogits = Tensor::empty(ops_.device(), Shape{p.N(), p.V}, a_, MemCategory::activations);
    ops_.cross_entropy_backward(dlogits, logits, targets, p.scale);
    ops_.check_errors();
    o.emb = download(out);
    o.dwte = download(dwte);
    o.dwpe = download(dwpe);
    o.losses = download(losses);
    o.loss = download(loss)[0];
    o.dlogits = download(dlogits);
    return o;
  }

  // S shards; `shift` hands shard s the rows / columns of shard (s + shift) % S (a control).
  VocabOutputs shards(const VocabProblem& p, const VocabInputs& in, int S, int shift = 0) {
    VocabOutputs o;
    const int64_t Vs = p.V / S, N = p.N();
    o.emb.assign(static_cast<size_t>(N * p.C), 0.0f);
    o.dwte.assign(static_cast<size_t>(p.V * p.C), 0.0f);
    o.dlogits.assign(static_cast<size_t>(N * p.V), 0.0f);
    const Tensor tokens = upload_ids(Shape{p.B, p.T}, in.tokens), targets = upload_ids(Shape{N}, in.targets);
    const Tensor dout = upload(Shape{p.B, p.T, p.C}, a_, in.dout);
    const Tensor dwpe = zeros(Shape{p.Tmax, p.C});
    std::vector<Tensor> logits;
    std::vector<float> rowmax(static_cast<size_t>(N), -INFINITY), sums(static_cast<size_t>(2 * N), 0.0f);
    for (int s = 0; s < S; ++s) {
      const int64_t v0 = s * Vs, held = ((s + shift) % S) * Vs;  // claimed range, rows held
      const std::vector<float> rows(in.wte.begin() + held * p.C, in.wte.begin() + (held + Vs) * p.C);
      const Tensor wte = upload(Shape{Vs, p.C}, a_, rows);
      // The position term and wpe's gradient on shard 0 only, as tensor rank 0 adds them.
      const Tensor wpe = s == 0 ? upload(Shape{p.Tmax, p.C}, a_, in.wpe) : Tensor();
      const Tensor out = Tensor::empty(ops_.device(), Shape{p.B, p.T, p.C}, a_, MemCategory::activations);
      ops_.embedding_forward_shard(out, tokens, wte, wpe, v0, p.V);
      const std::vector<float> part = download(out);
      for (size_t i = 0; i < part.size(); ++i) o.emb[i] += part[i];  // the all-reduce: rank order, fp32
      const Tensor dwte = zeros(Shape{Vs, p.C});
      ops_.embedding_backward_shard(dwte, s == 0 ? dwpe : Tensor(), dout, tokens, v0, p.V);
      const std::vector<float> g = download(dwte);
      std::copy(g.begin(), g.end(), o.dwte.begin() + v0 * p.C);
      std::vector<float> cols;
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = held; j < held + Vs; ++j) cols.push_back(in.logits[static_cast<size_t>(r * p.V + j)]);
      logits.push_back(upload(Shape{N, Vs}, a_, cols));
      const Tensor m = Tensor::empty(ops_.device(), Shape{N}, ScalarType::f32, MemCategory::activations);
      ops_.cross_entropy_shard_max(m, logits.back());
      const std::vector<float> mv = download(m);
      for (size_t r = 0; r < mv.size(); ++r) rowmax[r] = std::max(rowmax[r], mv[r]);  // all-reduce max
    }
    const Tensor m = upload(Shape{N}, ScalarType::f32, rowmax);
    for (int s = 0; s < S; ++s) {
      const Tensor part = Tensor::empty(ops_.device(), Shape{2, N}, ScalarType::f32, MemCategory::activations);
      ops_.cross_entropy_shard_sums(part, logits[static_cast<size_t>(s)], m, targets, s * Vs, p.V);
      const std::vector<float> v = download(part);
      for (size_t i = 0; i < v.size(); ++i) sums[i] += v[i];  // all-reduce sum, rank order
    }
    const Tensor sm = upload(Shape{2, N}, ScalarType::f32, sums);
    const Tensor losses = Tensor::empty(ops_.device(), Shape{N}, ScalarType::f32, MemCategory::activations);
    const Tensor loss = Tensor::empty(ops_.device(), Shape{1}, ScalarType::f32, MemCategory::activations);
    ops_.cross_entropy_shard_loss(loss, losses, m, sm, targets);
    for (int s = 0; s < S; ++s) {
      const Tensor& l = logits[static_cast<size_t>(s)];
      const Tensor d = Tensor::empty(ops_.device(), l.shape(), a_, MemCategory::activations);
      ops_.cross_entropy_shard_backward(d, l, m, sm, targets, s * Vs, p.V, p.scale);
      const std::vector<float> dv = download(d);
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = 0; j < Vs; ++j)
          o.dlogits[static_cast<size_t>(r * p.V + s * Vs + j)] = dv[static_cast<size_t>(r * Vs + j)];
    }
    ops_.check_errors();
    o.dwpe = download(dwpe);
    o.losses = download(losses);
    o.loss = download(loss)[0];
    return o;
  }

 private:
  models::Ops& ops_;
  ScalarType a_;
};

// max |a - b| / max |b|.
inline double vocab_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  if (a.size() != b.size()) return INFINITY;
  return scale > 0 ? d / scale : d;
}

}  // namespace zero::test
