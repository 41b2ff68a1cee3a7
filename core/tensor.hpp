// Tensors: a shaped, typed handle on memory a Device allocated (or on memory someone else owns),
// the currency between the engine and a model's Units (unit.hpp).
//
// Element types (ScalarType) are a superset of the training dtypes (dtype.hpp): besides fp32,
// fp16 and bf16 there are fp64 (the cpu backend's reference precision, used by gradient checks;
// collectives and optimizers never see it) and int32 (token ids and targets).
//
// Ownership: copies of a Tensor share its storage (std::shared_ptr), and the bytes go back to the
// Device (and out of its ledger) when the last copy is gone. This is what lets an activation be
// kept for backward simply by keeping a copy, and lets a cpu-stream task keep its operands alive
// by capturing them. A view (Tensor::view) owns nothing: the memory must outlive every copy of
// it. The Device must outlive every Tensor allocated on it.
//
// Thread-safety: a Tensor handle may be copied and destroyed from any thread (shared_ptr
// semantics); the elements themselves are not synchronised: ordering is the streams' business.
// Shapes are row-major and contiguous; there are no strides.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/device.hpp"
#include "core/dtype.hpp"
#include "core/error.hpp"

namespace zero {

enum class ScalarType : uint8_t { f32, f16, bf16, f64, i32 };

constexpr ScalarType scalar_type(DType t) noexcept {
  switch (t) {
    case DType::f32: return ScalarType::f32;
    case DType::f16: return ScalarType::f16;
    case DType::bf16: return ScalarType::bf16;
  }
  return ScalarType::f32;
}

// The training dtype with the same encoding; nullopt for fp64 and int32.
constexpr std::optional<DType> to_dtype(ScalarType t) noexcept {
  switch (t) {
    case ScalarType::f32: return DType::f32;
    case ScalarType::f16: return DType::f16;
    case ScalarType::bf16: return DType::bf16;
    case ScalarType::f64:
    case ScalarType::i32: return std::nullopt;
  }
  return std::nullopt;
}

constexpr size_t size_of(ScalarType t) noexcept {
  switch (t) {
    case ScalarType::f64: return 8;
    case ScalarType::f32:
    case ScalarType::i32: return 4;
    case ScalarType::f16:
    case ScalarType::bf16: return 2;
  }
  return 0;
}

// "fp32", "fp16", "bf16", "fp64", "int32".
constexpr std::string_view to_string(ScalarType t) noexcept {
  switch (t) {
    case ScalarType::f32: return "fp32";
    case ScalarType::f16: return "fp16";
    case ScalarType::bf16: return "bf16";
    case ScalarType::f64: return "fp64";
    case ScalarType::i32: return "int32";
  }
  return "?";
}

// The ScalarType of a C++ element type: float, double, int32_t, zero::half, zero::bfloat16.
template <class T>
inline constexpr bool kIsElementType = false;
template <class T>
inline constexpr ScalarType scalar_type_of = ScalarType::f32;
#define ZERO_ELEMENT_TYPE(T, S)              \
  template <>                                \
  inline constexpr bool kIsElementType<T> = true; \
  template <>                                \
  inline constexpr ScalarType scalar_type_of<T> = S;
ZERO_ELEMENT_TYPE(float, ScalarType::f32)
ZERO_ELEMENT_TYPE(double, ScalarType::f64)
ZERO_ELEMENT_TYPE(int32_t, ScalarType::i32)
ZERO_ELEMENT_TYPE(half, ScalarType::f16)
ZERO_ELEMENT_TYPE(bfloat16, ScalarType::bf16)
#undef ZERO_ELEMENT_TYPE

// Up to four dimensions, each >= 0.
class Shape {
 public:
  static constexpr int kMaxRank = 4;
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);

  int rank() const noexcept { return rank_; }
  int64_t operator[](int i) const noexcept { return dims_[static_cast<size_t>(i)]; }
  // Negative i counts from the end: back(-1) is the last dimension.
  int64_t back(int i = -1) const noexcept { return dims_[static_cast<size_t>(rank_ + i)]; }
  int64_t numel() const noexcept;
  // Product of all dimensions but the last (the "rows" of a row-major matrix view).
  int64_t rows() const noexcept;
  std::string str() const;  // "[2, 64, 128]"
  friend bool operator==(const Shape& a, const Shape& b) noexcept;

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

class Tensor {
 public:
  Tensor() = default;  // empty: no storage, data() == nullptr

  // Device memory on `device`, counted in its ledger under `category`; uninitialised.
  // Throws OutOfMemory past the device's capacity.
  static Tensor empty(Device& device, Shape shape, ScalarType type, MemCategory category);
  // Like empty(), filled with zero bytes in `stream` order; the storage stays alive until the
  // fill has run even if every handle is dropped before.
  static Tensor zeros(Device& device, Stream& stream, Shape shape, ScalarType type,
                      MemCategory category);
  // A handle on memory someone else owns (for example a slice of the engine's flat parameter
  // buffer). Counted in no ledger. `data` must outlive every copy of the view.
  static Tensor view(void* data, Shape shape, ScalarType type);

  void* data() const noexcept { return data_; }
  // Typed pointer; throws zero::Error when T is not this tensor's element type.
  template <class T>
  T* data_as() const {
    static_assert(kIsElementType<T>, "not a tensor element type");
    if (scalar_type_of<T> != type_) wrong_type(scalar_type_of<T>);
    return static_cast<T*>(data_);
  }
  ScalarType type() const noexcept { return type_; }
  const Shape& shape() const noexcept { return shape_; }
  int64_t numel() const noexcept { return shape_.numel(); }
  size_t bytes() const noexcept { return static_cast<size_t>(numel()) * size_of(type_); }
  // True unless default-constructed (a zero-element tensor is still "defined").
  bool defined() const noexcept { return defined_; }
  explicit operator bool() const noexcept { return defined_; }
  // Whether this handle shares ownership of its storage (false for views and empty tensors).
  bool owning() const noexcept { return storage_ != nullptr; }
  // The same elements under another shape with the same element count; shares ownership.
  Tensor reshaped(Shape shape) const;
  // "bf16[2, 64, 128]"
  std::string describe() const;

 private:
  [[noreturn]] void wrong_type(ScalarType asked) const;

  std::shared_ptr<Buffer> storage_;
  void* data_ = nullptr;
  Shape shape_;
  ScalarType type_ = ScalarType::f32;
  bool defined_ = false;
};

// Stream-ordered copies between a tensor and host memory (`host` holds tensor.bytes() bytes).
// The host memory must stay valid until the stream has passed the copy.
void copy_from_host(Device& device, Stream& stream, const Tensor& dst, const void* host);
void copy_to_host(Device& device, Stream& stream, void* host, const Tensor& src);

}  // namespace zero
