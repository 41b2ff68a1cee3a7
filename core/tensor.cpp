#include "core/tensor.hpp"

#include <string>
#include <utility>

namespace zero {

Shape::Shape(std::initializer_list<int64_t> dims) {
  ZERO_REQUIRE(dims.size() <= static_cast<size_t>(kMaxRank),
               "a tensor shape has at most " + std::to_string(kMaxRank) + " dimensions, got " +
                   std::to_string(dims.size()));
  for (int64_t d : dims) {
    ZERO_REQUIRE(d >= 0, "a tensor dimension must be >= 0, got " + std::to_string(d));
    dims_[static_cast<size_t>(rank_++)] = d;
  }
}

int64_t Shape::numel() const noexcept {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

int64_t Shape::rows() const noexcept {
  int64_t n = 1;
  for (int i = 0; i + 1 < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < rank_; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims_[static_cast<size_t>(i)]);
  }
  return s + "]";
}

bool operator==(const Shape& a, const Shape& b) noexcept {
  if (a.rank_ != b.rank_) return false;
  for (int i = 0; i < a.rank_; ++i)
    if (a.dims_[static_cast<size_t>(i)] != b.dims_[static_cast<size_t>(i)]) return false;
  return true;
}

Tensor Tensor::empty(Device& device, Shape shape, ScalarType type, MemCategory category) {
  Tensor t;
  t.shape_ = shape;
  t.type_ = type;
  t.defined_ = true;
  const size_t bytes = t.bytes();
  t.storage_ = std::make_shared<Buffer>(device.allocate(bytes, category));
  t.data_ = t.storage_->data();
  return t;
}

Tensor Tensor::zeros(Device& device, Stream& stream, Shape shape, ScalarType type,
                     MemCategory category) {
  Tensor t = empty(device, shape, type, category);
  if (t.bytes() > 0) {
    device.fill_async(t.data(), 0, t.bytes(), stream);
    // The fill holds only a pointer: keep the storage alive until the stream has passed it, in
    // case the caller drops the tensor first (e.g. an exception unwinding a constructor).
    stream.launch_host([keep = t] {});
  }
  return t;
}

Tensor Tensor::view(void* data, Shape shape, ScalarType type) {
  Tensor t;
  t.shape_ = shape;
  t.type_ = type;
  t.defined_ = true;
  t.data_ = data;
  ZERO_REQUIRE(data != nullptr || t.numel() == 0,
               "Tensor::view of " + t.describe() + " needs memory, got a null pointer");
  return t;
}

Tensor Tensor::reshaped(Shape shape) const {
  ZERO_REQUIRE(shape.numel() == numel(), "cannot reshape " + describe() + " to " + shape.str() +
                                             ": the element counts differ");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

std::string Tensor::describe() const {
  if (!defined_) return "(empty tensor)";
  return std::string(to_string(type_)) + shape_.str();
}

void Tensor::wrong_type(ScalarType asked) const {
  ZERO_FAIL("tensor " + describe() + " read as " + std::string(to_string(asked)));
}

void copy_from_host(Device& device, Stream& stream, const Tensor& dst, const void* host) {
  if (dst.bytes() > 0) device.copy_async(dst.data(), host, dst.bytes(), stream);
}

void copy_to_host(Device& device, Stream& stream, void* host, const Tensor& src) {
  if (src.bytes() > 0) device.copy_async(host, src.data(), src.bytes(), stream);
}

}  // namespace zero
