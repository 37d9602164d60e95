// Shapes, strides and memory layouts. A 4-d tensor's shape is always logical N, C, H, W;
// its strides say where the elements lie (NCHW, NHWC or any other strided view), as in cuDNN.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI {

// row_major: contiguous in logical order (for 4-d tensors the same as nchw).
enum class Layout { row_major, nchw, nhwc, strided };

// Padding 'same' with an odd total: the extra row/column after (upper: TensorFlow's SAME, ONNX's
// SAME_UPPER) or before (lower: ONNX's SAME_LOWER). conv2d_same_padding, pool2d_same_padding.
enum class SamePadding { upper, lower };

inline std::string_view to_string(Layout l) {
  switch (l) {
    case Layout::row_major: return "row_major";
    case Layout::nchw: return "nchw";
    case Layout::nhwc: return "nhwc";
    case Layout::strided: return "strided";
  }
  return "?";
}
inline std::ostream& operator<<(std::ostream& os, Layout l) { return os << to_string(l); }

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) {}

  int rank() const { return static_cast<int>(dims_.size()); }
  std::int64_t operator[](int i) const { return dims_[checked(i)]; }
  std::int64_t& operator[](int i) { return dims_[checked(i)]; }
  // The product of the dims; a product past int64 throws (check_shape_valid says so earlier,
  // for every shape a tensor is made with).
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims_)
      if (__builtin_mul_overflow(n, d, &n)) {
        for (auto z : dims_)
          if (z == 0) return 0;
        throw InvalidArgument("Shape::numel", detail::cat("the element count of ", str(), " overflows int64"));
      }
    return n;
  }
  const std::vector<std::int64_t>& dims() const { return dims_; }
  auto begin() const { return dims_.begin(); }
  auto end() const { return dims_.end(); }
  friend bool operator==(const Shape&, const Shape&) = default;

  std::string str() const {
    std::string s = "[";
    for (std::size_t i = 0; i < dims_.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(dims_[i]);
    }
    s += ']';
    return s;
  }

 private:
  std::size_t checked(int i) const {
    CUTRAIN_REQUIRE(i >= 0 && i < rank(), InvalidArgument, "Shape", "dim ", i, " out of range for shape ", str(),
                    " of rank ", rank());
    return static_cast<std::size_t>(i);
  }
  std::vector<std::int64_t> dims_;
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

using Strides = std::vector<std::int64_t>;

inline std::string strides_str(const Strides& st) { return Shape(st).str(); }

// Contiguous strides for a shape in a layout; nchw/nhwc need rank 4.
inline Strides contiguous_strides(const Shape& shape, Layout layout) {
  const int r = shape.rank();
  Strides st(static_cast<std::size_t>(r));
  if (layout == Layout::nhwc) {
    CUTRAIN_REQUIRE(r == 4, InvalidArgument, "contiguous_strides", "layout nhwc needs a 4-d shape, got ", shape);
    const auto C = shape[1], H = shape[2], W = shape[3];
    st = {H * W * C, 1, W * C, C};
    return st;
  }
  CUTRAIN_REQUIRE(layout == Layout::row_major || layout == Layout::nchw, InvalidArgument,
                  "contiguous_strides", "cannot make contiguous strides for layout ", layout);
  CUTRAIN_REQUIRE(layout != Layout::nchw || r == 4, InvalidArgument, "contiguous_strides",
                  "layout nchw needs a 4-d shape, got ", shape);
  std::int64_t s = 1;
  for (int i = r - 1; i >= 0; --i) {
    st[static_cast<std::size_t>(i)] = s;
    s *= shape[i];
  }
  return st;
}

// The layout that a shape and strides describe; size-1 dimensions match any stride.
inline Layout layout_of(const Shape& shape, const Strides& strides) {
  auto matches = [&](const Strides& want) {
    for (int i = 0; i < shape.rank(); ++i)
      if (shape[i] != 1 && strides[static_cast<std::size_t>(i)] != want[static_cast<std::size_t>(i)]) return false;
    return true;
  };
  if (matches(contiguous_strides(shape, Layout::row_major))) return shape.rank() == 4 ? Layout::nchw : Layout::row_major;
  if (shape.rank() == 4 && matches(contiguous_strides(shape, Layout::nhwc))) return Layout::nhwc;
  return Layout::strided;
}

// Channels-last memory: layout_of says nhwc, or the strides are exactly NHWC's and not row-major's
// (one channel or H = W = 1, where both layouts are the same memory and layout_of says nchw: the
// strides still record which was asked for, e.g. by Module::to(Layout::nhwc)).
inline bool is_channels_last(const Shape& shape, const Strides& strides) {
  if (layout_of(shape, strides) == Layout::nhwc) return true;
  return shape.rank() == 4 && strides == contiguous_strides(shape, Layout::nhwc) &&
         strides != contiguous_strides(shape, Layout::row_major);
}

// Every dim non-negative, and the bytes of a tensor of this shape (elem_bytes each) and every
// contiguous stride countable in int64: the product of the non-zero dims times elem_bytes must
// fit, so that a zero dim cannot hide an overflowing stride ([0, 2^40, 2^40]).
inline bool shape_fits(const Shape& s, std::size_t elem_bytes = 1) {
  std::int64_t n = static_cast<std::int64_t>(elem_bytes);
  for (auto d : s)
    if (d < 0 || (d != 0 && __builtin_mul_overflow(n, d, &n))) return false;
  return true;
}
inline void check_shape_valid(std::string_view op, const Shape& s, std::size_t elem_bytes = 1) {
  for (auto d : s)
    CUTRAIN_REQUIRE(d >= 0, InvalidArgument, op, "shape ", s, " has a negative dimension");
  CUTRAIN_REQUIRE(shape_fits(s, elem_bytes), InvalidArgument, op, "shape ", s,
                  elem_bytes > 1 ? detail::cat(" of ", elem_bytes, "-byte elements") : std::string(),
                  " is too large: its ", elem_bytes > 1 ? "byte" : "element", " count overflows int64");
}

// The element count of s, after check_shape_valid(op, s, elem_bytes): for output shapes that
// ops compute from their parameters (pooling, flatten, linear), so the error names the op.
inline std::int64_t checked_numel(std::string_view op, const Shape& s, std::size_t elem_bytes = 1) {
  check_shape_valid(op, s, elem_bytes);
  return s.numel();
}

}  // namespace cutrain::inline CUTRAIN_ABI
