// Differentiable ops on Var<T>. Each op is a function object (a Node) whose forward calls the
// ops/ layer and saves what its backward needs (views, never copies, of the tensors involved);
// backward calls the op's own backward and computes only the gradients its inputs need.
// With no input requiring grad (or under NoGradGuard) no node is recorded.
#pragma once

#include <cmath>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/batch_norm.hpp"
#include "cutrain/ops/cast.hpp"
#include "cutrain/ops/conv2d.hpp"
#include "cutrain/ops/cross_entropy.hpp"
#include "cutrain/ops/dropout.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/flatten.hpp"
#include "cutrain/ops/layer_norm.hpp"
#include "cutrain/ops/linear.hpp"
#include "cutrain/ops/pool2d.hpp"

namespace cutrain::autograd {

namespace detail {
inline bool records(std::initializer_list<bool> requires_grad) {
  if (!is_grad_enabled()) return false;
  for (bool r : requires_grad)
    if (r) return true;
  return false;
}

// Wraps y as the output of fn when any input requires grad (and grad mode is on), else as a
// leaf that needs none; fn and what it saved are then dropped.
// others_require_grad: an input of another type, which fn sends its gradient itself, does.
template <class T>
Var<T> finish(Tensor<T> y, std::shared_ptr<Node<T>> fn, std::initializer_list<const Var<T>*> inputs,
              bool others_require_grad = false) {
  bool any = others_require_grad;
  for (const Var<T>* v : inputs) any = any || (v && v->requires_grad());
  if (!any || !is_grad_enabled()) return Var<T>(std::move(y));
  for (const Var<T>* v : inputs) fn->inputs.push_back(v && v->defined() ? v->impl() : nullptr);
  return Var<T>::from_node(std::move(y), std::move(fn));
}

inline void require_grad_safe_activation(std::string_view op, const ActivationParams& a) {
  CUTRAIN_REQUIRE(a.kind == Activation::relu || a.kind == Activation::identity, NotImplemented, op,
                  "the fused op keeps only its output, from which only relu's and identity's derivative can be "
                  "recovered; got ", a.kind, " (use the op and activation() separately)");
}
}  // namespace detail

// ---- convolution -------------------------------------------------------------------------

template <class T>
struct Conv2dFn final : Node<T> {
  Conv2dParams p;
  Tensor<T> x, w;
  bool has_bias = false;
  explicit Conv2dFn(const Conv2dParams& params) : p(params) {}
  std::string_view name() const override { return "conv2d"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<T>& w_, const Tensor<T>& b_) {
    Tensor<T> y = ops::conv2d_forward(x_, w_, b_, p);
    x = x_.view();
    w = w_.view();
    has_bias = b_.defined();
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(3);
    if (this->needs_grad(0)) g[0] = ops::conv2d_backward_data(dy, w, x.shape(), p);
    if (this->needs_grad(1)) g[1] = ops::conv2d_backward_filter(dy, x, w.shape(), p);
    if (has_bias && this->needs_grad(2)) g[2] = ops::conv2d_backward_bias(dy);
    return g;
  }
  void release_saved() override { x = {}; w = {}; }
};

// y = conv(x, w) + b; b may be an undefined Var (no bias).
template <class T>
Var<T> conv2d(const Var<T>& x, const Var<T>& w, const Var<T>& b, const Conv2dParams& p) {
  auto fn = std::make_shared<Conv2dFn<T>>(p);
  Tensor<T> y = fn->forward(x.value(), w.value(), b.defined() ? b.value().view() : Tensor<T>{});
  return detail::finish<T>(std::move(y), fn, {&x, &w, &b});
}
template <class T>
Var<T> conv2d(const Var<T>& x, const Var<T>& w, const Conv2dParams& p) {
  return conv2d(x, w, Var<T>{}, p);
}

// act(conv(x, w) + b) as one op (cuDNN's fused epilogue on the GPU). Only relu and identity:
// backward recovers the activation's derivative from the output.
template <class T>
struct Conv2dActivationFn final : Node<T> {
  Conv2dParams p;
  ActivationParams act;
  Tensor<T> x, w, y;
  bool has_bias = false;
  Conv2dActivationFn(const Conv2dParams& params, const ActivationParams& a) : p(params), act(a) {}
  std::string_view name() const override { return "conv2d_bias_activation"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<T>& w_, const Tensor<T>& b_) {
    detail::require_grad_safe_activation("autograd::conv2d_bias_activation", act);
    Tensor<T> out = ops::conv2d_bias_activation_forward(x_, w_, b_, act, p);
    x = x_.view();
    w = w_.view();
    y = out.view();
    has_bias = b_.defined();
    return out;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(3);
    const Tensor<T> dz = act.kind == Activation::identity ? dy.view() : ops::activation_backward(y, dy, act);
    if (this->needs_grad(0)) g[0] = ops::conv2d_backward_data(dz, w, x.shape(), p);
    if (this->needs_grad(1)) g[1] = ops::conv2d_backward_filter(dz, x, w.shape(), p);
    if (has_bias && this->needs_grad(2)) g[2] = ops::conv2d_backward_bias(dz);
    return g;
  }
  void release_saved() override { x = {}; w = {}; y = {}; }
};

template <class T>
Var<T> conv2d_bias_activation(const Var<T>& x, const Var<T>& w, const Var<T>& b, const ActivationParams& act,
                              const Conv2dParams& p) {
  auto fn = std::make_shared<Conv2dActivationFn<T>>(p, act);
  Tensor<T> y = fn->forward(x.value(), w.value(), b.defined() ? b.value().view() : Tensor<T>{});
  return detail::finish<T>(std::move(y), fn, {&x, &w, &b});
}

// ---- linear ------------------------------------------------------------------------------

template <class T>
struct LinearFn final : Node<T> {
  ActivationParams act{.kind = Activation::identity};
  Tensor<T> x, w, y;
  bool has_bias = false;
  LinearFn() = default;
  explicit LinearFn(const ActivationParams& a) : act(a) {}
  std::string_view name() const override { return act.kind == Activation::identity ? "linear" : "linear_activation"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<T>& w_, const Tensor<T>& b_) {
    Tensor<T> out;
    if (act.kind == Activation::identity) {
      out = ops::linear_forward(x_, w_, b_);
    } else {
      detail::require_grad_safe_activation("autograd::linear_activation", act);
      out = ops::linear_activation_forward(x_, w_, b_, act);
      y = out.view();
    }
    x = x_.view();
    w = w_.view();
    has_bias = b_.defined();
    return out;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    const Tensor<T> dz = act.kind == Activation::identity ? dy.view() : ops::activation_backward(y, dy, act);
    LinearBackward<T> r = ops::linear_backward(x, w, dz, has_bias && this->needs_grad(2));
    std::vector<Tensor<T>> g(3);
    if (this->needs_grad(0)) g[0] = std::move(r.dx);
    if (this->needs_grad(1)) g[1] = std::move(r.dw);
    if (has_bias && this->needs_grad(2)) g[2] = std::move(r.db);
    return g;
  }
  void release_saved() override { x = {}; w = {}; y = {}; }
};

// y = x w^T + b: x [N, in], w [out, in], b [out] (or undefined).
template <class T>
Var<T> linear(const Var<T>& x, const Var<T>& w, const Var<T>& b = {}) {
  auto fn = std::make_shared<LinearFn<T>>();
  Tensor<T> y = fn->forward(x.value(), w.value(), b.defined() ? b.value().view() : Tensor<T>{});
  return detail::finish<T>(std::move(y), fn, {&x, &w, &b});
}

// act(x w^T + b) as one op (cuBLASLt's epilogue on the GPU); relu or identity.
template <class T>
Var<T> linear_activation(const Var<T>& x, const Var<T>& w, const Var<T>& b, const ActivationParams& act) {
  auto fn = std::make_shared<LinearFn<T>>(act);
  Tensor<T> y = fn->forward(x.value(), w.value(), b.defined() ? b.value().view() : Tensor<T>{});
  return detail::finish<T>(std::move(y), fn, {&x, &w, &b});
}

// ---- activations -------------------------------------------------------------------------

template <class T>
struct ActivationFn final : Node<T> {
  ActivationParams a;
  Tensor<T> x;
  explicit ActivationFn(const ActivationParams& params) : a(params) {}
  std::string_view name() const override { return to_string(a.kind); }
  Tensor<T> forward(const Tensor<T>& x_) {
    Tensor<T> y = ops::activation_forward(x_, a);
    x = x_.view();
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
    x = x_.view();
    gamma = gamma_.view();
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
    x = x_.view();
    gamma = gamma_.view();
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

template <class T>
struct LayerNormFn final : Node<T> {
  double eps;
  Tensor<T> x, gamma, mean, inv_std;
  explicit LayerNormFn(double e) : eps(e) {}
  std::string_view name() const override { return "layer_norm"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<T>& gamma_, const Tensor<T>& beta_) {
    LayerNormForward<T, T> r = ops::layer_norm_forward(x_, gamma_, beta_, eps);
    x = x_.view();
    gamma = gamma_.view();
    mean = std::move(r.mean);
    inv_std = std::move(r.inv_std);
    return std::move(r.y);
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    NormBackward<T, T> r = ops::layer_norm_backward(x, dy, gamma, mean, inv_std);
    std::vector<Tensor<T>> g(3);
    if (this->needs_grad(0)) g[0] = std::move(r.dx);
    if (this->needs_grad(1)) g[1] = std::move(r.dgamma);
    if (this->needs_grad(2)) g[2] = std::move(r.dbeta);
    return g;
  }
  void release_saved() override { x = {}; gamma = {}; mean = {}; inv_std = {}; }
};

// Normalizes each sample over all its dims after the first; gamma and beta have those dims.
template <class T>
Var<T> layer_norm(const Var<T>& x, const Var<T>& gamma, const Var<T>& beta, double eps = 1e-5) {
  auto fn = std::make_shared<LayerNormFn<T>>(eps);
  Tensor<T> y = fn->forward(x.value(), gamma.value(), beta.value());
  return detail::finish<T>(std::move(y), fn, {&x, &gamma, &beta});
}

// ---- pooling and reshaping ---------------------------------------------------------------

template <class T>
struct Pool2dFn final : Node<T> {
  Pool2dParams p;
  Tensor<T> x, y;
  explicit Pool2dFn(const Pool2dParams& params) : p(params) {}
  std::string_view name() const override { return p.mode == PoolMode::max ? "max_pool2d" : "avg_pool2d"; }
  Tensor<T> forward(const Tensor<T>& x_) {
    Tensor<T> out = ops::pool2d_forward(x_, p);
    x = x_.view();
    y = out.view();
    return out;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = ops::pool2d_backward(x, y, dy, p);
    return g;
  }
  void release_saved() override { x = {}; y = {}; }
};

template <class T>
Var<T> pool2d(const Var<T>& x, const Pool2dParams& p) {
  auto fn = std::make_shared<Pool2dFn<T>>(p);
  Tensor<T> y = fn->forward(x.value());
  return detail::finish<T>(std::move(y), fn, {&x});
}
template <class T>
Var<T> max_pool2d(const Var<T>& x, int kernel, int stride = 0, int pad = 0) {
  return pool2d(x, Pool2dParams::max(kernel, stride, pad));
}
template <class T>
Var<T> avg_pool2d(const Var<T>& x, int kernel, int stride = 0, int pad = 0, bool count_include_pad = true) {
  return pool2d(x, Pool2dParams::average(kernel, stride, pad, count_include_pad));
}

template <class T>
struct GlobalAvgPoolFn final : Node<T> {
  Shape x_shape;
  Layout x_layout = Layout::nchw;
  std::string_view name() const override { return "global_avg_pool"; }
  Tensor<T> forward(const Tensor<T>& x) {
    x_shape = x.shape();
    x_layout = x.layout() == Layout::nhwc ? Layout::nhwc : Layout::nchw;
    return ops::global_avg_pool_forward(x);
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = ops::global_avg_pool_backward(dy, x_shape, x_layout);
    return g;
  }
  void release_saved() override {}
};

// [N,C,H,W] -> [N,C,1,1], the mean over H and W.
template <class T>
Var<T> global_avg_pool(const Var<T>& x) {
  auto fn = std::make_shared<GlobalAvgPoolFn<T>>();
  Tensor<T> y = fn->forward(x.value());
  return detail::finish<T>(std::move(y), fn, {&x});
}

template <class T>
struct FlattenFn final : Node<T> {
  Shape x_shape;
  Layout x_layout = Layout::row_major;
  std::string_view name() const override { return "flatten"; }
  Tensor<T> forward(const Tensor<T>& x) {
    x_shape = x.shape();
    x_layout = x.layout() == Layout::nhwc ? Layout::nhwc : Layout::row_major;
    return ops::flatten(x);
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = ops::flatten_backward(dy, x_shape, x_layout);
    return g;
  }
  void release_saved() override {}
};

// [N, ...] -> [N, prod(...)] in logical (row-major / nchw) order.
template <class T>
Var<T> flatten(const Var<T>& x) {
  auto fn = std::make_shared<FlattenFn<T>>();
  Tensor<T> y = fn->forward(x.value());
  return detail::finish<T>(std::move(y), fn, {&x});
}

// ---- elementwise -------------------------------------------------------------------------

template <class T>
struct AddFn final : Node<T> {
  std::string_view name() const override { return "add"; }
  Tensor<T> forward(const Tensor<T>& a, const Tensor<T>& b) { return ops::add(a, b); }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(2);
    if (this->needs_grad(0) && this->needs_grad(1)) {
      // Two copies: two leaves must never share one gradient tensor (an optimizer may clip one).
      BinaryBackward<T> r = ops::add_backward(dy);
      g[0] = std::move(r.da);
      g[1] = std::move(r.db);
    } else {
      g[this->needs_grad(0) ? 0 : 1] = dy.view();
    }
    return g;
  }
  void release_saved() override {}
};

template <class T>
Var<T> add(const Var<T>& a, const Var<T>& b) {
  auto fn = std::make_shared<AddFn<T>>();
  Tensor<T> y = fn->forward(a.value(), b.value());
  return detail::finish<T>(std::move(y), fn, {&a, &b});
}

template <class T>
struct MultiplyFn final : Node<T> {
  Tensor<T> a, b;
  std::string_view name() const override { return "multiply"; }
  Tensor<T> forward(const Tensor<T>& a_, const Tensor<T>& b_) {
    Tensor<T> y = ops::multiply(a_, b_);
    a = a_.view();
    b = b_.view();
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(2);
    if (this->needs_grad(0)) g[0] = ops::multiply(dy, b);
    if (this->needs_grad(1)) g[1] = ops::multiply(dy, a);
    return g;
  }
  void release_saved() override { a = {}; b = {}; }
};

// Elementwise a * b (equal shapes).
template <class T>
Var<T> multiply(const Var<T>& a, const Var<T>& b) {
  auto fn = std::make_shared<MultiplyFn<T>>();
  Tensor<T> y = fn->forward(a.value(), b.value());
  return detail::finish<T>(std::move(y), fn, {&a, &b});
}

template <class T>
struct ScaleFn final : Node<T> {
  double alpha;
  explicit ScaleFn(double a) : alpha(a) {}
  std::string_view name() const override { return "scale"; }
  Tensor<T> forward(const Tensor<T>& x) { return ops::scale(x, alpha); }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = ops::scale_backward(dy, alpha);
    return g;
  }
  void release_saved() override {}
};

template <class T>
Var<T> scale(const Var<T>& x, double alpha) {
  auto fn = std::make_shared<ScaleFn<T>>(alpha);
  Tensor<T> y = fn->forward(x.value());
  return detail::finish<T>(std::move(y), fn, {&x});
}

template <class T> Var<T> operator+(const Var<T>& a, const Var<T>& b) { return add(a, b); }
template <class T> Var<T> operator*(const Var<T>& a, const Var<T>& b) { return multiply(a, b); }
template <class T> Var<T> operator*(double alpha, const Var<T>& x) { return scale(x, alpha); }

template <class T>
struct DropoutFn final : Node<T> {
  Tensor<T> mask;
  std::string_view name() const override { return "dropout"; }
  Tensor<T> forward(const Tensor<T>& x, double p, std::uint64_t seed) {
    DropoutForward<T> r = ops::dropout_forward(x, p, seed);
    mask = std::move(r.mask);
    return std::move(r.y);
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = ops::dropout_backward(dy, mask);
    return g;
  }
  void release_saved() override { mask = {}; }
};

// Inverted dropout with a seeded mask; the caller picks a fresh seed per step.
template <class T>
Var<T> dropout(const Var<T>& x, double p, std::uint64_t seed) {
  auto fn = std::make_shared<DropoutFn<T>>();
  Tensor<T> y = fn->forward(x.value(), p, seed);
  return detail::finish<T>(std::move(y), fn, {&x});
}

// ---- element type ------------------------------------------------------------------------

// The cast's graph holds Var<U>; its input is a Var<T>, which no Node<U> can list among its
// inputs, so backward sends the input its gradient itself (detail::send_gradient).
template <class U, class T>
struct CastFn final : Node<U> {
  std::shared_ptr<detail::VarImpl<T>> src;
  std::string_view name() const override { return "cast"; }
  std::vector<Tensor<U>> backward(const Tensor<U>& dy) override {
    detail::send_gradient(src, ops::cast<T>(dy));
    return {};
  }
  void release_saved() override { src.reset(); }
};

// x converted to element type U (mixed precision: f32 parameters into a bf16 or f16 model,
// its output back to f32 for the loss); the gradient comes back converted to T. The same type
// returns x itself, an undefined Var an undefined one. A Var with history may be cast once per
// backward; a leaf (a parameter) any number of times.
template <class U, class T>
Var<U> cast(const Var<T>& x) {
  if constexpr (std::same_as<U, T>) {
    return x;
  } else {
    if (!x.defined()) return {};
    Tensor<U> y = ops::cast<U>(x.value());
    if (!detail::records({x.requires_grad()})) return Var<U>(std::move(y));
    auto fn = std::make_shared<CastFn<U, T>>();
    fn->src = x.impl();
    return Var<U>::from_node(std::move(y), std::move(fn));
  }
}

// ---- loss --------------------------------------------------------------------------------

template <class T>
struct CrossEntropyFn final : Node<T> {
  CrossEntropyParams p;
  Tensor<T> logits;
  Tensor<std::int32_t> labels;
  explicit CrossEntropyFn(const CrossEntropyParams& params) : p(params) {}
  std::string_view name() const override { return "cross_entropy"; }
  Tensor<T> forward(const Tensor<T>& logits_, const Tensor<std::int32_t>& labels_) {
    Tensor<T> loss = ops::cross_entropy_forward(logits_, labels_, p);
    logits = logits_.view();
    labels = labels_.view();
    return loss;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    // dloss stays where it is (no copy to the host on the GPU).
    if (this->needs_grad(0)) g[0] = ops::cross_entropy_backward(logits, labels, dy, p);
    return g;
  }
  void release_saved() override { logits = {}; labels = {}; }
};

// Softmax cross entropy of logits [N, C] against labels [N] (int32, on the logits' device):
// a scalar (shape []).
template <class T>
Var<T> cross_entropy(const Var<T>& logits, const Tensor<std::int32_t>& labels, const CrossEntropyParams& p = {}) {
  auto fn = std::make_shared<CrossEntropyFn<T>>(p);
  Tensor<T> y = fn->forward(logits.value(), labels);
  return detail::finish<T>(std::move(y), fn, {&logits});
}

}  // namespace cutrain::autograd
