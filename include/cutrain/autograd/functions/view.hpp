// Differentiable views on Var<T> (core/view.hpp): transpose, permute, view, reshape, contiguous,
// slice, squeeze, unsqueeze and expand. Forward is the view itself (no copy, save reshape of a
// tensor no view expresses); backward takes dy back to the input's shape: transpose and permute
// by the inverse permutation, view/reshape/squeeze/unsqueeze/contiguous by a reshape, slice into
// a zero-filled gradient, expand by summing over the broadcast dims (ops::sum_to).
//
// The gradients come out contiguous, in the input's layout where the input was contiguous
// (row-major otherwise): optimizers and the GPU kernels read a gradient as laid out like its
// parameter, and a view of dy (a transposed one, say) is not.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/ops/sum_to.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

namespace detail {
// The layout a view's input gradient takes: the input's when it was contiguous, else row-major.
template <class T>
Layout grad_layout(const Tensor<T>& x) {
  return x.layout() == Layout::nhwc ? Layout::nhwc : Layout::row_major;
}

// g contiguous in layout l (a view when it already is).
template <class T>
Tensor<T> as_grad(Tensor<T> g, Layout l) {
  if (l == Layout::nhwc && g.rank() == 4) return g.layout() == Layout::nhwc ? std::move(g) : g.contiguous(Layout::nhwc);
  return g.layout() == Layout::row_major || g.layout() == Layout::nchw ? std::move(g) : g.contiguous(Layout::row_major);
}
}  // namespace detail

// view, reshape, squeeze, unsqueeze, contiguous: dy reshaped back to x's shape.
template <class T>
struct ReshapeFn final : Node<T> {
  std::string_view op;
  Shape x_shape;
  Layout x_layout;
  ReshapeFn(std::string_view o, const Tensor<T>& x) : op(o), x_shape(x.shape()), x_layout(detail::grad_layout(x)) {}
  std::string_view name() const override { return op; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = detail::as_grad(cutrain::reshape(dy, x_shape), x_layout);
    return g;
  }
  void release_saved() override {}
};

// transpose and permute: dy permuted back.
template <class T>
struct PermuteFn final : Node<T> {
  std::string_view op;
  std::vector<int> inverse;
  Layout x_layout;
  PermuteFn(std::string_view o, std::vector<int> inv, const Tensor<T>& x)
      : op(o), inverse(std::move(inv)), x_layout(detail::grad_layout(x)) {}
  std::string_view name() const override { return op; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = detail::as_grad(cutrain::permute(dy, inverse), x_layout);
    return g;
  }
  void release_saved() override {}
};

// slice: zeros of x's shape with dy written where the slice took its elements.
template <class T>
struct SliceFn final : Node<T> {
  Shape x_shape;
  Layout x_layout;
  int dim;
  std::int64_t start, stop, step;
  SliceFn(const Tensor<T>& x, int d, std::int64_t b, std::int64_t e, std::int64_t s)
      : x_shape(x.shape()), x_layout(detail::grad_layout(x)), dim(d), start(b), stop(e), step(s) {}
  std::string_view name() const override { return "slice"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (!this->needs_grad(0)) return g;
    Tensor<T> dx = Tensor<T>::zeros(x_shape, {.layout = x_layout, .device = dy.device()});
    cutrain::slice(dx, dim, start, stop, step).copy_from(dy);
    g[0] = std::move(dx);
    return g;
  }
  void release_saved() override {}
};

// expand: dy summed over the broadcast dims.
template <class T>
struct ExpandFn final : Node<T> {
  Shape x_shape;
  Layout x_layout;
  explicit ExpandFn(const Tensor<T>& x) : x_shape(x.shape()), x_layout(detail::grad_layout(x)) {}
  std::string_view name() const override { return "expand"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = detail::as_grad(ops::sum_to(dy, x_shape), x_layout);
    return g;
  }
  void release_saved() override {}
};

namespace detail {
template <class T, class Fn, class... Args>
Var<T> record_view(const Var<T>& x, Tensor<T> y, Args&&... args) {
  if (!records({x.requires_grad()})) return Var<T>(std::move(y));
  return finish<T>(std::move(y), std::make_shared<Fn>(std::forward<Args>(args)...), {&x});
}

template <class T>
const Tensor<T>& value_of(std::string_view op, const Var<T>& x) {
  CUTRAIN_REQUIRE(x.defined(), InvalidArgument, op, "x is an undefined (default-constructed) Var");
  return x.value();
}
}  // namespace detail

