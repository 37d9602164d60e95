// Differentiable transposed convolution on Var<T>: conv_transpose2d (with an optional bias), a
// Node whose backward calls the op's own backward in ops/.
#pragma once

#include "cutrain/core/abi.hpp"

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/conv_transpose2d.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

template <class T>
struct ConvTranspose2dFn final : Node<T> {
  ConvTranspose2dParams p;
  Tensor<T> x, w;
  bool has_bias = false;
  explicit ConvTranspose2dFn(const ConvTranspose2dParams& params) : p(params) {}
  std::string_view name() const override { return "conv_transpose2d"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<T>& w_, const Tensor<T>& b_) {
    Tensor<T> y = ops::conv_transpose2d_forward(x_, w_, b_, p);
    this->save(x, x_, "x");
    this->save(w, w_, "w");
    has_bias = b_.defined();
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(3);
    if (this->needs_grad(0)) g[0] = ops::conv_transpose2d_backward_data(dy, w, x.shape(), p);
    if (this->needs_grad(1)) g[1] = ops::conv_transpose2d_backward_filter(dy, x, w.shape(), p);
    if (has_bias && this->needs_grad(2)) g[2] = ops::conv2d_backward_bias(dy);
    return g;
  }
  void release_saved() override { x = {}; w = {}; }
};

// y = conv_transpose(x, w) + b: x [N, Cin, H, W], w [Cin, Cout/groups, R, S], b [Cout] or an
// undefined Var (no bias).
template <class T>
Var<T> conv_transpose2d(const Var<T>& x, const Var<T>& w, const Var<T>& b, const ConvTranspose2dParams& p) {
  detail::require_defined("autograd::conv_transpose2d", {{x.defined(), "x"}, {w.defined(), "w"}});
  auto fn = std::make_shared<ConvTranspose2dFn<T>>(p);
  Tensor<T> y = fn->forward(x.value(), w.value(), b.defined() ? b.value().view() : Tensor<T>{});
  return detail::finish<T>(std::move(y), fn, {&x, &w, &b});
}
template <class T>
Var<T> conv_transpose2d(const Var<T>& x, const Var<T>& w, const ConvTranspose2dParams& p) {
  return conv_transpose2d(x, w, Var<T>{}, p);
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
