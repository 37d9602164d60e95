// Differentiable activations and normalization on Var<T>: activation with its named forms (relu,
// leaky_relu, elu, sigmoid, tanh, gelu, silu), batch_norm in training and eval mode (parameters
// and statistics in T, or in f32 under a bf16/f16 x on the GPU), layer_norm and rms_norm. Each is a Node
// whose backward calls the op's own backward in ops/, except batch norm's eval mode (on the host).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <concepts>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/batch_norm.hpp"
#include "cutrain/ops/layer_norm.hpp"
#include "cutrain/ops/rms_norm.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

// ---- activations -------------------------------------------------------------------------

template <class T>
struct ActivationFn final : Node<T> {
  ActivationParams a;
  Tensor<T> x;
  explicit ActivationFn(const ActivationParams& params) : a(params) {}
  std::string_view name() const override { return to_string(a.kind); }
  Tensor<T> forward(const Tensor<T>& x_) {
    Tensor<T> y = ops::activation_forward(x_, a);
    this->save(x, x_, "x");
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = ops::activation_backward(x, dy, a);
    return g;
  }
  void release_saved() override { x = {}; }
};

template <class T>
Var<T> activation(const Var<T>& x, const ActivationParams& a) {
  detail::require_defined("autograd::activation", {{x.defined(), "x"}});
  auto fn = std::make_shared<ActivationFn<T>>(a);
  Tensor<T> y = fn->forward(x.value());
  return detail::finish<T>(std::move(y), fn, {&x});
}
template <class T> Var<T> relu(const Var<T>& x) { return activation(x, {.kind = Activation::relu}); }
template <class T> Var<T> leaky_relu(const Var<T>& x, double slope = 0.01) {
  return activation(x, {.kind = Activation::leaky_relu, .alpha = slope});
}
template <class T> Var<T> elu(const Var<T>& x, double alpha = 1.0) {
  return activation(x, {.kind = Activation::elu, .alpha = alpha});
}
template <class T> Var<T> sigmoid(const Var<T>& x) { return activation(x, {.kind = Activation::sigmoid}); }
template <class T> Var<T> tanh(const Var<T>& x) { return activation(x, {.kind = Activation::tanh}); }
template <class T> Var<T> gelu(const Var<T>& x, bool tanh_approximation = false) {
  return activation(x, {.kind = tanh_approximation ? Activation::gelu_tanh : Activation::gelu_erf});
}
template <class T> Var<T> silu(const Var<T>& x) { return activation(x, {.kind = Activation::silu}); }

// ---- normalization -----------------------------------------------------------------------

// S, the parameters' and statistics' type, is T, or f32 under a bf16/f16 x on the GPU; then
// gamma and beta are sent their gradients directly (detail::send_gradient), as a Node<T> cannot
// list a Var<S> among its inputs.
template <class T, class S = T>
struct BatchNormTrainingFn final : Node<T> {
  BatchNormParams p;
  Tensor<T> x;
  Tensor<S> gamma, save_mean, save_inv_std;
  std::shared_ptr<detail::VarImpl<S>> gamma_in, beta_in;  // S != T only
  explicit BatchNormTrainingFn(const BatchNormParams& params) : p(params) {}
  std::string_view name() const override { return "batch_norm (training)"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<S>& gamma_, const Tensor<S>& beta_, Tensor<S>& running_mean,
                    Tensor<S>& running_var) {
    BatchNormForward<T, S> r = ops::batch_norm_forward_training(x_, gamma_, beta_, running_mean, running_var, p);
    this->save(x, x_, "x");
    this->save(gamma, gamma_, "gamma");
    save_mean = std::move(r.save_mean);
    save_inv_std = std::move(r.save_inv_std);
    return std::move(r.y);
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    NormBackward<T, S> r = ops::batch_norm_backward(x, dy, gamma, save_mean, save_inv_std);
    if constexpr (std::same_as<T, S>) {
      std::vector<Tensor<T>> g(3);
      if (this->needs_grad(0)) g[0] = std::move(r.dx);
      if (this->needs_grad(1)) g[1] = std::move(r.dgamma);
      if (this->needs_grad(2)) g[2] = std::move(r.dbeta);
      return g;
    } else {
      detail::send_gradient(gamma_in, std::move(r.dgamma));
      detail::send_gradient(beta_in, std::move(r.dbeta));
      std::vector<Tensor<T>> g(1);
      if (this->needs_grad(0)) g[0] = std::move(r.dx);
      return g;
    }
  }
  void release_saved() override {
    x = {};
    gamma = {};
    save_mean = {};
    save_inv_std = {};
    gamma_in.reset();
    beta_in.reset();
  }
};