template <class T>
Var<T> transpose(const Var<T>& x, int a, int b) {
  const Tensor<T>& v = detail::value_of("transpose", x);
  Tensor<T> y = cutrain::transpose(v, a, b);
  std::vector<int> inv(static_cast<std::size_t>(v.rank()));
  for (int i = 0; i < v.rank(); ++i) inv[static_cast<std::size_t>(i)] = i;
  const int ua = a < 0 ? a + v.rank() : a, ub = b < 0 ? b + v.rank() : b;
  std::swap(inv[static_cast<std::size_t>(ua)], inv[static_cast<std::size_t>(ub)]);
  return detail::record_view<T, PermuteFn<T>>(x, std::move(y), "transpose", std::move(inv), v);
}

template <class T>
Var<T> permute(const Var<T>& x, const std::vector<int>& dims) {
  const Tensor<T>& v = detail::value_of("permute", x);
  Tensor<T> y = cutrain::permute(v, dims);  // checks dims
  std::vector<int> inv(dims.size());
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const int d = dims[i] < 0 ? dims[i] + v.rank() : dims[i];
    inv[static_cast<std::size_t>(d)] = static_cast<int>(i);
  }
  return detail::record_view<T, PermuteFn<T>>(x, std::move(y), "permute", std::move(inv), v);
}

template <class T>
Var<T> view(const Var<T>& x, const Shape& shape) {
  const Tensor<T>& v = detail::value_of("view", x);
  return detail::record_view<T, ReshapeFn<T>>(x, cutrain::view(v, shape), "view", v);
}

template <class T>
Var<T> reshape(const Var<T>& x, const Shape& shape) {
  const Tensor<T>& v = detail::value_of("reshape", x);
  return detail::record_view<T, ReshapeFn<T>>(x, cutrain::reshape(v, shape), "reshape", v);
}

template <class T>
Var<T> contiguous(const Var<T>& x) {
  const Tensor<T>& v = detail::value_of("contiguous", x);
  return detail::record_view<T, ReshapeFn<T>>(x, cutrain::contiguous(v), "contiguous", v);
}

template <class T>
Var<T> squeeze(const Var<T>& x) {
  const Tensor<T>& v = detail::value_of("squeeze", x);
  return detail::record_view<T, ReshapeFn<T>>(x, cutrain::squeeze(v), "squeeze", v);
}

template <class T>
Var<T> squeeze(const Var<T>& x, int dim) {
  const Tensor<T>& v = detail::value_of("squeeze", x);
  return detail::record_view<T, ReshapeFn<T>>(x, cutrain::squeeze(v, dim), "squeeze", v);
}

template <class T>
Var<T> unsqueeze(const Var<T>& x, int dim) {
  const Tensor<T>& v = detail::value_of("unsqueeze", x);
  return detail::record_view<T, ReshapeFn<T>>(x, cutrain::unsqueeze(v, dim), "unsqueeze", v);
}

template <class T>
Var<T> slice(const Var<T>& x, int dim, std::int64_t start, std::int64_t stop = slice_end, std::int64_t step = 1) {
  const Tensor<T>& v = detail::value_of("slice", x);
  Tensor<T> y = cutrain::slice(v, dim, start, stop, step);  // checks dim and step
  const int d = dim < 0 ? dim + v.rank() : dim;
  return detail::record_view<T, SliceFn<T>>(x, std::move(y), v, d, start, stop, step);
}

// x reversed along each of dims (a view: reversed slices).
template <class T>
Var<T> flip(const Var<T>& x, const std::vector<int>& dims) {
  Var<T> out = x;
  for (int d : dims) out = slice(out, d, -1, slice_end, -1);
  return out;
}

template <class T>
Var<T> expand(const Var<T>& x, const Shape& shape) {
  const Tensor<T>& v = detail::value_of("expand", x);
  return detail::record_view<T, ExpandFn<T>>(x, cutrain::expand(v, shape), v);
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
