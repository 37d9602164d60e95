// Broadcasting elementwise ops (docs/ops/elementwise.md): binary sub, mul, div, minimum, maximum
// (add and multiply in ops/elementwise.hpp come here for unequal shapes), unary exp, log, sqrt,
// rsqrt, neg, abs, pow, comparisons eq..ge (u8 0/1) and where, with their backwards; dispatch on
// the tensors' device to cpu/broadcast.hpp or cuda/kernels/broadcast.hpp. Shapes broadcast as in
// NumPy (core/params/elementwise.hpp), rank <= 8. A binary backward gives each input the output
// gradient times the local derivative, summed back to the input's shape with ops::sum_to.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <string_view>

#include "cutrain/core/params/elementwise.hpp"
#include "cutrain/cpu/broadcast.hpp"
#include "cutrain/cpu/elementwise.hpp"  // BinaryBackward
#include "cutrain/ops/dispatch.hpp"
#include "cutrain/ops/sum_to.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/broadcast.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// a and b defined, on one device: their broadcast shape.
template <class T, class U>
Shape binary_shape(std::string_view op, const Tensor<T>& a, std::string_view a_name, const Tensor<U>& b,
                   std::string_view b_name) {
  check::defined(op, a, a_name);
  check::defined(op, b, b_name);
  CUTRAIN_REQUIRE(a.device() == b.device(), DeviceError, op, a_name, " ", a.describe(), " and ", b_name, " ",
                  b.describe(), " are on different devices");
  return broadcast_shape(op, a.shape(), b.shape());
}

// The output's layout: a's (nhwc stays nhwc) where a already has the output's shape, else row-major.
template <class T>
Layout binary_layout(const Tensor<T>& a, const Shape& shape) {
  return a.shape() == shape ? elementwise_layout(a) : Layout::row_major;
}

// dy defined, with the forward's output shape.
template <class T>
void check_output_grad(std::string_view op, const Tensor<T>& dy, const Shape& shape, const Tensor<T>& like) {
  check::defined(op, dy, "dy");
  CUTRAIN_REQUIRE(dy.shape() == shape, InvalidArgument, op, "dy must have the output's (broadcast) shape ", shape,
                  ", got ", dy.describe());
  CUTRAIN_REQUIRE(dy.device() == like.device(), DeviceError, op, "dy ", dy.describe(), " and the inputs (",
                  like.describe(), ") are on different devices");
}

template <class T>
void check_rank(std::string_view op, const Tensor<T>& x, std::string_view name) {
  check::defined(op, x, name);
  CUTRAIN_REQUIRE(x.rank() <= max_broadcast_rank, NotImplemented, op, name, " ", x.describe(), " has rank ", x.rank(),
                  "; elementwise ops take rank <= ", max_broadcast_rank);
}

inline void check_exponent(std::string_view op, double p) {
  CUTRAIN_REQUIRE(std::isfinite(p), InvalidArgument, op, "the exponent must be finite, got ", p);
}

// The local gradient of op with respect to input `which` at the output's shape (dy's).
template <class T>
Tensor<T> binary_grad(std::string_view op, BinaryOp kind, const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy,
                      int which) {
  return dispatch<Tensor<T>>(
      op, [&](const auto& a, const auto& b, const auto& dy) { return cpu::binary_grad(kind, a, b, dy, which); },
      CUTRAIN_IF_CUDA([&](const auto& a, const auto& b, const auto& dy) {
        Tensor<T> g(dy.shape(), {.device = dy.device()});
        cuda::kernels::broadcast_binary_grad(kind, a, b, dy, which, g);
        return g;
      }),
      a, b, dy);
}

template <class T>
Tensor<T> unary_at(std::string_view op, UnaryOp kind, const Tensor<T>& x, double p) {
  check_rank(op, x, "x");
  const Layout l = elementwise_layout(x);
  return dispatch<Tensor<T>>(
      op, [&](const auto& x) { return cpu::unary(kind, x, p, l); },
      CUTRAIN_IF_CUDA([&](const auto& x) {
        Tensor<T> y = device_output<T>(x.shape(), x);
        cuda::kernels::unary(kind, x, p, y);
        return y;
      }),
      x);
}

