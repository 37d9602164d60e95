// Reductions over a set of axes on the CPU, forward and backward: sum (scaled: mean), max/min
// with their indices, var, p-norm. Any strides. Each output element walks its reduced elements
// in row-major order of the reduced axes and accumulates in double (also for f32); var is two
// passes (the mean, then the squared deviations). Outputs and gradients are new row-major
// tensors. The plan (core/params/reduce.hpp) has been checked by the caller.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cutrain/core/params/reduce.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
// Calls fn(o, offsets) for each output element o (row-major), offsets being the element offsets
// (from x.data()) of its n_red reduced elements in row-major order of the reduced axes.
template <class T, class Fn>
void for_each_reduction(const ReducePlan& p, const Tensor<T>& x, Fn&& fn) {
  std::vector<std::int64_t> kept_sizes, red_sizes;
  Strides kept_strides, red_strides;
  split_axes(p, x, false, kept_sizes, kept_strides);
  split_axes(p, x, true, red_sizes, red_strides);
  const Shape kept(std::move(kept_sizes)), red(std::move(red_sizes));
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(p.n_red));
  cutrain::detail::for_each_offset(kept, kept_strides, 0, [&](std::int64_t o, std::int64_t base) {
    cutrain::detail::for_each_offset(red, red_strides, base,
                                     [&](std::int64_t j, std::int64_t off) { offsets[static_cast<std::size_t>(j)] = off; });
    fn(o, offsets);
  });
}

// Offsets of one input element (row-major index i) in x and in the output-shaped tensors.
struct GradOffsets {
  std::int64_t x = 0, dy = 0, aux = 0, red = 0;
};

// Calls fn(i, offsets) for every input element i in row-major order: x's offset (x_strides),
// dy's (dy_strides, output-shaped) and aux's (aux_strides, output-shaped: indices, mean or y),
// and the element's row-major index over the reduced axes.
template <class Fn>
void for_each_grad(const ReducePlan& p, const Strides& x_strides, const Strides& dy_strides, const Strides& aux_strides,
                   Fn&& fn) {
  const int r = p.in_shape.rank();
  const Strides dys = broadcast_strides(p, dy_strides), auxs = broadcast_strides(p, aux_strides);
  const Strides reds = reduced_index_strides(p);
  const std::int64_t n = p.in_shape.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    GradOffsets g;
    std::int64_t rest = i;
    for (int d = r - 1; d >= 0; --d) {
      const auto ud = static_cast<std::size_t>(d);
      const std::int64_t c = rest % p.in_shape[d];
      rest /= p.in_shape[d];
      g.x += c * x_strides[ud];
      g.dy += c * dys[ud];
      g.aux += c * auxs[ud];
      g.red += c * reds[ud];
    }
    fn(i, g);
  }
}

// a beats b (a max when is_max, else a min): NaN beats everything, ties go to the lower index.
template <class T>
bool arg_better(T a, std::int64_t ia, T b, std::int64_t ib, bool is_max) {
  const bool an = std::isnan(a), bn = std::isnan(b);
  if (an || bn) return an && (!bn || ia < ib);
  if (a != b) return is_max ? a > b : a < b;
  return ia < ib;
}
}  // namespace detail

// y = scale * sum over the reduced axes (scale 1: sum; 1 / n_red: mean).
template <CpuFloat T>
Tensor<T> reduce_sum(const Tensor<T>& x, const ReducePlan& p, double scale) {
  Tensor<T> y(p.out_shape);
  const T* xd = x.data();
  detail::for_each_reduction(p, x, [&](std::int64_t o, const std::vector<std::int64_t>& offs) {
    double s = 0;
    for (std::int64_t off : offs) s += static_cast<double>(xd[off]);
    y.data()[o] = static_cast<T>(s * scale);
  });
  return y;
}

// The max (is_max) or min over the reduced axes, and where it is (p.n_red > 0).
template <CpuFloat T>
ArgReduce<T> reduce_arg(const Tensor<T>& x, const ReducePlan& p, bool is_max) {
  ArgReduce<T> r{Tensor<T>(p.out_shape), Tensor<std::int32_t>(p.out_shape)};
  const T* xd = x.data();
  detail::for_each_reduction(p, x, [&](std::int64_t o, const std::vector<std::int64_t>& offs) {
    std::int64_t best = 0;
    for (std::int64_t j = 1; j < static_cast<std::int64_t>(offs.size()); ++j)
      if (detail::arg_better(xd[offs[static_cast<std::size_t>(j)]], j, xd[offs[static_cast<std::size_t>(best)]], best, is_max))
        best = j;
    r.values.data()[o] = xd[offs[static_cast<std::size_t>(best)]];
    r.indices.data()[o] = static_cast<std::int32_t>(best);
  });
  return r;
}

