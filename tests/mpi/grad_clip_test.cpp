// Gradient clipping (optim/clip.hpp) on 1, 2, 3 and 4 ranks: the host squared norm (values,
// determinism over thread counts, inf/NaN), the global norm of a gradient sharded over the ranks
// against the single-process norm of the whole vector, overflow on one rank seen by all, and
// DeepSpeed's clip coefficient folded with the loss scale into Adam's grad_scale.
//
// Accuracy of the global norm (why the bound below holds). Each rank's local squared norm is a
// double sum rounded once to float: relative error <= 2^-24 (the double sum's own error, at most
// n * 2^-53 ~ 1e-10 for a million terms, is covered by the 1e-9 slack). The all-reduce adds the N
// non-negative floats in fp32: N - 1 more roundings of <= 2^-24 relative each. So
//   |squared - exact| <= (N * 2^-24 + 1e-9) * exact,
// and the square root halves that and rounds once more:
//   |norm - exact_norm| <= ((N / 2 + 1) * 2^-24 + 1e-9) * exact_norm.
#include <catch2/catch_test_macros.hpp>

#include <tbb/task_arena.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "collectives/communicator.hpp"
#include "optim/clip.hpp"
#include "optim/loss_scaler.hpp"
#include "core/device.hpp"
#include "core/world.hpp"
#include "tests/mpi/mpi_fixture.hpp"

using namespace zero;
using namespace zero::optim;

namespace {

using test::env;

// Gradient element i: a hash made into a float of either sign with magnitude in [2^-8, 2^4),
// the same on every rank.
float value(size_t i) {
  uint64_t h = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  const float mant = static_cast<float>((h & 0x7fffff) | 0x800000);  // [2^23, 2^24)
  const int exp = static_cast<int>((h >> 24) % 12) - 8;
  const float v = std::ldexp(mant, exp - 23);
  return (h >> 40) & 1 ? -v : v;
}

// Elements [begin, begin + n) of the gradient, stored as `dt`.
std::vector<uint8_t> make_grad(DType dt, size_t begin, size_t n) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = value(begin + i);
  std::vector<uint8_t> out(n * size_of(dt) + 1);  // +1: never a null data()
  convert(f.data(), DType::f32, out.data(), dt, n);
  return out;
}

// The exact (double) squared norm of the whole gradient as stored in `dt`.
double reference_squared(DType dt, size_t total) {
  const auto g = make_grad(dt, 0, total);
  std::vector<float> f(total);
  convert(g.data(), dt, f.data(), DType::f32, total);
  double sq = 0.0;
  for (float v : f) sq += static_cast<double>(v) * static_cast<double>(v);
  return sq;
}

// This rank's shard of a gradient of `total` elements: equal slices of ceil(total / N), the last
// rank's shorter (possibly empty), as a partitioner with padding lays them out.
struct Shard {
  size_t begin, size;
};
Shard shard_of(size_t total, int rank, int ranks) {
  const size_t per = (total + static_cast<size_t>(ranks) - 1) / static_cast<size_t>(ranks);
  const size_t begin = std::min(total, per * static_cast<size_t>(rank));
  return {begin, std::min(per, total - begin)};
}

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Writes `v` (inf or NaN, as fp32) at element i of a gradient stored as dt.
void poison(std::vector<uint8_t>& g, DType dt, size_t i, float v) {
  convert(&v, DType::f32, g.data() + i * size_of(dt), dt, 1);
}

const DType kDtypes[] = {DType::f32, DType::f16, DType::bf16};

}  // namespace

TEST_CASE("clip: local_squared_norm of small vectors, every dtype") {
  for (DType dt : kDtypes) {
    CAPTURE(to_string(dt));
    const float x[] = {3.0f, -4.0f, 0.0f, 12.0f};
    std::vector<uint8_t> g(sizeof x);
    convert(x, DType::f32, g.data(), dt, 4);
    CHECK(local_squared_norm(g.data(), dt, 4) == 169.0f);  // 9 + 16 + 0 + 144, exact
    CHECK(local_squared_norm(g.data(), dt, 0) == 0.0f);
    CHECK(local_squared_norm(nullptr, dt, 0) == 0.0f);
  }
  // The largest fp16 squared is far from overflowing the double sum: finite.
  const float big[] = {65504.0f, -65504.0f};
  std::vector<uint8_t> h(4);
  convert(big, DType::f32, h.data(), DType::f16, 2);
  CHECK(local_squared_norm(h.data(), DType::f16, 2) == static_cast<float>(2.0 * 65504.0 * 65504.0));
}

