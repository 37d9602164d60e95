// Differentiable reductions on Var<T> over any set of axes, with keepdim: sum, mean, max, min,
// var, norm (ops/reduce.hpp; argmax and argmin have no gradient: call ops:: on value()). Each
// node saves what its backward needs: nothing but the shape (sum, mean), the indices of the
// chosen elements (max, min: the gradient goes to that one element of equal maxima), x (var),
// x and y (norm).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/reduce.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

namespace detail {
// What every reduction node keeps: the input's shape, the axes and keepdim.
struct ReduceGeometry {
  Shape x_shape;
  Axes axes;
  bool keepdim = false;
};
}  // namespace detail

template <class T>
struct SumFn final : Node<T> {
  detail::ReduceGeometry g;
  bool mean = false;
  std::string_view name() const override { return mean ? "mean" : "sum"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> grads(1);
    if (this->needs_grad(0))
      grads[0] = mean ? ops::mean_backward(dy, g.x_shape, g.axes, g.keepdim) : ops::sum_backward(dy, g.x_shape, g.axes, g.keepdim);
    return grads;
  }
  void release_saved() override {}
};

template <class T>
Var<T> sum(const Var<T>& x, const Axes& axes = {}, bool keepdim = false) {
  auto fn = std::make_shared<SumFn<T>>();
  Tensor<T> y = ops::sum(x.value(), axes, keepdim);
  fn->g = {x.shape(), axes, keepdim};
  return detail::finish<T>(std::move(y), fn, {&x});
}

template <class T>
Var<T> mean(const Var<T>& x, const Axes& axes = {}, bool keepdim = false) {
  auto fn = std::make_shared<SumFn<T>>();
  Tensor<T> y = ops::mean(x.value(), axes, keepdim);
  fn->g = {x.shape(), axes, keepdim};
  fn->mean = true;
  return detail::finish<T>(std::move(y), fn, {&x});
}

template <class T>
struct ArgReduceFn final : Node<T> {
  detail::ReduceGeometry g;
  bool is_max = true;
  Tensor<std::int32_t> indices;
  std::string_view name() const override { return is_max ? "max" : "min"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> grads(1);
    if (this->needs_grad(0))
      grads[0] = is_max ? ops::max_backward(dy, indices, g.x_shape, g.axes, g.keepdim)
                        : ops::min_backward(dy, indices, g.x_shape, g.axes, g.keepdim);
    return grads;
  }
  void release_saved() override { indices = {}; }
};

namespace detail {
template <class T>
Var<T> arg_reduce(const Var<T>& x, const Axes& axes, bool keepdim, bool is_max) {
  auto fn = std::make_shared<ArgReduceFn<T>>();
  ArgReduce<T> r = is_max ? ops::max_with_indices(x.value(), axes, keepdim) : ops::min_with_indices(x.value(), axes, keepdim);
  fn->g = {x.shape(), axes, keepdim};
  fn->is_max = is_max;
  fn->indices = std::move(r.indices);
  return finish<T>(std::move(r.values), fn, {&x});
}
}  // namespace detail

// The max over axes; the gradient goes to the element ops::argmax names (the first of equal maxima).
template <class T>
Var<T> max(const Var<T>& x, const Axes& axes = {}, bool keepdim = false) {
  return detail::arg_reduce(x, axes, keepdim, true);
}

template <class T>
Var<T> min(const Var<T>& x, const Axes& axes = {}, bool keepdim = false) {
  return detail::arg_reduce(x, axes, keepdim, false);
}

template <class T>
struct VarFn final : Node<T> {
  detail::ReduceGeometry g;
  double correction = 1.0;
  Tensor<T> x;
  std::string_view name() const override { return "var"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> grads(1);
    if (this->needs_grad(0)) grads[0] = ops::var_backward(x, dy, g.axes, correction, g.keepdim);
    return grads;
  }
  void release_saved() override { x = {}; }
};

template <class T>
Var<T> var(const Var<T>& x, const Axes& axes = {}, double correction = 1.0, bool keepdim = false) {
  auto fn = std::make_shared<VarFn<T>>();
  Tensor<T> y = ops::var(x.value(), axes, correction, keepdim);
  fn->g = {x.shape(), axes, keepdim};
  fn->correction = correction;
  fn->x = x.value().view();
  return detail::finish<T>(std::move(y), fn, {&x});
}

template <class T>
struct NormFn final : Node<T> {
  detail::ReduceGeometry g;
  double p = 2.0;
  Tensor<T> x, y;
  std::string_view name() const override { return "norm"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> grads(1);
    if (this->needs_grad(0)) grads[0] = ops::norm_backward(x, y, dy, p, g.axes, g.keepdim);
    return grads;
  }
  void release_saved() override { x = {}; y = {}; }
};

template <class T>
Var<T> norm(const Var<T>& x, double p = 2.0, const Axes& axes = {}, bool keepdim = false) {
  auto fn = std::make_shared<NormFn<T>>();
  Tensor<T> y = ops::norm(x.value(), p, axes, keepdim);
  fn->g = {x.shape(), axes, keepdim};
  fn->p = p;
  fn->x = x.value().view();
  fn->y = y.view();
  return detail::finish<T>(std::move(y), fn, {&x});
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