// sum (x - mean)^2 / (n_red - correction), n_red - correction > 0.
template <CpuFloat T>
Tensor<T> reduce_var(const Tensor<T>& x, const ReducePlan& p, double correction) {
  Tensor<T> y(p.out_shape);
  const T* xd = x.data();
  const double n = static_cast<double>(p.n_red);
  detail::for_each_reduction(p, x, [&](std::int64_t o, const std::vector<std::int64_t>& offs) {
    double s = 0;
    for (std::int64_t off : offs) s += static_cast<double>(xd[off]);
    const double mean = s / n;
    double ss = 0;
    for (std::int64_t off : offs) ss += (static_cast<double>(xd[off]) - mean) * (static_cast<double>(xd[off]) - mean);
    y.data()[o] = static_cast<T>(ss / (n - correction));
  });
  return y;
}

// (sum |x|^pn)^(1 / pn), pn finite and >= 1.
template <CpuFloat T>
Tensor<T> reduce_norm(const Tensor<T>& x, const ReducePlan& p, double pn) {
  Tensor<T> y(p.out_shape);
  const T* xd = x.data();
  detail::for_each_reduction(p, x, [&](std::int64_t o, const std::vector<std::int64_t>& offs) {
    double s = 0;
    for (std::int64_t off : offs) s += std::pow(std::abs(static_cast<double>(xd[off])), pn);
    y.data()[o] = static_cast<T>(std::pow(s, 1.0 / pn));
  });
  return y;
}

// dx = scale * dy broadcast over the reduced axes (sum: scale 1; mean: 1 / n_red).
template <CpuFloat T>
Tensor<T> reduce_sum_backward(const Tensor<T>& dy, const ReducePlan& p, double scale) {
  Tensor<T> dx(p.in_shape);
  const Strides row = contiguous_strides(p.in_shape, Layout::row_major);
  detail::for_each_grad(p, row, dy.strides(), dy.strides(), [&](std::int64_t i, const detail::GradOffsets& g) {
    dx.data()[i] = static_cast<T>(static_cast<double>(dy.data()[g.dy]) * scale);
  });
  return dx;
}

// dx = dy at the element indices names (max and min), 0 elsewhere.
template <CpuFloat T>
Tensor<T> reduce_arg_backward(const Tensor<T>& dy, const Tensor<std::int32_t>& indices, const ReducePlan& p) {
  Tensor<T> dx(p.in_shape);
  const Strides row = contiguous_strides(p.in_shape, Layout::row_major);
  detail::for_each_grad(p, row, dy.strides(), indices.strides(), [&](std::int64_t i, const detail::GradOffsets& g) {
    dx.data()[i] = indices.data()[g.aux] == g.red ? dy.data()[g.dy] : T(0);
  });
  return dx;
}

// dx = dy * 2 (x - mean) / (n_red - correction).
template <CpuFloat T>
Tensor<T> reduce_var_backward(const Tensor<T>& x, const Tensor<T>& dy, const ReducePlan& p, double correction) {
  const Tensor<T> mean = reduce_sum(x, p, 1.0 / static_cast<double>(p.n_red));
  Tensor<T> dx(p.in_shape);
  const double k = 2.0 / (static_cast<double>(p.n_red) - correction);
  detail::for_each_grad(p, x.strides(), dy.strides(), mean.strides(), [&](std::int64_t i, const detail::GradOffsets& g) {
    dx.data()[i] = static_cast<T>(static_cast<double>(dy.data()[g.dy]) * k *
                                  (static_cast<double>(x.data()[g.x]) - static_cast<double>(mean.data()[g.aux])));
  });
  return dx;
}

// y = norm_pn(x): dx = dy sign(x) |x|^(pn - 1) / y^(pn - 1); 0 where y is 0.
template <CpuFloat T>
Tensor<T> reduce_norm_backward(const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& dy, const ReducePlan& p,
                               double pn) {
  Tensor<T> dx(p.in_shape);
  detail::for_each_grad(p, x.strides(), dy.strides(), y.strides(), [&](std::int64_t i, const detail::GradOffsets& g) {
    const double xv = static_cast<double>(x.data()[g.x]), yv = static_cast<double>(y.data()[g.aux]);
    const double d = static_cast<double>(dy.data()[g.dy]);
    const double sign = xv > 0 ? 1.0 : xv < 0 ? -1.0 : 0.0;
    double v = 0;
    if (pn == 1) v = d * sign;
    else if (yv != 0) v = d * sign * std::pow(std::abs(xv) / yv, pn - 1);
    dx.data()[i] = static_cast<T>(v);
  });
  return dx;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