template <class T>
Tensor<T> where_grad(std::string_view op, const Tensor<std::uint8_t>& cond, const Tensor<T>& dy, int which) {
  return dispatch<Tensor<T>>(
      op, [&](const auto& dy, const auto& cond) { return cpu::where_grad(cond, dy, which); },
      CUTRAIN_IF_CUDA([&](const auto& dy, const auto& cond) {
        Tensor<T> g(dy.shape(), {.device = dy.device()});
        cuda::kernels::where_grad(cond, dy, which, g);
        return g;
      }),
      dy, cond);
}
}  // namespace detail

// ---- binary ----------------------------------------------------------------------------------

// a op b at the broadcast shape of a and b: a new contiguous tensor, in a's layout when a has the
// output's shape (an nhwc a gives an nhwc output), else row-major. Any input strides. op: the
// name errors give (default: the kind's).
template <class T>
Tensor<T> binary(BinaryOp kind, const Tensor<T>& a, const Tensor<T>& b, std::string_view op = {}) {
  if (op.empty()) op = to_string(kind);
  const Shape shape = detail::binary_shape(op, a, "a", b, "b");
  const Layout l = detail::binary_layout(a, shape);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& a, const auto& b) { return cpu::binary(kind, a, b, shape, l); },
      CUTRAIN_IF_CUDA([&](const auto& a, const auto& b) {
        Tensor<T> y(shape, {.layout = l, .device = a.device()});
        cuda::kernels::broadcast_binary(kind, a, b, y);
        return y;
      }),
      a, b);
}

template <class T> Tensor<T> sub(const Tensor<T>& a, const Tensor<T>& b) { return binary(BinaryOp::sub, a, b); }
template <class T> Tensor<T> mul(const Tensor<T>& a, const Tensor<T>& b) { return binary(BinaryOp::mul, a, b); }
template <class T> Tensor<T> div(const Tensor<T>& a, const Tensor<T>& b) { return binary(BinaryOp::div, a, b); }
// The smaller / larger of a and b; of equal values a's is taken (and its gradient goes to a); a
// NaN in either input is the result.
template <class T> Tensor<T> minimum(const Tensor<T>& a, const Tensor<T>& b) { return binary(BinaryOp::minimum, a, b); }
template <class T> Tensor<T> maximum(const Tensor<T>& a, const Tensor<T>& b) { return binary(BinaryOp::maximum, a, b); }
// a^b elementwise, the exponent a tensor (broadcast); pow(x, double) below takes a scalar one.
// Outside the real domain (a negative a, a fractional b) the result is NaN, as std::pow gives.
template <class T> Tensor<T> pow(const Tensor<T>& a, const Tensor<T>& b) { return binary(BinaryOp::pow, a, b); }

// Gradients of y = a op b for dy of y's (broadcast) shape: da of a's shape and db of b's, each
// row-major, each a new tensor; one not asked for (need_a / need_b false) stays undefined. op:
// the name errors give (default: KIND_backward).
template <class T>
BinaryBackward<T> binary_backward(BinaryOp kind, const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy,
                                  bool need_a = true, bool need_b = true, std::string_view op = {}) {
  if (op.empty())
    op = kind == BinaryOp::add ? "add_backward" : kind == BinaryOp::sub ? "sub_backward"
                              : kind == BinaryOp::mul ? "mul_backward" : kind == BinaryOp::div ? "div_backward"
                              : kind == BinaryOp::minimum ? "minimum_backward"
                              : kind == BinaryOp::maximum ? "maximum_backward" : "pow_backward";
  const Shape shape = detail::binary_shape(op, a, "a", b, "b");
  detail::check_output_grad(op, dy, shape, a);
  BinaryBackward<T> g;
  const bool linear = kind == BinaryOp::add || kind == BinaryOp::sub;
  if (need_a) g.da = linear ? ops::sum_to(dy, a.shape()) : ops::sum_to(detail::binary_grad(op, kind, a, b, dy, 0), a.shape());
  if (need_b) {
    if (kind == BinaryOp::add) g.db = ops::sum_to(dy, b.shape());
    else if (kind == BinaryOp::sub) g.db = ops::sum_to(detail::unary_at(op, UnaryOp::neg, dy, 0.0), b.shape());
    else g.db = ops::sum_to(detail::binary_grad(op, kind, a, b, dy, 1), b.shape());
  }
  return g;
}

