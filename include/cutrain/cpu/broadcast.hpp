// Broadcasting elementwise ops on the CPU (f32/f64), the oracle of the GPU kernels
// (cuda/kernels/broadcast.cuh computes the same formulas in f32): binary ops, their local
// gradients, unary ops and their backward, comparisons (u8 0/1) and where. Inputs of any
// strides (views, stride-0 expand views) are read in place through their strides broadcast to the
// output's shape (core/view.hpp's expand); shapes were checked by the caller (ops/broadcast.hpp).
#pragma once

#include "cutrain/core/abi.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cutrain/core/params/elementwise.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/cpu/common.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
// Calls fn(offsets) for every element of `shape` in logical row-major order, offsets[k] being
// the element's offset under strides[k] (each of shape's rank).
template <std::size_t K, class Fn>
void for_each_broadcast(const Shape& shape, const std::array<Strides, K>& strides, Fn&& fn) {
  const int r = shape.rank();
  const std::int64_t n = shape.numel();
  if (n == 0) return;
  std::vector<std::int64_t> idx(static_cast<std::size_t>(r), 0);
  std::array<std::int64_t, K> off{};
  for (std::int64_t i = 0; i < n; ++i) {
    fn(off);
    for (int d = r - 1; d >= 0; --d) {
      const auto ud = static_cast<std::size_t>(d);
      if (++idx[ud] < shape[d]) {
        for (std::size_t k = 0; k < K; ++k) off[k] += strides[k][ud];
        break;
      }
      for (std::size_t k = 0; k < K; ++k) off[k] -= strides[k][ud] * (shape[d] - 1);
      idx[ud] = 0;
    }
  }
}

// t's strides seen at `shape` (0 along broadcast dims).
template <class U>
Strides strides_at(const Tensor<U>& t, const Shape& shape) {
  return cutrain::expand(t, shape).strides();
}

// minimum / maximum take b only where b is strictly smaller / larger, or NaN: ties go to a, and
// a NaN in either input is the result.
template <class T>
bool picks_b(BinaryOp op, T a, T b) {
  return op == BinaryOp::minimum ? (b < a || b != b) : (b > a || b != b);
}

template <class T>
T binary_value(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::minimum:
    case BinaryOp::maximum: return picks_b(op, a, b) ? b : a;
    case BinaryOp::pow: return std::pow(a, b);
  }
  return T(0);
}

// d(a op b)/da (which == 0) or d/db (which == 1). pow, as PyTorch: d/da is 0 where b is 0, d/db
// is 0 where a is 0 and b >= 0 (else a^b log a: NaN for a negative a).
template <class T>
T binary_derivative(BinaryOp op, T a, T b, int which) {
  switch (op) {
    case BinaryOp::add: return T(1);
    case BinaryOp::sub: return which == 0 ? T(1) : T(-1);
    case BinaryOp::mul: return which == 0 ? b : a;
    case BinaryOp::div: return which == 0 ? T(1) / b : -a / (b * b);
    case BinaryOp::minimum:
    case BinaryOp::maximum: return (picks_b(op, a, b) == (which == 1)) ? T(1) : T(0);
    case BinaryOp::pow:
      if (which == 0) return b == T(0) ? T(0) : b * std::pow(a, b - T(1));
      return a == T(0) && b >= T(0) ? T(0) : std::pow(a, b) * std::log(a);
  }
  return T(0);
}

template <class T>
T unary_value(UnaryOp op, T x, T p) {
  switch (op) {
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return std::log(x);
    case UnaryOp::sqrt: return std::sqrt(x);
    case UnaryOp::rsqrt: return T(1) / std::sqrt(x);
    case UnaryOp::neg: return -x;
    case UnaryOp::abs: return std::abs(x);
    case UnaryOp::pow: return std::pow(x, p);
  }
  return T(0);
}

// f'(x); abs' is sign(x) (0 at 0), pow's with exponent 0 is 0.
template <class T>
T unary_derivative(UnaryOp op, T x, T p) {
  switch (op) {
    case UnaryOp::exp: return std::exp(x);
    case UnaryOp::log: return T(1) / x;
    case UnaryOp::sqrt: return T(0.5) / std::sqrt(x);
    case UnaryOp::rsqrt: return T(-0.5) / (x * std::sqrt(x));
    case UnaryOp::neg: return T(-1);
    case UnaryOp::abs: return x > T(0) ? T(1) : x < T(0) ? T(-1) : T(0);
    case UnaryOp::pow: return p == T(0) ? T(0) : p * std::pow(x, p - T(1));
  }
  return T(0);
}

template <class T>
bool compare_value(CompareOp op, T a, T b) {
  switch (op) {
    case CompareOp::eq: return a == b;
    case CompareOp::ne: return a != b;
    case CompareOp::lt: return a < b;
    case CompareOp::le: return a <= b;
    case CompareOp::gt: return a > b;
    case CompareOp::ge: return a >= b;
  }
  return false;
}

// A new host tensor of `shape` in layout l (nhwc only for 4-d shapes).
template <class U>
Tensor<U> output(const Shape& shape, Layout l) {
  return Tensor<U>(shape, {.layout = shape.rank() == 4 && l == Layout::nhwc ? Layout::nhwc : Layout::row_major});
}
}  // namespace detail

