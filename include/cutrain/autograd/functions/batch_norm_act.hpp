// autograd::batch_norm_act: y = act(batch_norm(x) + residual), act relu or identity, the residual
// optional: a residual block's tail (or a batch norm + ReLU) as one differentiable op. In training
// its forward and backward are one op each (ops::batch_norm_act_*: one cuDNN graph each on the GPU
// where cuDNN has an engine), so that no separate pass adds the residual, applies the ReLU or
// takes its derivative; it saves x and y, as batch norm and the ReLU saved them apart. In eval mode
// it is the composition of batch_norm, add and activation.
#pragma once

#include "cutrain/core/abi.hpp"

#include <concepts>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/elementwise.hpp"
#include "cutrain/autograd/functions/norm_activation.hpp"
#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/batch_norm.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

// Inputs: x, gamma and beta (when S == T; else they are sent their gradients directly, as in
// BatchNormTrainingFn), then the residual (a null input when there is none).
template <class T, class S = T>
struct BatchNormActTrainingFn final : Node<T> {
  static constexpr std::size_t residual_slot = std::same_as<T, S> ? 3 : 1;
  BatchNormParams p;
  ActivationParams act;
  Tensor<T> x, y;
  Tensor<S> gamma, save_mean, save_inv_std;
  std::shared_ptr<detail::VarImpl<S>> gamma_in, beta_in;  // S != T only
  BatchNormActTrainingFn(const BatchNormParams& params, const ActivationParams& a) : p(params), act(a) {}
  std::string_view name() const override { return "batch_norm_act (training)"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<S>& gamma_, const Tensor<S>& beta_, Tensor<S>& running_mean,
                    Tensor<S>& running_var, const Tensor<T>& residual) {
    BatchNormForward<T, S> r =
        ops::batch_norm_act_forward_training(x_, gamma_, beta_, running_mean, running_var, p, act, residual);
    this->save(x, x_, "x");
    this->save(y, r.y, "y (the output)");
    this->save(gamma, gamma_, "gamma");
    save_mean = std::move(r.save_mean);
    save_inv_std = std::move(r.save_inv_std);
    return std::move(r.y);
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    BatchNormActBackward<T, S> r = ops::batch_norm_act_backward(x, y, dy, gamma, save_mean, save_inv_std, act,
                                                                this->needs_grad(residual_slot));
    std::vector<Tensor<T>> g(residual_slot + 1);
    if (this->needs_grad(0)) g[0] = std::move(r.dx);
    if constexpr (std::same_as<T, S>) {
      if (this->needs_grad(1)) g[1] = std::move(r.dgamma);
      if (this->needs_grad(2)) g[2] = std::move(r.dbeta);
    } else {
      detail::send_gradient(gamma_in, std::move(r.dgamma));
      detail::send_gradient(beta_in, std::move(r.dbeta));
    }
    g[residual_slot] = std::move(r.dresidual);  // undefined unless it needs one
    return g;
  }
  void release_saved() override {
    x = {};
    y = {};
    gamma = {};
    save_mean = {};
    save_inv_std = {};
    gamma_in.reset();
    beta_in.reset();
  }
};

// act(batch_norm(x) + residual) over x [N,C] or [N,C,H,W]; residual undefined (none) or of x's
// shape; act relu or identity. Training normalizes with the batch statistics and updates
// running_mean / running_var in place; eval uses them. Parameters and statistics in S, as
// autograd::batch_norm takes them.
template <class T, class S>
Var<T> batch_norm_act(const Var<T>& x, const Var<S>& gamma, const Var<S>& beta, Tensor<S>& running_mean,
                      Tensor<S>& running_var, bool training, const BatchNormParams& p, const ActivationParams& act,
                      const Var<T>& residual = {}) {
  constexpr std::string_view op = "autograd::batch_norm_act";
  detail::require_defined(op, {{x.defined(), "x"}, {gamma.defined(), "gamma"}, {beta.defined(), "beta"}});
  detail::require_grad_safe_activation(op, act);
  const Var<T>* r = residual.defined() ? &residual : nullptr;
  if (!training) {
    Var<T> y = batch_norm(x, gamma, beta, running_mean, running_var, false, p);
    if (r) y = add(y, residual);
    return act.kind == Activation::identity ? y : activation(y, act);
  }
  const bool record = detail::records({x.requires_grad(), gamma.requires_grad(), beta.requires_grad(),
                                       r && r->requires_grad()});
  auto fn = std::make_shared<BatchNormActTrainingFn<T, S>>(p, act);
  const Tensor<T> none;
  Tensor<T> y = fn->forward(x.value(), gamma.value(), beta.value(), running_mean, running_var, r ? r->value() : none);
  if constexpr (std::same_as<T, S>) {
    return detail::finish<T>(std::move(y), fn, {&x, &gamma, &beta, r});
  } else {
    if (!record) return Var<T>(std::move(y));
    fn->gamma_in = gamma.impl();
    fn->beta_in = beta.impl();
    return detail::finish<T>(std::move(y), fn, {&x, r}, /*others_require_grad=*/true);
  }
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