template <class T>
BinaryBackward<T> sub_backward(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy) {
  return binary_backward(BinaryOp::sub, a, b, dy);
}
template <class T>
BinaryBackward<T> div_backward(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy) {
  return binary_backward(BinaryOp::div, a, b, dy);
}
template <class T>
BinaryBackward<T> minimum_backward(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy) {
  return binary_backward(BinaryOp::minimum, a, b, dy);
}
template <class T>
BinaryBackward<T> maximum_backward(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy) {
  return binary_backward(BinaryOp::maximum, a, b, dy);
}
// da = dy b a^(b-1) (0 where b is 0), db = dy a^b log a (0 where a is 0 and b >= 0), as PyTorch.
template <class T>
BinaryBackward<T> pow_backward(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy) {
  return binary_backward(BinaryOp::pow, a, b, dy);
}

// ---- unary -----------------------------------------------------------------------------------

// f(x), any strides in; the output is contiguous in x's layout (nhwc stays nhwc, else row-major).
// Outside a function's domain the result is what the C library gives (NaN, inf): no error.
template <class T> Tensor<T> exp(const Tensor<T>& x) { return detail::unary_at("exp", UnaryOp::exp, x, 0.0); }
template <class T> Tensor<T> log(const Tensor<T>& x) { return detail::unary_at("log", UnaryOp::log, x, 0.0); }
template <class T> Tensor<T> sqrt(const Tensor<T>& x) { return detail::unary_at("sqrt", UnaryOp::sqrt, x, 0.0); }
template <class T> Tensor<T> rsqrt(const Tensor<T>& x) { return detail::unary_at("rsqrt", UnaryOp::rsqrt, x, 0.0); }
template <class T> Tensor<T> neg(const Tensor<T>& x) { return detail::unary_at("neg", UnaryOp::neg, x, 0.0); }
template <class T> Tensor<T> abs(const Tensor<T>& x) { return detail::unary_at("abs", UnaryOp::abs, x, 0.0); }
// x^p for a finite scalar exponent p.
template <class T>
Tensor<T> pow(const Tensor<T>& x, double p) {
  detail::check_exponent("pow", p);
  return detail::unary_at("pow", UnaryOp::pow, x, p);
}
// The general form (p: pow's exponent, ignored by the others).
template <class T>
Tensor<T> unary(UnaryOp kind, const Tensor<T>& x, double p = 0.0) {
  if (kind == UnaryOp::pow) detail::check_exponent("pow", p);
  return detail::unary_at(to_string(kind), kind, x, p);
}

// dx = dy * f'(x), x and dy of one shape; dx in x's layout. abs' is sign(x) (0 at 0).
template <class T>
Tensor<T> unary_backward(UnaryOp kind, const Tensor<T>& x, const Tensor<T>& dy, double p = 0.0) {
  constexpr std::string_view op = "unary_backward";
  detail::check_rank(op, x, "x");
  check::defined(op, dy, "dy");
  CUTRAIN_REQUIRE(dy.shape() == x.shape(), InvalidArgument, op, to_string(kind), ": dy ", dy.describe(),
                  " must have x's shape ", x.shape());
  if (kind == UnaryOp::pow) detail::check_exponent(op, p);
  const Layout l = detail::elementwise_layout(x);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& x, const auto& dy) { return cpu::unary_backward(kind, x, dy, p, l); },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& dy) {
        Tensor<T> dx = detail::device_output<T>(x.shape(), x);
        cuda::kernels::unary_backward(kind, x, dy, p, dx);
        return dx;
      }),
      x, dy);
}

template <class T>
Tensor<T> pow_backward(const Tensor<T>& x, const Tensor<T>& dy, double p) {
  return unary_backward(UnaryOp::pow, x, dy, p);
}

// ---- comparisons and where -------------------------------------------------------------------

