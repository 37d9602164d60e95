// Differentiable softmax and log_softmax on Var<T> along any axis (ops/softmax.hpp). The node
// saves the output y: both backwards need only y and dy.
#pragma once

#include "cutrain/core/abi.hpp"

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/softmax.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

template <class T>
struct SoftmaxFn final : Node<T> {
  int axis = -1;
  bool log = false;
  Tensor<T> y;
  std::string_view name() const override { return log ? "log_softmax" : "softmax"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = log ? ops::log_softmax_backward(y, dy, axis) : ops::softmax_backward(y, dy, axis);
    return g;
  }
  void release_saved() override { y = {}; }
};

namespace detail {
template <class T>
Var<T> softmax_var(std::string_view op, const Var<T>& x, int axis, bool log) {
  require_defined(op, {{x.defined(), "x"}});
  auto fn = std::make_shared<SoftmaxFn<T>>();
  fn->axis = axis;
  fn->log = log;
  Tensor<T> y = log ? ops::log_softmax_forward(x.value(), axis) : ops::softmax_forward(x.value(), axis);
  fn->save(fn->y, y, "y");
  return finish<T>(std::move(y), fn, {&x});
}
}  // namespace detail

// softmax(x) along axis (negative counts from the end; default the last).
template <class T>
Var<T> softmax(const Var<T>& x, int axis = -1) {
  return detail::softmax_var("autograd::softmax", x, axis, false);
}

// log_softmax(x) along axis.
template <class T>
Var<T> log_softmax(const Var<T>& x, int axis = -1) {
  return detail::softmax_var("autograd::log_softmax", x, axis, true);
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