// Eval mode is an affine map per channel, y = (x - mean) * gamma / sqrt(var + eps) + beta, with
// the running statistics as constants. No op computes its backward, so it runs here on the host
// (copying to and from the device); evaluation normally runs under NoGradGuard and never gets here.
template <class T>
struct BatchNormEvalFn final : Node<T> {
  double eps;
  Tensor<T> x, gamma, mean, var;
  explicit BatchNormEvalFn(double e) : eps(e) {}
  std::string_view name() const override { return "batch_norm (eval)"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<T>& gamma_, const Tensor<T>& beta_,
                    const Tensor<T>& running_mean, const Tensor<T>& running_var) {
    Tensor<T> y = ops::batch_norm_forward_inference(x_, gamma_, beta_, running_mean, running_var, eps);
    this->save(x, x_, "x");
    this->save(gamma, gamma_, "gamma");
    mean = running_mean.clone();  // the module may load new statistics before backward
    var = running_var.clone();
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    const std::int64_t C = x.dim(1), inner = x.numel() / (x.dim(0) * C);
    const auto xv = x.to_vector(), dyv = dy.to_vector(), gv = gamma.to_vector(), mv = mean.to_vector(),
               vv = var.to_vector();
    std::vector<T> dx(xv.size()), dg(static_cast<std::size_t>(C), T(0)), db(static_cast<std::size_t>(C), T(0));
    for (std::size_t i = 0; i < xv.size(); ++i) {
      const auto c = static_cast<std::size_t>((static_cast<std::int64_t>(i) / inner) % C);
      const T inv_std = T(1) / std::sqrt(vv[c] + static_cast<T>(eps));
      dx[i] = dyv[i] * gv[c] * inv_std;
      dg[c] += dyv[i] * (xv[i] - mv[c]) * inv_std;
      db[c] += dyv[i];
    }
    const Device dev = x.device();
    const Layout l = x.layout() == Layout::nhwc ? Layout::nhwc : Layout::row_major;
    std::vector<Tensor<T>> g(3);
    if (this->needs_grad(0)) g[0] = Tensor<T>::from_vector(dx, x.shape(), {.layout = l, .device = dev});
    if (this->needs_grad(1)) g[1] = Tensor<T>::from_vector(dg, gamma.shape(), {.device = dev});
    if (this->needs_grad(2)) g[2] = Tensor<T>::from_vector(db, gamma.shape(), {.device = dev});
    return g;
  }
  void release_saved() override { x = {}; gamma = {}; mean = {}; var = {}; }
};

// Batch norm over x [N,C] or [N,C,H,W]. Training: normalizes with the batch statistics and
// updates running_mean / running_var in place; eval: uses them. Parameters and statistics in
// S: x's type, or f32 under a bf16/f16 x on the GPU (mixed precision).
template <class T, class S>
Var<T> batch_norm(const Var<T>& x, const Var<S>& gamma, const Var<S>& beta, Tensor<S>& running_mean,
                  Tensor<S>& running_var, bool training, const BatchNormParams& p = {}) {
  detail::require_defined("autograd::batch_norm",
                          {{x.defined(), "x"}, {gamma.defined(), "gamma"}, {beta.defined(), "beta"}});
  const bool record = detail::records({x.requires_grad(), gamma.requires_grad(), beta.requires_grad()});
  if (training) {
    auto fn = std::make_shared<BatchNormTrainingFn<T, S>>(p);
    Tensor<T> y = fn->forward(x.value(), gamma.value(), beta.value(), running_mean, running_var);
    if constexpr (std::same_as<T, S>) {
      return detail::finish<T>(std::move(y), fn, {&x, &gamma, &beta});
    } else {
      if (!record) return Var<T>(std::move(y));
      fn->gamma_in = gamma.impl();
      fn->beta_in = beta.impl();
      return detail::finish<T>(std::move(y), fn, {&x}, /*others_require_grad=*/true);
    }
  }
  if (!record)
    return Var<T>(ops::batch_norm_forward_inference(x.value(), gamma.value(), beta.value(), running_mean,
                                                    running_var, p.eps));
  if constexpr (std::same_as<T, S>) {
    auto fn = std::make_shared<BatchNormEvalFn<T>>(p.eps);
    Tensor<T> y = fn->forward(x.value(), gamma.value(), beta.value(), running_mean, running_var);
    return detail::finish<T>(std::move(y), fn, {&x, &gamma, &beta});
  } else {
    throw NotImplemented("batch_norm (eval)",
                         cutrain::detail::cat("no backward for x in ", dtype_of<T>, " with parameters in ", dtype_of<S>,
                                              " in eval mode; evaluate under NoGradGuard"));
  }
}

