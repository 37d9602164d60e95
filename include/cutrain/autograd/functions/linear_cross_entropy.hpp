// autograd::linear_cross_entropy: the fused classifier (ops/linear_cross_entropy.hpp) as one
// differentiable op. The forward computes the loss and, when a gradient is wanted, dx and dw too
// (the logits' gradient exists only a chunk at a time, written over the logits); backward scales
// them by the upstream gradient. x may be a bf16/f16 activation under an f32 weight (a mixed-
// precision model's tied embedding): the matmuls read the weight's kept bf16/f16 copy
// (autograd::cast), and the weight's gradient comes back in f32 without a cast.
#pragma once

#include "cutrain/core/abi.hpp"

#include <concepts>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/elementwise.hpp"
#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/cast.hpp"
#include "cutrain/ops/linear_cross_entropy.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

// The graph holds Var<L>, the loss's type; x (in X) and w (in W) are listed as the node's inputs
// where their type is L, else sent their gradients by backward itself (detail::send_gradient).
template <class X, class W>
struct LinearCrossEntropyFn final : Node<loss_float_t<X>> {
  using L = loss_float_t<X>;
  std::shared_ptr<detail::VarImpl<X>> x_other;
  std::shared_ptr<detail::VarImpl<W>> w_other;
  Tensor<X> dx;
  Tensor<L> dw;
  std::string_view name() const override { return "linear_cross_entropy"; }
  std::vector<Tensor<L>> backward(const Tensor<L>& dy) override {
    Tensor<X> gx = dx.view();
    Tensor<L> gw = dw.view();
    ops::linear_cross_entropy_scale_grads<X>(dy, gx, gw);
    std::vector<Tensor<L>> g(2);
    if constexpr (std::same_as<X, L>) g[0] = std::move(gx);
    else detail::send_gradient(x_other, std::move(gx));
    if constexpr (std::same_as<W, L>) g[1] = std::move(gw);
    else detail::send_gradient(w_other, ops::cast<W>(gw));
    return g;
  }
  void release_saved() override {
    dx = {};
    dw = {};
    x_other.reset();
    w_other.reset();
  }
};

// Softmax cross-entropy of the logits x w^T against labels, the logits never held whole: the
// classifier of a language model (x [N, C] the last hidden states, w [V, C] the output
// embedding, labels [N] the next tokens, int32 or int64 on x's device, each in [0, V) or
// p.ignore_index; int64 ones are converted to int32 once, here).
// Returns the loss (shape {}) in f32, f64 for f64 x. w is in x's type, or in f32 under a bf16 or
// f16 x. On the GPU the logits' rows are padded for the matmuls (p.pad_to); the vocabulary seen
// is exactly V.
template <class X, class W>
Var<loss_float_t<X>> linear_cross_entropy(const Var<X>& x, const Var<W>& w, const Tensor<std::int32_t>& labels,
                                          const LinearCrossEntropyParams& p = {}) {
  using L = loss_float_t<X>;
  static_assert(std::same_as<W, X> || (std::same_as<W, float> && (std::same_as<X, bfloat16> || std::same_as<X, half>)),
                "linear_cross_entropy: w is in x's type, or in f32 under a bf16/f16 x");
  detail::require_defined("autograd::linear_cross_entropy", {{x.defined(), "x"}, {w.defined(), "w"}});
  const bool grads = detail::records({x.requires_grad(), w.requires_grad()});
  Tensor<X> wx;
  if constexpr (std::same_as<W, X>) {
    wx = w.value().view();
  } else {
    NoGradGuard no_record;  // the kept cast only; the gradient goes to w directly
    wx = cast<X>(w).value().view();
  }
  LinearCrossEntropyResult<X> r = ops::linear_cross_entropy(x.value(), wx, labels, p, grads);
  if (!grads) return Var<L>(std::move(r.loss));
  auto fn = std::make_shared<LinearCrossEntropyFn<X, W>>();
  fn->dx = std::move(r.dx);
  fn->dw = std::move(r.dw);
  const Var<L>* xs = nullptr;
  const Var<L>* ws = nullptr;
  if constexpr (std::same_as<X, L>) xs = &x;
  else fn->x_other = x.impl();
  if constexpr (std::same_as<W, L>) ws = &w;
  else fn->w_other = w.impl();
  const bool others = (!std::same_as<X, L> && x.requires_grad()) || (!std::same_as<W, L> && w.requires_grad());
  return detail::finish<L>(std::move(r.loss), fn, {xs, ws}, others);
}
template <class X, class W>
Var<loss_float_t<X>> linear_cross_entropy(const Var<X>& x, const Var<W>& w, const Tensor<std::int64_t>& labels,
                                          const LinearCrossEntropyParams& p = {}) {
  return linear_cross_entropy(x, w, ops::detail::labels_as_i32("linear_cross_entropy", labels, p.ignore_index), p);
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
