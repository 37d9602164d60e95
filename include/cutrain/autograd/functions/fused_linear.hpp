// A transformer block's linear layers with what surrounds them fused in: linear_residual
// (x w^T + b + r, the residual read by the matmul) and gelu_mlp (gelu_tanh(x w1^T + b1) w2^T + b2
// + r as one op, see ops/mlp.hpp). Same values and gradients as the composed ops; on the GPU no
// elementwise pass of their own.
#pragma once

#include "cutrain/core/abi.hpp"

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/linear.hpp"
#include "cutrain/ops/mlp.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

template <class T>
struct LinearResidualFn final : Node<T> {
  Tensor<T> x, w;
  bool has_bias = false;
  std::string_view name() const override { return "linear_residual"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<T>& w_, const Tensor<T>& b_, const Tensor<T>& r_) {
    Tensor<T> y = ops::linear_residual_forward(x_, w_, b_, r_);
    this->save(x, x_, "x");
    this->save(w, w_, "w");
    has_bias = b_.defined();
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(4);
    if (this->needs_grad(0) || this->needs_grad(1) || (has_bias && this->needs_grad(2))) {
      LinearBackward<T> r = ops::linear_backward(x, w, dy, has_bias && this->needs_grad(2));
      if (this->needs_grad(0)) g[0] = std::move(r.dx);
      if (this->needs_grad(1)) g[1] = std::move(r.dw);
      if (has_bias && this->needs_grad(2)) g[2] = std::move(r.db);
    }
    if (this->needs_grad(3)) g[3] = dy.view();  // as add's: the engine copies where a leaf shares it
    return g;
  }
  void release_saved() override { x = {}; w = {}; }
};

// y = x w^T + b + r: x [N, in], w [out, in], b [out] (or undefined), r [N, out]. On the GPU one
// cuBLASLt matmul (r is its C operand).
template <class T>
Var<T> linear_residual(const Var<T>& x, const Var<T>& w, const Var<T>& b, const Var<T>& r) {
  detail::require_defined("autograd::linear_residual", {{x.defined(), "x"}, {w.defined(), "w"}, {r.defined(), "r"}});
  auto fn = std::make_shared<LinearResidualFn<T>>();
  Tensor<T> y = fn->forward(x.value(), w.value(), b.defined() ? b.value().view() : Tensor<T>{}, r.value());
  return detail::finish<T>(std::move(y), fn, {&x, &w, &b, &r});
}

template <class T>
struct GeluMlpFn final : Node<T> {
  Tensor<T> x, w1, w2, z, g;
  bool has_b1 = false, has_b2 = false;
  std::string_view name() const override { return "gelu_mlp"; }
  Tensor<T> forward(const Tensor<T>& x_, const Tensor<T>& w1_, const Tensor<T>& b1_, const Tensor<T>& w2_,
                    const Tensor<T>& b2_, const Tensor<T>& r_) {
    GeluMlpForward<T> f = ops::gelu_mlp_forward(x_, w1_, b1_, w2_, b2_, r_);
    this->save(x, x_, "x");
    this->save(w1, w1_, "w1");
    this->save(w2, w2_, "w2");
    this->save(z, f.z, "z");
    this->save(g, f.g, "g");
    has_b1 = b1_.defined();
    has_b2 = b2_.defined();
    return std::move(f.y);
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> out(6);
    bool any = false;
    for (std::size_t i = 0; i < 5; ++i) any = any || this->needs_grad(i);
    if (any) {
      GeluMlpBackward<T> r =
          ops::gelu_mlp_backward(x, w1, w2, z, g, dy, has_b1 && this->needs_grad(2), has_b2 && this->needs_grad(4));
      if (this->needs_grad(0)) out[0] = std::move(r.dx);
      if (this->needs_grad(1)) out[1] = std::move(r.dw1);
      if (has_b1 && this->needs_grad(2)) out[2] = std::move(r.db1);
      if (this->needs_grad(3)) out[3] = std::move(r.dw2);
      if (has_b2 && this->needs_grad(4)) out[4] = std::move(r.db2);
    }
    if (this->needs_grad(5)) out[5] = dy.view();
    return out;
  }
  void release_saved() override { x = {}; w1 = {}; w2 = {}; z = {}; g = {}; }
};

// y = gelu_tanh(x w1^T + b1) w2^T + b2 [+ r]: a transformer's MLP and its residual add as one
// op (ops::gelu_mlp_forward). x [N, in], w1 [hidden, in], w2 [out, hidden], r [N, out]; the
// biases and r may be undefined. Keeps z = x w1^T + b1 and g = gelu_tanh(z) for backward, as the
// composed ops would.
template <class T>
Var<T> gelu_mlp(const Var<T>& x, const Var<T>& w1, const Var<T>& b1, const Var<T>& w2, const Var<T>& b2,
                const Var<T>& r = {}) {
  detail::require_defined("autograd::gelu_mlp", {{x.defined(), "x"}, {w1.defined(), "w1"}, {w2.defined(), "w2"}});
  auto fn = std::make_shared<GeluMlpFn<T>>();
  const auto value = [](const Var<T>& v) { return v.defined() ? v.value().view() : Tensor<T>{}; };
  Tensor<T> y = fn->forward(x.value(), w1.value(), value(b1), w2.value(), value(b2), value(r));
  return detail::finish<T>(std::move(y), fn, {&x, &w1, &b1, &w2, &b2, &r});
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
