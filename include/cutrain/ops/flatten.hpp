// flatten / flatten_backward: [N, ...] <-> [N, rest] in logical (NCHW) order. Pure data movement,
// so every dtype works on both devices; only the device check dispatches. On a cuda tensor the
// copies (an nhwc or strided x, an nhwc dx, a strided dy) are Tensor::contiguous (the backend's
// strided copy kernel); row-major inputs give views, with no copy at all.
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/cpu/common.hpp"
#include "cutrain/ops/dispatch.hpp"

namespace cutrain::inline CUTRAIN_ABI::ops {

// A view when x is row-major (nchw); an nhwc or strided x is copied to row-major first, so
// the features of one sample come out in c, h, w order whatever the layout.
template <class T>
Tensor<T> flatten(const Tensor<T>& x) {
  constexpr std::string_view op = "flatten";
  check::defined(op, x, "x");
  CUTRAIN_REQUIRE(x.rank() >= 2, InvalidArgument, op, "x must be at least 2-d [N, ...], got ", x.describe());
  // x exists, so its element count fits: so does the product of its trailing dims.
  std::int64_t rest = 1;
  for (int d = 1; d < x.rank(); ++d) rest *= x.dim(d);
  return detail::dispatch<Tensor<T>, detail::AnyDtype>(
      op, [&](const auto& x) { return cpu::row_major(x).reshape(Shape{x.dim(0), rest}); },
      CUTRAIN_IF_CUDA([&](const auto& x) { return x.contiguous(Layout::row_major).reshape(Shape{x.dim(0), rest}); }), x);
}

// dy [N, rest] back to x_shape, contiguous in `layout` (row_major/nchw: a view of dy when dy is
// row-major; nhwc: a copy).
template <class T>
Tensor<T> flatten_backward(const Tensor<T>& dy, const Shape& x_shape, Layout layout) {
  constexpr std::string_view op = "flatten_backward";
  check::rank(op, dy, 2, "dy");
  CUTRAIN_REQUIRE(x_shape.rank() >= 2, InvalidArgument, op, "x_shape must be at least 2-d [N, ...], got ", x_shape);
  check_shape_valid(op, x_shape, sizeof(T));
  std::int64_t rest = 1;
  for (int d = 1; d < x_shape.rank(); ++d) rest *= x_shape[d];
  const Shape want{x_shape[0], rest};
  CUTRAIN_REQUIRE(dy.shape() == want, InvalidArgument, op, "dy must have shape ", want, " to unflatten to x_shape ",
                  x_shape, ", got ", dy.describe());
  CUTRAIN_REQUIRE(layout != Layout::strided, InvalidArgument, op, "layout must be row_major, nchw or nhwc, got ",
                  layout);
  CUTRAIN_REQUIRE(layout != Layout::nhwc || x_shape.rank() == 4, InvalidArgument, op,
                  "layout nhwc needs a 4-d x_shape, got ", x_shape);
  const auto in_layout = [&](Tensor<T> dx) { return layout == Layout::nhwc ? dx.contiguous(Layout::nhwc) : std::move(dx); };
  return detail::dispatch<Tensor<T>, detail::AnyDtype>(
      op, [&](const auto& dy) { return in_layout(cpu::row_major(dy).reshape(x_shape)); },
      CUTRAIN_IF_CUDA([&](const auto& dy) { return in_layout(dy.contiguous(Layout::row_major).reshape(x_shape)); }), dy);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