// y = a op b at `shape` (their broadcast shape), contiguous in layout l.
template <CpuFloat T>
Tensor<T> binary(BinaryOp op, const Tensor<T>& a, const Tensor<T>& b, const Shape& shape, Layout l = Layout::row_major) {
  Tensor<T> y = detail::output<T>(shape, l);
  const std::array<Strides, 3> st{y.strides(), detail::strides_at(a, shape), detail::strides_at(b, shape)};
  T *py = y.data(), *pa = a.data(), *pb = b.data();
  detail::for_each_broadcast(shape, st, [&](const std::array<std::int64_t, 3>& o) {
    py[o[0]] = detail::binary_value(op, pa[o[1]], pb[o[2]]);
  });
  return y;
}

// dy * d(a op b)/da (which 0) or /db (which 1), at dy's shape (the broadcast one), row-major:
// what ops::sum_to then sums back to the input's shape.
template <CpuFloat T>
Tensor<T> binary_grad(BinaryOp op, const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy, int which) {
  const Shape& shape = dy.shape();
  Tensor<T> g = detail::output<T>(shape, Layout::row_major);
  const std::array<Strides, 4> st{g.strides(), detail::strides_at(a, shape), detail::strides_at(b, shape), dy.strides()};
  T *pg = g.data(), *pa = a.data(), *pb = b.data(), *pd = dy.data();
  detail::for_each_broadcast(shape, st, [&](const std::array<std::int64_t, 4>& o) {
    pg[o[0]] = pd[o[3]] * detail::binary_derivative(op, pa[o[1]], pb[o[2]], which);
  });
  return g;
}

// y = f(x) (p: pow's exponent), contiguous in layout l.
template <CpuFloat T>
Tensor<T> unary(UnaryOp op, const Tensor<T>& x, double p, Layout l) {
  Tensor<T> y = detail::output<T>(x.shape(), l);
  const std::array<Strides, 2> st{y.strides(), x.strides()};
  const T pt = static_cast<T>(p);
  T *py = y.data(), *px = x.data();
  detail::for_each_broadcast(x.shape(), st, [&](const std::array<std::int64_t, 2>& o) {
    py[o[0]] = detail::unary_value(op, px[o[1]], pt);
  });
  return y;
}

// dx = dy * f'(x), x and dy of one shape, contiguous in layout l.
template <CpuFloat T>
Tensor<T> unary_backward(UnaryOp op, const Tensor<T>& x, const Tensor<T>& dy, double p, Layout l) {
  Tensor<T> dx = detail::output<T>(x.shape(), l);
  const std::array<Strides, 3> st{dx.strides(), x.strides(), dy.strides()};
  const T pt = static_cast<T>(p);
  T *pdx = dx.data(), *px = x.data(), *pd = dy.data();
  detail::for_each_broadcast(x.shape(), st, [&](const std::array<std::int64_t, 3>& o) {
    pdx[o[0]] = pd[o[2]] * detail::unary_derivative(op, px[o[1]], pt);
  });
  return dx;
}

// 1 where a op b holds, else 0 (NaN compares false except under ne), at `shape`, row-major.
template <CpuFloat T>
Tensor<std::uint8_t> compare(CompareOp op, const Tensor<T>& a, const Tensor<T>& b, const Shape& shape) {
  Tensor<std::uint8_t> y = detail::output<std::uint8_t>(shape, Layout::row_major);
  const std::array<Strides, 3> st{y.strides(), detail::strides_at(a, shape), detail::strides_at(b, shape)};
  std::uint8_t* py = y.data();
  T *pa = a.data(), *pb = b.data();
  detail::for_each_broadcast(shape, st, [&](const std::array<std::int64_t, 3>& o) {
    py[o[0]] = detail::compare_value(op, pa[o[1]], pb[o[2]]) ? 1 : 0;
  });
  return y;
}

// cond != 0 ? a : b at `shape`, row-major.
template <CpuFloat T>
Tensor<T> where(const Tensor<std::uint8_t>& cond, const Tensor<T>& a, const Tensor<T>& b, const Shape& shape) {
  Tensor<T> y = detail::output<T>(shape, Layout::row_major);
  const std::array<Strides, 4> st{y.strides(), detail::strides_at(cond, shape), detail::strides_at(a, shape),
                                  detail::strides_at(b, shape)};
  const std::uint8_t* pc = cond.data();
  T *py = y.data(), *pa = a.data(), *pb = b.data();
  detail::for_each_broadcast(shape, st, [&](const std::array<std::int64_t, 4>& o) {
    py[o[0]] = pc[o[1]] != 0 ? pa[o[2]] : pb[o[3]];
  });
  return y;
}

// dy where cond selects a (which 0) or b (which 1), else 0, at dy's shape, row-major.
template <CpuFloat T>
Tensor<T> where_grad(const Tensor<std::uint8_t>& cond, const Tensor<T>& dy, int which) {
  const Shape& shape = dy.shape();
  Tensor<T> g = detail::output<T>(shape, Layout::row_major);
  const std::array<Strides, 3> st{g.strides(), detail::strides_at(cond, shape), dy.strides()};
  const std::uint8_t* pc = cond.data();
  T *pg = g.data(), *pd = dy.data();
  detail::for_each_broadcast(shape, st, [&](const std::array<std::int64_t, 3>& o) {
    pg[o[0]] = ((pc[o[1]] != 0) == (which == 0)) ? pd[o[2]] : T(0);
  });
  return g;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
