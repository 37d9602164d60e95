// Differentiable linear layers and the loss on Var<T>: linear (x w^T + b) and
// linear_activation (cuBLASLt's fused epilogue, relu or identity), and cross_entropy of logits
// against int32 labels. Each is a Node whose backward calls the op's own backward in ops/.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/cross_entropy.hpp"
#include "cutrain/ops/linear.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

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
      this->save(y, out, "y");
    }
    this->save(x, x_, "x");
    this->save(w, w_, "w");
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
  detail::require_defined("autograd::linear", {{x.defined(), "x"}, {w.defined(), "w"}});
  auto fn = std::make_shared<LinearFn<T>>();
  Tensor<T> y = fn->forward(x.value(), w.value(), b.defined() ? b.value().view() : Tensor<T>{});
  return detail::finish<T>(std::move(y), fn, {&x, &w, &b});
}

// act(x w^T + b) as one op (cuBLASLt's epilogue on the GPU); relu or identity.
template <class T>
Var<T> linear_activation(const Var<T>& x, const Var<T>& w, const Var<T>& b, const ActivationParams& act) {
  detail::require_defined("autograd::linear_activation", {{x.defined(), "x"}, {w.defined(), "w"}});
  auto fn = std::make_shared<LinearFn<T>>(act);
  Tensor<T> y = fn->forward(x.value(), w.value(), b.defined() ? b.value().view() : Tensor<T>{});
  return detail::finish<T>(std::move(y), fn, {&x, &w, &b});
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
    this->save(logits, logits_, "logits");
    this->save(labels, labels_, "labels");
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

// Softmax cross entropy of logits [N, C] against labels [N] (int32 or int64, on the logits'
// device): a scalar (shape []). int64 labels are converted to int32 once, here.
template <class T>
Var<T> cross_entropy(const Var<T>& logits, const Tensor<std::int32_t>& labels, const CrossEntropyParams& p = {}) {
  detail::require_defined("autograd::cross_entropy", {{logits.defined(), "logits"}});
  auto fn = std::make_shared<CrossEntropyFn<T>>(p);
  Tensor<T> y = fn->forward(logits.value(), labels);
  return detail::finish<T>(std::move(y), fn, {&logits});
}
template <class T>
Var<T> cross_entropy(const Var<T>& logits, const Tensor<std::int64_t>& labels, const CrossEntropyParams& p = {}) {
  return cross_entropy(logits, ops::detail::labels_as_i32("cross_entropy_forward", labels), p);
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
