// Tensors: shapes, shared ownership tied to the ledger, views, type-checked access.
#include "core/tensor.hpp"

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

using namespace zero;

TEST_CASE("Shape: rank, element count, rows and equality") {
  const Shape s{2, 3, 4};
  CHECK(s.rank() == 3);
  CHECK(s.numel() == 24);
  CHECK(s.rows() == 6);
  CHECK(s.back() == 4);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(s == Shape{2, 3, 4});
  CHECK_FALSE(s == Shape{2, 12});
  CHECK(Shape{}.numel() == 1);
  CHECK_THROWS_WITH((Shape{1, 2, 3, 4, 5}), Catch::Matchers::ContainsSubstring("at most 4"));
  CHECK_THROWS_WITH((Shape{2, -1}), Catch::Matchers::ContainsSubstring(">= 0"));
}

TEST_CASE("Tensor: storage is shared by copies and leaves the ledger with the last one") {
  auto dev = make_device(DeviceKind::cpu);
  auto stream = dev->create_stream("s");
  {
    Tensor t = Tensor::zeros(*dev, *stream, Shape{4, 8}, ScalarType::bf16, MemCategory::activations);
    stream->synchronize();
    CHECK(t.bytes() == 64);
    CHECK(t.owning());
    CHECK(dev->ledger().current(MemSpace::device, MemCategory::activations) == 64);
    Tensor copy = t.reshaped(Shape{32});
    t = Tensor();
    CHECK(dev->ledger().current(MemSpace::device, MemCategory::activations) == 64);
    CHECK(copy.data_as<bfloat16>()[31].bits == 0);
    CHECK_THROWS_WITH(copy.data_as<float>(), Catch::Matchers::ContainsSubstring("bf16[32] read as fp32"));
    CHECK_THROWS_WITH(copy.reshaped(Shape{5, 7}), Catch::Matchers::ContainsSubstring("element counts differ"));
  }
  CHECK(dev->ledger().current(MemSpace::device, MemCategory::activations) == 0);
}

TEST_CASE("Tensor: views own nothing; copies to and from the host") {
  auto dev = make_device(DeviceKind::cpu);
  auto stream = dev->create_stream("s");
  std::vector<float> mem{1, 2, 3, 4, 5, 6};
  const Tensor v = Tensor::view(mem.data(), Shape{2, 3}, ScalarType::f32);
  CHECK_FALSE(v.owning());
  CHECK(v.describe() == "fp32[2, 3]");
  Tensor t = Tensor::empty(*dev, Shape{2, 3}, ScalarType::f32, MemCategory::other);
  copy_from_host(*dev, *stream, t, mem.data());
  std::vector<float> back(6);
  copy_to_host(*dev, *stream, back.data(), t);
  stream->synchronize();
  CHECK(back == mem);
  CHECK(size_of(ScalarType::f64) == 8);
  CHECK(to_dtype(ScalarType::i32) == std::nullopt);
  CHECK(to_dtype(scalar_type(DType::bf16)) == DType::bf16);
  CHECK_FALSE(Tensor().defined());
}