TEST_CASE("clip: local_squared_norm is the same bits for any thread count") {
  // 10 chunks and a tail: the parallel path. Tolerance against the exact value: see the top.
  const size_t n = 10 * kNormChunkElements + 12345;
  for (DType dt : kDtypes) {
    CAPTURE(to_string(dt));
    const auto g = make_grad(dt, 0, n);
    std::vector<float> results;
    for (int threads : {1, 2, 3, 8}) {
      tbb::task_arena arena(threads);
      arena.execute([&] { results.push_back(local_squared_norm(g.data(), dt, n)); });
    }
    for (float r : results) CHECK(std::memcmp(&r, &results[0], 4) == 0);
    const double exact = reference_squared(dt, n);
    CHECK(std::fabs(results[0] - exact) <= (std::ldexp(1.0, -24) + 1e-9) * exact);
  }
}

TEST_CASE("clip: local_squared_norm carries inf and NaN") {
  const size_t n = 3 * kNormChunkElements + 7;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = bits_to_float(0x7fc00000u);
  for (DType dt : kDtypes) {
    CAPTURE(to_string(dt));
    for (size_t at : {size_t{0}, kNormChunkElements + 5, n - 1}) {
      CAPTURE(at);
      auto g = make_grad(dt, 0, n);
      poison(g, dt, at, -inf);
      CHECK(std::isinf(local_squared_norm(g.data(), dt, n)));
      poison(g, dt, at, nan);
      CHECK(std::isnan(local_squared_norm(g.data(), dt, n)));
    }
  }
}

TEST_CASE("clip: the global norm of a sharded gradient is the norm of the whole gradient") {
  auto& c = *env().comm;
  const int ranks = c.size(), rank = c.rank();
  const double tol = ranks * std::ldexp(1.0, -24) + 1e-9;
  const double tol_norm = (ranks / 2.0 + 1.0) * std::ldexp(1.0, -24) + 1e-9;
  for (DType dt : kDtypes)
    for (size_t total : {size_t{1}, size_t{1009}, size_t{1000003}}) {
      CAPTURE(to_string(dt), total, ranks);
      const Shard s = shard_of(total, rank, ranks);
      const auto mine = make_grad(dt, s.begin, s.size);
      const GlobalNorm g = global_grad_norm(c, local_squared_norm(mine.data(), dt, s.size));
      const double exact_sq = reference_squared(dt, total);
      CHECK(g.finite);
      CHECK(std::fabs(g.squared - exact_sq) <= tol * exact_sq);
      CHECK(std::fabs(g.norm - std::sqrt(exact_sq)) <= tol_norm * std::sqrt(exact_sq));
      CHECK(g.norm == std::sqrt(g.squared));
      if (ranks == 1) {  // a world of one: exactly the single-process squared norm
        const auto whole = make_grad(dt, 0, total);
        CHECK(g.squared == local_squared_norm(whole.data(), dt, total));
      }
    }
}

TEST_CASE("clip: inf or NaN in one rank's shard makes every rank see finite == false") {
  auto& c = *env().comm;
  const int ranks = c.size(), rank = c.rank();
  const size_t total = 100003;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = bits_to_float(0x7fc00000u);
  for (DType dt : kDtypes)
    for (int bad = 0; bad < ranks; ++bad)
      for (float v : {inf, -inf, nan}) {
        CAPTURE(to_string(dt), bad, v);
        const Shard s = shard_of(total, rank, ranks);
        auto mine = make_grad(dt, s.begin, s.size);
        if (rank == bad && s.size > 0) poison(mine, dt, s.size / 2, v);
        const GlobalNorm g = global_grad_norm(c, local_squared_norm(mine.data(), dt, s.size));
        CHECK_FALSE(g.finite);
        // Every rank's loss scaler takes the same decision: skip, and halve (hysteresis 1).
        LossScalerOptions o;
        o.enabled = true;
        o.initial_scale_power = 10;
        o.hysteresis = 1;
        LossScaler scaler(o);
        const StepScale step = prepare_step(scaler, g, 1.0f);
        CHECK_FALSE(step.apply);
        CHECK(step.grad_scale == 0.0f);
        CHECK(scaler.scale() == 512.0);
      }
  // And back to clean: finite on every rank.
  const Shard s = shard_of(total, rank, ranks);
  const auto mine = make_grad(DType::f16, s.begin, s.size);
  CHECK(global_grad_norm(c, local_squared_norm(mine.data(), DType::f16, s.size)).finite);
}

