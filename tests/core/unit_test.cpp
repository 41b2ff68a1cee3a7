// The Unit contract's model-level helpers: counter-based initialisation, the parameter/Unit map
// and the checkpoint plan.
#include "core/unit.hpp"

#include <catch2/catch_test_macros.hpp>

#include <cmath>

using namespace zero;

namespace {
class FakeUnit final : public Unit {
 public:
  FakeUnit(std::string n, std::vector<int> ids, bool ck) : n_(std::move(n)), ids_(std::move(ids)), ck_(ck) {}
  const std::string& name() const noexcept override { return n_; }
  std::span<const int> param_ids() const noexcept override { return ids_; }
  bool checkpointable() const noexcept override { return ck_; }
  void forward(UnitContext&) override {}
  void backward(UnitContext&) override {}

 private:
  std::string n_;
  std::vector<int> ids_;
  bool ck_;
};

Model fake_model(int blocks) {
  Model m;
  m.name = "fake";
  for (int i = 0; i < blocks + 1; ++i) m.params.push_back({"p" + std::to_string(i), Shape{3}});
  m.units.push_back(std::make_unique<FakeUnit>("first", std::vector<int>{0}, false));
  for (int b = 0; b < blocks; ++b)
    m.units.push_back(std::make_unique<FakeUnit>("b" + std::to_string(b), std::vector<int>{b + 1}, true));
  m.units.push_back(std::make_unique<FakeUnit>("last", std::vector<int>{0}, false));  // tied to p0
  return m;
}
}  // namespace

TEST_CASE("init_param_values: any slice gives the same values as the whole") {
  ParamSpec p{"h.0.attn.c_attn.weight", Shape{33, 17}, ScalarType::f32, true, ParamInit::normal, 0.02f};
  std::vector<float> whole(33 * 17), part(100);
  init_param_values(p, 1234, 0, p.numel(), whole.data());
  init_param_values(p, 1234, 200, 100, part.data());
  for (int i = 0; i < 100; ++i) CHECK(part[static_cast<size_t>(i)] == whole[static_cast<size_t>(200 + i)]);
  // N(0, 0.02^2): over 561 samples the mean is within 4 standard errors (0.02/sqrt(561) * 4)
  // and the standard deviation within 15%.
  double sum = 0, sq = 0;
  for (float v : whole) sum += v, sq += static_cast<double>(v) * v;
  const double mean = sum / whole.size(), sd = std::sqrt(sq / whole.size() - mean * mean);
  CHECK(std::abs(mean) < 4 * 0.02 / std::sqrt(561.0));
  CHECK(std::abs(sd - 0.02) < 0.15 * 0.02);
  // Another seed or another name gives other values; zeros and ones are what they say.
  std::vector<float> other(33 * 17);
  init_param_values(p, 1235, 0, p.numel(), other.data());
  CHECK(other != whole);
  p.name = "h.1.attn.c_attn.weight";
  init_param_values(p, 1234, 0, p.numel(), other.data());
  CHECK(other != whole);
  p.init = ParamInit::ones;
  init_param_values(p, 1234, 5, 3, part.data());
  CHECK((part[0] == 1.0f && part[2] == 1.0f));
  CHECK_THROWS(init_param_values(p, 1, 560, 2, part.data()));
}

TEST_CASE("init_param_values: a tensor-parallel slice holds the whole parameter's values there") {
  ParamSpec whole{"h.0.attn.c_attn.weight", Shape{4, 6}, ScalarType::f32, true, ParamInit::normal, 0.02f};
  std::vector<float> w(24);
  init_param_values(whole, 7, 0, 24, w.data());
  // Columns as q | k | v (3 blocks of 2), degree 2: rank 1 holds columns 1, 3 and 5.
  ParamSpec cols = whole;
  cols.shape = Shape{4, 3};
  cols.slice = ParamSlice{TensorSplit::sliced, Shape{4, 6}, 1, 3, 1, 2};
  std::vector<float> c(12);
  init_param_values(cols, 7, 0, 12, c.data());
  for (int r = 0; r < 4; ++r)
    for (int j = 0; j < 3; ++j) CHECK(c[static_cast<size_t>(r * 3 + j)] == w[static_cast<size_t>(r * 6 + 2 * j + 1)]);
  // Part of a slice: elements [5, 9) of it.
  std::vector<float> part(4);
  init_param_values(cols, 7, 5, 4, part.data());
  for (int i = 0; i < 4; ++i) CHECK(part[static_cast<size_t>(i)] == c[static_cast<size_t>(5 + i)]);
  // Rows, one block, degree 2: rank 1 holds rows 2 and 3, contiguous.
  ParamSpec rows = whole;
  rows.shape = Shape{2, 6};
  rows.slice = ParamSlice{TensorSplit::sliced, Shape{4, 6}, 0, 1, 1, 2};
  std::vector<float> r(12);
  init_param_values(rows, 7, 0, 12, r.data());
  CHECK(r == std::vector<float>(w.begin() + 12, w.end()));
  // A slice that does not fit its shape names the parameter.
  rows.shape = Shape{3, 6};
  CHECK_THROWS(init_param_values(rows, 7, 0, 1, r.data()));
  ParamSpec rep = whole;
  rep.slice = ParamSlice{TensorSplit::replicated, Shape{4, 5}, 0, 1, 0, 2};
  CHECK_THROWS(check_param_slice(rep));
}

TEST_CASE("Model: a tied parameter's gradient completes at its first user") {
  const Model m = fake_model(3);
  CHECK(m.parameter_count() == 12);
  const std::vector<int> last = m.last_gradient_unit();
  CHECK(last == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("checkpoint_plan: k of the checkpointable Units, evenly spread") {
  const Model m = fake_model(6);
  auto count = [](const std::vector<bool>& v) { return std::count(v.begin(), v.end(), true); };
  CHECK(count(checkpoint_plan(m, std::nullopt)) == 0);
  CHECK(count(checkpoint_plan(m, 0)) == 0);
  const std::vector<bool> all = checkpoint_plan(m, 100);
  CHECK(count(all) == 6);
  CHECK_FALSE(all.front());
  CHECK_FALSE(all.back());
  const std::vector<bool> three = checkpoint_plan(m, 3);
  CHECK(three == std::vector<bool>{false, false, true, false, true, false, true, false});
}
