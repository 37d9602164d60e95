// Differentiable matmul on Var<T> (ops/matmul.hpp's semantics: batch dims broadcast, rank-1
// operands promoted, transposed views read in place). The node saves views of a and b; its
// backward is ops::matmul_backward, which computes only the gradients the inputs need.
#pragma once

#include "cutrain/core/abi.hpp"

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/matmul.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

template <class T>
struct MatmulFn final : Node<T> {
  Tensor<T> a, b;
  std::string_view name() const override { return "matmul"; }
  Tensor<T> forward(const Tensor<T>& a_, const Tensor<T>& b_) {
    Tensor<T> y = ops::matmul(a_, b_);
    this->save(a, a_, "a");
    this->save(b, b_, "b");
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    MatmulBackward<T> r = ops::matmul_backward(a, b, dy, this->needs_grad(0), this->needs_grad(1));
    std::vector<Tensor<T>> g(2);
    g[0] = std::move(r.da);
    g[1] = std::move(r.db);
    return g;
  }
  void release_saved() override { a = {}; b = {}; }
};

// a [..., m, k] x b [..., k, n] -> [..., m, n], as ops::matmul.
template <class T>
Var<T> matmul(const Var<T>& a, const Var<T>& b) {
  detail::require_defined("autograd::matmul", {{a.defined(), "a"}, {b.defined(), "b"}});
  auto fn = std::make_shared<MatmulFn<T>>();
  Tensor<T> y = fn->forward(a.value(), b.value());
  return detail::finish<T>(std::move(y), fn, {&a, &b});
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