TEST_CASE("clip: DeepSpeed's clip coefficient") {
  // min(1, max_norm / (norm + 1e-6)); computed in double, rounded to float once.
  CHECK(clip_coefficient(5.0f, 0.0f) == 1.0f);    // gradient_clipping 0: off
  CHECK(clip_coefficient(5.0f, -1.0f) == 1.0f);   // as DeepSpeed's `if clip_grad > 0`
  CHECK(clip_coefficient(0.5f, 1.0f) == 1.0f);    // below the threshold: untouched
  CHECK(clip_coefficient(0.0f, 1.0f) == 1.0f);
  // At the threshold DeepSpeed still clips by 1 / (1 + 1e-6) = 0.999999000001.
  CHECK(clip_coefficient(1.0f, 1.0f) == static_cast<float>(1.0 / 1.000001));
  CHECK(clip_coefficient(1.0f, 1.0f) < 1.0f);
  // norm 4, max 1: 1 / 4.000001 = 0.24999993750001562.
  CHECK(clip_coefficient(4.0f, 1.0f) == static_cast<float>(0.24999993750001562));
  CHECK(std::isnan(clip_coefficient(std::nanf(""), 1.0f)));
  CHECK(clip_coefficient(std::numeric_limits<float>::infinity(), 1.0f) == 0.0f);
}

TEST_CASE("clip: clipping and loss scale fold into Adam's grad_scale") {
  GlobalNorm g;
  g.norm = 4096.0f;  // scaled by 1024: the gradient's own norm is 4
  g.squared = g.norm * g.norm;
  SECTION("clipped: grad_scale = (1 / (4 + 1e-6)) / 1024") {
    const StepScale s = fold_grad_scale(g, 1024.0, 1.0f);
    CHECK(s.apply);
    CHECK(s.grad_norm == 4.0f);
    CHECK(s.clip_coef == static_cast<float>(1.0 / 4.000001));
    CHECK(s.grad_scale == static_cast<float>(1.0 / 4.000001 / 1024.0));
  }
  SECTION("not clipped: grad_scale = 1 / loss_scale") {
    const StepScale s = fold_grad_scale(g, 1024.0, 10.0f);
    CHECK(s.clip_coef == 1.0f);
    CHECK(s.grad_scale == 1.0f / 1024.0f);
  }
  SECTION("clipping off") {
    CHECK(fold_grad_scale(g, 1024.0, 0.0f).grad_scale == 1.0f / 1024.0f);
  }
  SECTION("prepare_step divides by the scale the gradients carry, not the updated one") {
    // Window 1: the second clean step doubles the scale (1024 -> 2048) in its update; its
    // gradients were computed at 1024.
    LossScalerOptions o;
    o.enabled = true;
    o.initial_scale_power = 10;
    o.loss_scale_window = 1;
    LossScaler scaler(o);
    CHECK(prepare_step(scaler, g, 1.0f).loss_scale == 1024.0);  // it0: stable 0
    const StepScale s = prepare_step(scaler, g, 1.0f);           // it1: stable 1 -> double
    CHECK(scaler.scale() == 2048.0);
    CHECK(s.apply);
    CHECK(s.loss_scale == 1024.0);
    CHECK(s.grad_scale == static_cast<float>(1.0 / 4.000001 / 1024.0));
  }
}

TEST_CASE("clip: clipping the sharded gradient brings the global norm to max_norm") {
  // Every rank scales its shard by the common grad_scale; the global norm of the result is
  // max_norm * norm / (norm + 1e-6) up to: the norm's tolerance (top of the file) twice, for the
  // norm before and after, (N + 2) * 2^-24; the rounding of grad_scale to float and of each
  // scaled element, 2^-24 each.
  auto& c = *env().comm;
  const int ranks = c.size(), rank = c.rank();
  const size_t total = 300007;
  const Shard s = shard_of(total, rank, ranks);
  auto mine = make_grad(DType::f32, s.begin, s.size);
  const GlobalNorm before = global_grad_norm(c, local_squared_norm(mine.data(), DType::f32, s.size));
  REQUIRE(before.norm > 2.0f);
  const StepScale step = fold_grad_scale(before, 1.0, 2.0f);
  float* x = reinterpret_cast<float*>(mine.data());
  for (size_t i = 0; i < s.size; ++i) x[i] *= step.grad_scale;
  const GlobalNorm after = global_grad_norm(c, local_squared_norm(mine.data(), DType::f32, s.size));
  const double want = 2.0 * before.norm / (before.norm + 1e-6);
  CHECK(std::fabs(after.norm - want) <=
        ((ranks + 4.0) * std::ldexp(1.0, -24) + 2e-9) * want);
}