// S as in batch norm: T, or f32 under a bf16/f16 x on the GPU (gamma and beta then get their
// gradients sent directly).
template <class T, class S = T>
struct LayerNormFn final : Node<T> {
  double eps;
  Tensor<T> x;
  Tensor<S> gamma, mean, inv_std;
  std::shared_ptr<detail::VarImpl<S>> gamma_in, beta_in;  // S != T only
  explicit LayerNormFn(double e) : eps(e) {}
  std::string_view name() const override { return "layer_norm"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<S>& gamma_, const Tensor<S>& beta_) {
    LayerNormForward<T, S> r = ops::layer_norm_forward(x_, gamma_, beta_, eps);
    this->save(x, x_, "x");
    this->save(gamma, gamma_, "gamma");
    mean = std::move(r.mean);
    inv_std = std::move(r.inv_std);
    return std::move(r.y);
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    NormBackward<T, S> r = ops::layer_norm_backward(x, dy, gamma, mean, inv_std);
    if constexpr (std::same_as<T, S>) {
      std::vector<Tensor<T>> g(3);
      if (this->needs_grad(0)) g[0] = std::move(r.dx);
      if (this->needs_grad(1)) g[1] = std::move(r.dgamma);
      if (this->needs_grad(2)) g[2] = std::move(r.dbeta);
      return g;
    } else {
      detail::send_gradient(gamma_in, std::move(r.dgamma));
      detail::send_gradient(beta_in, std::move(r.dbeta));
      std::vector<Tensor<T>> g(1);
      if (this->needs_grad(0)) g[0] = std::move(r.dx);
      return g;
    }
  }
  void release_saved() override {
    x = {};
    gamma = {};
    mean = {};
    inv_std = {};
    gamma_in.reset();
    beta_in.reset();
  }
};

// Normalizes x over its trailing dims, gamma's shape (1 to x.rank() of them; all after the first for
// x [N, ...] and gamma [...]), per element of the leading dims; beta has gamma's shape. gamma and
// beta in S: x's type, or f32 under a bf16/f16 x on the GPU (mixed precision).
template <class T, class S>
Var<T> layer_norm(const Var<T>& x, const Var<S>& gamma, const Var<S>& beta, double eps = 1e-5) {
  detail::require_defined("autograd::layer_norm",
                          {{x.defined(), "x"}, {gamma.defined(), "gamma"}, {beta.defined(), "beta"}});
  auto fn = std::make_shared<LayerNormFn<T, S>>(eps);
  Tensor<T> y = fn->forward(x.value(), gamma.value(), beta.value());
  if constexpr (std::same_as<T, S>) {
    return detail::finish<T>(std::move(y), fn, {&x, &gamma, &beta});
  } else {
    if (!detail::records({x.requires_grad(), gamma.requires_grad(), beta.requires_grad()})) return Var<T>(std::move(y));
    fn->gamma_in = gamma.impl();
    fn->beta_in = beta.impl();
    return detail::finish<T>(std::move(y), fn, {&x}, /*others_require_grad=*/true);
  }
}

// S as in layer norm: T, or f32 under a bf16/f16 x on the GPU.
template <class T, class S = T>
struct RmsNormFn final : Node<T> {
  double eps;
  Tensor<T> x;
  Tensor<S> gamma, inv_rms;
  std::shared_ptr<detail::VarImpl<S>> gamma_in;  // S != T only
  explicit RmsNormFn(double e) : eps(e) {}
  std::string_view name() const override { return "rms_norm"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<S>& gamma_) {
    RmsNormForward<T, S> r = ops::rms_norm_forward(x_, gamma_, eps);
    this->save(x, x_, "x");
    this->save(gamma, gamma_, "gamma");
    inv_rms = std::move(r.inv_rms);
    return std::move(r.y);
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    RmsNormBackward<T, S> r = ops::rms_norm_backward(x, dy, gamma, inv_rms);
    if constexpr (std::same_as<T, S>) {
      std::vector<Tensor<T>> g(2);
      if (this->needs_grad(0)) g[0] = std::move(r.dx);
      if (this->needs_grad(1)) g[1] = std::move(r.dgamma);
      return g;
    } else {
      detail::send_gradient(gamma_in, std::move(r.dgamma));
      std::vector<Tensor<T>> g(1);
      if (this->needs_grad(0)) g[0] = std::move(r.dx);
      return g;
    }
  }
  void release_saved() override {
    x = {};
    gamma = {};
    inv_rms = {};
    gamma_in.reset();
  }
};

// RMS-normalizes x over its trailing dims, gamma's shape (1 to x.rank() of them), per element of
// the leading dims: y = gamma * x / sqrt(mean(x^2) + eps). No bias. gamma in S: x's type, or f32
// under a bf16/f16 x on the GPU (mixed precision).
template <class T, class S>
Var<T> rms_norm(const Var<T>& x, const Var<S>& gamma, double eps = 1e-5) {
  detail::require_defined("autograd::rms_norm", {{x.defined(), "x"}, {gamma.defined(), "gamma"}});
  auto fn = std::make_shared<RmsNormFn<T, S>>(eps);
  Tensor<T> y = fn->forward(x.value(), gamma.value());
  if constexpr (std::same_as<T, S>) {
    return detail::finish<T>(std::move(y), fn, {&x, &gamma});
  } else {
    if (!detail::records({x.requires_grad(), gamma.requires_grad()})) return Var<T>(std::move(y));
    fn->gamma_in = gamma.impl();
    return detail::finish<T>(std::move(y), fn, {&x}, /*others_require_grad=*/true);
  }
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