// 1 where a op b holds, else 0, at the broadcast shape, row-major u8. NaN compares unequal to
// everything (ne gives 1, the others 0). No gradient.
template <class T>
Tensor<std::uint8_t> compare(CompareOp kind, const Tensor<T>& a, const Tensor<T>& b) {
  const std::string_view op = to_string(kind);
  const Shape shape = detail::binary_shape(op, a, "a", b, "b");
  return detail::dispatch<Tensor<std::uint8_t>>(
      op, [&](const auto& a, const auto& b) { return cpu::compare(kind, a, b, shape); },
      CUTRAIN_IF_CUDA([&](const auto& a, const auto& b) {
        Tensor<std::uint8_t> y(shape, {.device = a.device()});
        cuda::kernels::compare(kind, a, b, y);
        return y;
      }),
      a, b);
}

template <class T> Tensor<std::uint8_t> eq(const Tensor<T>& a, const Tensor<T>& b) { return compare(CompareOp::eq, a, b); }
template <class T> Tensor<std::uint8_t> ne(const Tensor<T>& a, const Tensor<T>& b) { return compare(CompareOp::ne, a, b); }
template <class T> Tensor<std::uint8_t> lt(const Tensor<T>& a, const Tensor<T>& b) { return compare(CompareOp::lt, a, b); }
template <class T> Tensor<std::uint8_t> le(const Tensor<T>& a, const Tensor<T>& b) { return compare(CompareOp::le, a, b); }
template <class T> Tensor<std::uint8_t> gt(const Tensor<T>& a, const Tensor<T>& b) { return compare(CompareOp::gt, a, b); }
template <class T> Tensor<std::uint8_t> ge(const Tensor<T>& a, const Tensor<T>& b) { return compare(CompareOp::ge, a, b); }

namespace detail {
template <class T>
Shape where_shape(std::string_view op, const Tensor<std::uint8_t>& cond, const Tensor<T>& a, const Tensor<T>& b) {
  check::defined(op, cond, "cond");
  check::defined(op, a, "a");
  check::defined(op, b, "b");
  CUTRAIN_REQUIRE(cond.device() == a.device() && a.device() == b.device(), DeviceError, op,
                  "tensors on different devices: cond ", cond.describe(), ", a ", a.describe(), ", b ", b.describe());
  return broadcast_shape(op, {&cond.shape(), &a.shape(), &b.shape()});
}
}  // namespace detail

// cond != 0 ? a : b, the three broadcast together, row-major.
template <class T>
Tensor<T> where(const Tensor<std::uint8_t>& cond, const Tensor<T>& a, const Tensor<T>& b) {
  constexpr std::string_view op = "where";
  const Shape shape = detail::where_shape(op, cond, a, b);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& a, const auto& b, const auto& cond) { return cpu::where(cond, a, b, shape); },
      CUTRAIN_IF_CUDA([&](const auto& a, const auto& b, const auto& cond) {
        Tensor<T> y(shape, {.device = a.device()});
        cuda::kernels::where(cond, a, b, y);
        return y;
      }),
      a, b, cond);
}

// da = sum_to(dy where cond, a_shape), db = sum_to(dy where !cond, b_shape): the gradients of
// where(cond, a, b) for a and b of those shapes; dy has the output's (broadcast) shape. One not
// asked for stays undefined.
template <class T>
BinaryBackward<T> where_backward(const Tensor<std::uint8_t>& cond, const Shape& a_shape, const Shape& b_shape,
                                 const Tensor<T>& dy, bool need_a = true, bool need_b = true) {
  constexpr std::string_view op = "where_backward";
  check::defined(op, cond, "cond");
  check::defined(op, dy, "dy");
  check_shape_valid(op, a_shape);
  check_shape_valid(op, b_shape);
  const Shape shape = broadcast_shape(op, {&cond.shape(), &a_shape, &b_shape});
  CUTRAIN_REQUIRE(dy.shape() == shape, InvalidArgument, op, "dy must have the output's (broadcast) shape ", shape,
                  ", got ", dy.describe());
  CUTRAIN_REQUIRE(dy.device() == cond.device(), DeviceError, op, "dy ", dy.describe(), " and cond ", cond.describe(),
                  " are on different devices");
  BinaryBackward<T> g;
  if (need_a) g.da = ops::sum_to(detail::where_grad(op, cond, dy, 0), a_shape);
  if (need_b) g.db = ops::sum_to(detail::where_grad(op, cond, dy, 1), b_shape);
  return g;
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
