// Differentiable broadcasting elementwise ops on Var<T> (ops/broadcast.hpp): sub, div, minimum,
// maximum (with operator- and operator/; add and multiply are in elementwise.hpp), unary exp, log,
// sqrt, rsqrt, neg (unary operator-), abs, pow, and where. Comparisons return a u8 tensor with
// no gradient. Each input's gradient is summed back to its shape (ops::sum_to).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/broadcast.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

// a op b for sub, div, minimum, maximum (add and mul work too). sub saves only the shapes.
template <class T>
struct BinaryFn final : Node<T> {
  BinaryOp kind;
  Tensor<T> a, b;
  Shape a_shape, b_shape;
  explicit BinaryFn(BinaryOp k) : kind(k) {}
  std::string_view name() const override { return to_string(kind); }
  bool linear() const { return kind == BinaryOp::add || kind == BinaryOp::sub; }
  Tensor<T> forward(const Tensor<T>& a_, const Tensor<T>& b_) {
    Tensor<T> y = ops::binary(kind, a_, b_);
    a_shape = a_.shape();
    b_shape = b_.shape();
    if (!linear()) {
      this->save(a, a_, "a");
      this->save(b, b_, "b");
    }
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(2);
    if (linear()) {
      if (this->needs_grad(0)) g[0] = ops::sum_to(dy, a_shape);
      if (this->needs_grad(1)) g[1] = ops::sum_to(kind == BinaryOp::sub ? ops::neg(dy) : dy.view(), b_shape);
      return g;
    }
    BinaryBackward<T> r = ops::binary_backward(kind, a, b, dy, this->needs_grad(0), this->needs_grad(1));
    g[0] = std::move(r.da);
    g[1] = std::move(r.db);
    return g;
  }
  void release_saved() override { a = {}; b = {}; }
};

namespace detail {
template <class T>
Var<T> binary_var(BinaryOp kind, std::string_view op, const Var<T>& a, const Var<T>& b) {
  require_defined(op, {{a.defined(), "a"}, {b.defined(), "b"}});
  auto fn = std::make_shared<BinaryFn<T>>(kind);
  Tensor<T> y = fn->forward(a.value(), b.value());
  return finish<T>(std::move(y), fn, {&a, &b});
}
}  // namespace detail

template <class T> Var<T> sub(const Var<T>& a, const Var<T>& b) { return detail::binary_var(BinaryOp::sub, "autograd::sub", a, b); }
template <class T> Var<T> div(const Var<T>& a, const Var<T>& b) { return detail::binary_var(BinaryOp::div, "autograd::div", a, b); }
// Of equal values a's is taken, and the gradient goes to a.
template <class T>
Var<T> minimum(const Var<T>& a, const Var<T>& b) {
  return detail::binary_var(BinaryOp::minimum, "autograd::minimum", a, b);
}
template <class T>
Var<T> maximum(const Var<T>& a, const Var<T>& b) {
  return detail::binary_var(BinaryOp::maximum, "autograd::maximum", a, b);
}
// a^b with a tensor exponent (broadcast); both get gradients (ops::pow_backward's conventions).
template <class T> Var<T> pow(const Var<T>& a, const Var<T>& b) { return detail::binary_var(BinaryOp::pow, "autograd::pow", a, b); }

template <class T> Var<T> operator-(const Var<T>& a, const Var<T>& b) { return sub(a, b); }
template <class T> Var<T> operator/(const Var<T>& a, const Var<T>& b) { return div(a, b); }

// f(x); saves x (neg saves nothing).
template <class T>
struct UnaryFn final : Node<T> {
  UnaryOp kind;
  double p;
  Tensor<T> x;
  UnaryFn(UnaryOp k, double p_) : kind(k), p(p_) {}
  std::string_view name() const override { return to_string(kind); }
  Tensor<T> forward(const Tensor<T>& x_) {
    Tensor<T> y = ops::unary(kind, x_, p);
    if (kind != UnaryOp::neg) this->save(x, x_, "x");
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = kind == UnaryOp::neg ? ops::neg(dy) : ops::unary_backward(kind, x, dy, p);
    return g;
  }
  void release_saved() override { x = {}; }
};

