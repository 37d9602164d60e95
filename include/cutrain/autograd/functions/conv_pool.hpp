// Differentiable convolution, pooling and reshaping on Var<T>: conv2d (with an optional bias),
// conv2d_bias_activation (cuDNN's fused epilogue, relu or identity), pool2d with max_pool2d and
// avg_pool2d, global_avg_pool and flatten. Each is a Node whose backward calls the op's own
// backward in ops/.
#pragma once

#include "cutrain/core/abi.hpp"

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/conv2d.hpp"
#include "cutrain/ops/flatten.hpp"
#include "cutrain/ops/pool2d.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

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
    this->save(x, x_, "x");
    this->save(w, w_, "w");
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
  detail::require_defined("autograd::conv2d", {{x.defined(), "x"}, {w.defined(), "w"}});
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
    this->save(x, x_, "x");
    this->save(w, w_, "w");
    this->save(y, out, "y");
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
  detail::require_defined("autograd::conv2d_bias_activation", {{x.defined(), "x"}, {w.defined(), "w"}});
  auto fn = std::make_shared<Conv2dActivationFn<T>>(p, act);
  Tensor<T> y = fn->forward(x.value(), w.value(), b.defined() ? b.value().view() : Tensor<T>{});
  return detail::finish<T>(std::move(y), fn, {&x, &w, &b});
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
    this->save(x, x_, "x");
    this->save(y, out, "y");
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
  detail::require_defined("autograd::pool2d", {{x.defined(), "x"}});
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
  detail::require_defined("autograd::global_avg_pool", {{x.defined(), "x"}});
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
  detail::require_defined("autograd::flatten", {{x.defined(), "x"}});
  auto fn = std::make_shared<FlattenFn<T>>();
  Tensor<T> y = fn->forward(x.value());
  return detail::finish<T>(std::move(y), fn, {&x});
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