namespace detail {
template <class T>
Var<T> unary_var(UnaryOp kind, std::string_view op, const Var<T>& x, double p = 0.0) {
  require_defined(op, {{x.defined(), "x"}});
  auto fn = std::make_shared<UnaryFn<T>>(kind, p);
  Tensor<T> y = fn->forward(x.value());
  return finish<T>(std::move(y), fn, {&x});
}
}  // namespace detail

template <class T> Var<T> exp(const Var<T>& x) { return detail::unary_var(UnaryOp::exp, "autograd::exp", x); }
template <class T> Var<T> log(const Var<T>& x) { return detail::unary_var(UnaryOp::log, "autograd::log", x); }
template <class T> Var<T> sqrt(const Var<T>& x) { return detail::unary_var(UnaryOp::sqrt, "autograd::sqrt", x); }
template <class T> Var<T> rsqrt(const Var<T>& x) { return detail::unary_var(UnaryOp::rsqrt, "autograd::rsqrt", x); }
template <class T> Var<T> neg(const Var<T>& x) { return detail::unary_var(UnaryOp::neg, "autograd::neg", x); }
// abs' is sign(x): 0 at 0.
template <class T> Var<T> abs(const Var<T>& x) { return detail::unary_var(UnaryOp::abs, "autograd::abs", x); }
// x^p, p a finite scalar.
template <class T> Var<T> pow(const Var<T>& x, double p) { return detail::unary_var(UnaryOp::pow, "autograd::pow", x, p); }

template <class T> Var<T> operator-(const Var<T>& x) { return neg(x); }

// cond ? a : b; saves cond.
template <class T>
struct WhereFn final : Node<T> {
  Tensor<std::uint8_t> cond;
  Shape a_shape, b_shape;
  std::string_view name() const override { return "where"; }
  Tensor<T> forward(const Tensor<std::uint8_t>& c, const Tensor<T>& a, const Tensor<T>& b) {
    Tensor<T> y = ops::where(c, a, b);
    a_shape = a.shape();
    b_shape = b.shape();
    this->save(cond, c, "cond");
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    BinaryBackward<T> r = ops::where_backward(cond, a_shape, b_shape, dy, this->needs_grad(0), this->needs_grad(1));
    std::vector<Tensor<T>> g(2);
    g[0] = std::move(r.da);
    g[1] = std::move(r.db);
    return g;
  }
  void release_saved() override { cond = {}; }
};

// cond (u8, no gradient) != 0 ? a : b, the three broadcast together; the gradient goes to a
// where cond holds, to b elsewhere.
template <class T>
Var<T> where(const Tensor<std::uint8_t>& cond, const Var<T>& a, const Var<T>& b) {
  detail::require_defined("autograd::where", {{a.defined(), "a"}, {b.defined(), "b"}});
  auto fn = std::make_shared<WhereFn<T>>();
  Tensor<T> y = fn->forward(cond, a.value(), b.value());
  return detail::finish<T>(std::move(y), fn, {&a, &b});
}

// Comparisons of the values (no gradient): u8 0/1 at the broadcast shape.
template <class T> Tensor<std::uint8_t> eq(const Var<T>& a, const Var<T>& b) { return ops::eq(a.value(), b.value()); }
template <class T> Tensor<std::uint8_t> ne(const Var<T>& a, const Var<T>& b) { return ops::ne(a.value(), b.value()); }
template <class T> Tensor<std::uint8_t> lt(const Var<T>& a, const Var<T>& b) { return ops::lt(a.value(), b.value()); }
template <class T> Tensor<std::uint8_t> le(const Var<T>& a, const Var<T>& b) { return ops::le(a.value(), b.value()); }
template <class T> Tensor<std::uint8_t> gt(const Var<T>& a, const Var<T>& b) { return ops::gt(a.value(), b.value()); }
template <class T> Tensor<std::uint8_t> ge(const Var<T>& a, const Var<T>& b) { return ops::ge(a.value(), b.value()); }

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
