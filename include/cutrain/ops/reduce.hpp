// Reductions over any set of axes, with keepdim: sum, mean, max/min (with argmax/argmin), var,
// norm, and their backwards; dispatch on the tensor's device (docs/ops/reductions.md).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>

#include "cutrain/core/params/reduce.hpp"
#include "cutrain/cpu/reduce.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/reduce.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// x defined, the axes valid for it: the plan.
template <class T>
ReducePlan reduce_plan(std::string_view op, const Tensor<T>& x, const Axes& axes, bool keepdim, std::string_view name = "x") {
  check::defined(op, x, name);
  return make_reduce_plan(op, x.shape(), axes, keepdim);
}

// An op that needs at least `least` elements per output (max, min: 1; mean: 1; var: more than
// its correction), unless there are no outputs.
inline void require_reduced(std::string_view op, const ReducePlan& p, double least, std::string_view why) {
  CUTRAIN_REQUIRE(p.n_out == 0 || static_cast<double>(p.n_red) >= least, InvalidArgument, op, why, "; x has shape ",
                  p.in_shape, ", and the reduced axes hold ", p.n_red, " elements per output (output shape ",
                  p.out_shape, ")");
}

// dy (and any saved output-shaped tensor) must have the plan's output shape.
template <class T>
void check_reduce_grad(std::string_view op, const Tensor<T>& t, const ReducePlan& p, std::string_view name) {
  check::defined(op, t, name);
  CUTRAIN_REQUIRE(t.shape() == p.out_shape, InvalidArgument, op, name, " must have the output's shape ", p.out_shape,
                  " (input shape ", p.in_shape, "), got ", t.describe());
}

// x_shape: valid (no negative dims) for a backward that is given only a shape.
inline void check_in_shape(std::string_view op, const Shape& x_shape) { check_shape_valid(op, x_shape); }

template <class T>
Tensor<T> sum_scaled(std::string_view op, const Tensor<T>& x, const ReducePlan& p, double scale) {
  return dispatch<Tensor<T>>(
      op, [&](const auto& x) { return cpu::reduce_sum(x, p, scale); },
      CUTRAIN_IF_CUDA([&](const auto& x) {
        Tensor<T> y(p.out_shape, {.device = x.device()});
        cuda::kernels::reduce_sum(x, p, scale, y);
        return y;
      }),
      x);
}

template <class T>
ArgReduce<T> arg_reduce(std::string_view op, const Tensor<T>& x, const ReducePlan& p, bool is_max) {
  require_reduced(op, p, 1, "there is no max or min of zero elements");
  CUTRAIN_REQUIRE(p.n_red <= std::numeric_limits<std::int32_t>::max(), InvalidArgument, op,
                  "int32 indices address at most 2^31 - 1 reduced elements, got ", p.n_red, " for x ", x.describe());
  return dispatch<ArgReduce<T>>(
      op, [&](const auto& x) { return cpu::reduce_arg(x, p, is_max); },
      CUTRAIN_IF_CUDA([&](const auto& x) {
        ArgReduce<T> r{Tensor<T>(p.out_shape, {.device = x.device()}),
                       Tensor<std::int32_t>(p.out_shape, {.device = x.device()})};
        cuda::kernels::reduce_arg(x, p, is_max, r.values, r.indices);
        return r;
      }),
      x);
}

template <class T>
Tensor<T> arg_backward(std::string_view op, const Tensor<T>& dy, const Tensor<std::int32_t>& indices,
                       const Shape& x_shape, const Axes& axes, bool keepdim) {
  check_in_shape(op, x_shape);
  const ReducePlan p = make_reduce_plan(op, x_shape, axes, keepdim);
  check_reduce_grad(op, dy, p, "dy");
  check_reduce_grad(op, indices, p, "indices");
  check::same_device(op, dy, indices);
  return dispatch<Tensor<T>>(
      op, [&](const auto& dy) { return cpu::reduce_arg_backward(dy, indices, p); },
      CUTRAIN_IF_CUDA([&](const auto& dy) {
        Tensor<T> dx(p.in_shape, {.device = dy.device()});
        cuda::kernels::reduce_arg_backward(dy, indices, p, dx);
        return dx;
      }),
      dy);
}

inline void check_correction(std::string_view op, double correction) {
  CUTRAIN_REQUIRE(std::isfinite(correction) && correction >= 0, InvalidArgument, op,
                  "correction must be finite and >= 0, got ", correction);
}

inline void check_norm_p(std::string_view op, double p) {
  CUTRAIN_REQUIRE(std::isfinite(p) && p >= 1, InvalidArgument, op, "p must be finite and >= 1, got ", p);
}
}  // namespace detail

// The sum over `axes` (empty: all). keepdim keeps each reduced axis with size 1. Zero elements
// per output sum to 0.
template <class T>
Tensor<T> sum(const Tensor<T>& x, const Axes& axes = {}, bool keepdim = false) {
  constexpr std::string_view op = "sum";
  const ReducePlan p = detail::reduce_plan(op, x, axes, keepdim);
  return detail::sum_scaled(op, x, p, 1.0);
}

// The mean over `axes` (empty: all); at least one element per output.
template <class T>
Tensor<T> mean(const Tensor<T>& x, const Axes& axes = {}, bool keepdim = false) {
  constexpr std::string_view op = "mean";
  const ReducePlan p = detail::reduce_plan(op, x, axes, keepdim);
  detail::require_reduced(op, p, 1, "the mean of zero elements is undefined");
  return detail::sum_scaled(op, x, p, 1.0 / static_cast<double>(p.n_red));
}

// The max over `axes` (empty: all) and where it is: indices count row-major over the reduced
// axes. NaN is the max of anything it is in; of equal maxima the first (lowest index) wins.
template <class T>
ArgReduce<T> max_with_indices(const Tensor<T>& x, const Axes& axes = {}, bool keepdim = false) {
  constexpr std::string_view op = "max";
  return detail::arg_reduce(op, x, detail::reduce_plan(op, x, axes, keepdim), true);
}

// As max_with_indices, for the min (NaN is the min of anything it is in).
template <class T>
ArgReduce<T> min_with_indices(const Tensor<T>& x, const Axes& axes = {}, bool keepdim = false) {
  constexpr std::string_view op = "min";
  return detail::arg_reduce(op, x, detail::reduce_plan(op, x, axes, keepdim), false);
}

template <class T>
Tensor<T> max(const Tensor<T>& x, const Axes& axes = {}, bool keepdim = false) {
  return max_with_indices(x, axes, keepdim).values;
}
template <class T>
Tensor<T> min(const Tensor<T>& x, const Axes& axes = {}, bool keepdim = false) {
  return min_with_indices(x, axes, keepdim).values;
}
namespace detail {
// The index of the last of equal maxima (minima): the first in x flipped along the reduced axes
// (a row-major index i there is n_red - 1 - i here). The flipped copy and the index arithmetic
// on the host cost a copy of x and a round trip: last is for the few calls that need it.
template <class T>
Tensor<std::int32_t> arg_last(std::string_view op, const Tensor<T>& x, const Axes& axes, bool keepdim, bool is_max) {
  const ReducePlan p = reduce_plan(op, x, axes, keepdim);
  std::vector<int> dims;
  for (int d = 0; d < x.rank(); ++d)
    if (p.reduced[static_cast<std::size_t>(d)]) dims.push_back(d);
  const Tensor<T> flipped = flip(x, dims).contiguous(Layout::row_major);
  auto idx = arg_reduce(op, flipped, p, is_max).indices.to_vector();
  for (auto& i : idx) i = static_cast<std::int32_t>(p.n_red - 1 - i);
  return Tensor<std::int32_t>::from_vector(idx, p.out_shape).to(x.device());
}
}  // namespace detail

// Where the max (min) is; of equal values the first, or with last the last (NumPy's and
// PyTorch's argmax take the first; ONNX's ArgMax has select_last_index).
template <class T>
Tensor<std::int32_t> argmax(const Tensor<T>& x, const Axes& axes = {}, bool keepdim = false, bool last = false) {
  if (last) return detail::arg_last("argmax", x, axes, keepdim, true);
  return max_with_indices(x, axes, keepdim).indices;
}
template <class T>
Tensor<std::int32_t> argmin(const Tensor<T>& x, const Axes& axes = {}, bool keepdim = false, bool last = false) {
  if (last) return detail::arg_last("argmin", x, axes, keepdim, false);
  return min_with_indices(x, axes, keepdim).indices;
}

// The variance over `axes` (empty: all): sum (x - mean)^2 / (n - correction), n the elements per
// output; correction 1 (default) is the unbiased estimate, 0 the biased one. n must exceed it.
template <class T>
Tensor<T> var(const Tensor<T>& x, const Axes& axes = {}, double correction = 1.0, bool keepdim = false) {
  constexpr std::string_view op = "var";
  detail::check_correction(op, correction);
  const ReducePlan p = detail::reduce_plan(op, x, axes, keepdim);
  CUTRAIN_REQUIRE(p.n_out == 0 || static_cast<double>(p.n_red) > correction, InvalidArgument, op, "correction ",
                  correction, " needs more than ", correction, " elements per output; x has shape ", x.shape(),
                  ", and the reduced axes hold ", p.n_red, " (output shape ", p.out_shape, ")");
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& x) { return cpu::reduce_var(x, p, correction); },
      CUTRAIN_IF_CUDA([&](const auto& x) {
        Tensor<T> y(p.out_shape, {.device = x.device()});
        cuda::kernels::reduce_var(x, p, correction, y);
        return y;
      }),
      x);
}

// The p-norm over `axes` (empty: all): (sum |x|^p)^(1/p), p finite and >= 1 (default 2).
// Zero elements per output give 0.
template <class T>
Tensor<T> norm(const Tensor<T>& x, double p = 2.0, const Axes& axes = {}, bool keepdim = false) {
  constexpr std::string_view op = "norm";
  detail::check_norm_p(op, p);
  const ReducePlan plan = detail::reduce_plan(op, x, axes, keepdim);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& x) { return cpu::reduce_norm(x, plan, p); },
      CUTRAIN_IF_CUDA([&](const auto& x) {
        Tensor<T> y(plan.out_shape, {.device = x.device()});
        cuda::kernels::reduce_norm(x, plan, p, y);
        return y;
      }),
      x);
}

// ---- backward: dx has x_shape, is row-major, on dy's device ---------------------------------

// dx = dy broadcast over the reduced axes. dy: sum's output shape for (x_shape, axes, keepdim).
template <class T>
Tensor<T> sum_backward(const Tensor<T>& dy, const Shape& x_shape, const Axes& axes = {}, bool keepdim = false) {
  constexpr std::string_view op = "sum_backward";
  detail::check_in_shape(op, x_shape);
  const ReducePlan p = make_reduce_plan(op, x_shape, axes, keepdim);
  detail::check_reduce_grad(op, dy, p, "dy");
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& dy) { return cpu::reduce_sum_backward(dy, p, 1.0); },
      CUTRAIN_IF_CUDA([&](const auto& dy) {
        Tensor<T> dx(p.in_shape, {.device = dy.device()});
        cuda::kernels::reduce_sum_backward(dy, p, 1.0, dx);
        return dx;
      }),
      dy);
}

// dx = dy / n broadcast over the reduced axes.
template <class T>
Tensor<T> mean_backward(const Tensor<T>& dy, const Shape& x_shape, const Axes& axes = {}, bool keepdim = false) {
  constexpr std::string_view op = "mean_backward";
  detail::check_in_shape(op, x_shape);
  const ReducePlan p = make_reduce_plan(op, x_shape, axes, keepdim);
  detail::check_reduce_grad(op, dy, p, "dy");
  detail::require_reduced(op, p, 1, "the mean of zero elements is undefined");
  const double scale = 1.0 / static_cast<double>(p.n_red);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& dy) { return cpu::reduce_sum_backward(dy, p, scale); },
      CUTRAIN_IF_CUDA([&](const auto& dy) {
        Tensor<T> dx(p.in_shape, {.device = dy.device()});
        cuda::kernels::reduce_sum_backward(dy, p, scale, dx);
        return dx;
      }),
      dy);
}

// dx = dy at the maximum max_with_indices chose (its indices), 0 elsewhere.
template <class T>
Tensor<T> max_backward(const Tensor<T>& dy, const Tensor<std::int32_t>& indices, const Shape& x_shape,
                       const Axes& axes = {}, bool keepdim = false) {
  return detail::arg_backward("max_backward", dy, indices, x_shape, axes, keepdim);
}

// dx = dy at the minimum min_with_indices chose, 0 elsewhere.
template <class T>
Tensor<T> min_backward(const Tensor<T>& dy, const Tensor<std::int32_t>& indices, const Shape& x_shape,
                       const Axes& axes = {}, bool keepdim = false) {
  return detail::arg_backward("min_backward", dy, indices, x_shape, axes, keepdim);
}

// dx = dy * 2 (x - mean) / (n - correction).
template <class T>
Tensor<T> var_backward(const Tensor<T>& x, const Tensor<T>& dy, const Axes& axes = {}, double correction = 1.0,
                       bool keepdim = false) {
  constexpr std::string_view op = "var_backward";
  detail::check_correction(op, correction);
  const ReducePlan p = detail::reduce_plan(op, x, axes, keepdim);
  detail::check_reduce_grad(op, dy, p, "dy");
  CUTRAIN_REQUIRE(p.n_out == 0 || static_cast<double>(p.n_red) > correction, InvalidArgument, op, "correction ",
                  correction, " needs more than ", correction, " elements per output; x has shape ", x.shape(),
                  ", and the reduced axes hold ", p.n_red);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& x, const auto& dy) { return cpu::reduce_var_backward(x, dy, p, correction); },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& dy) {
        Tensor<T> dx(p.in_shape, {.device = x.device()});
        cuda::kernels::reduce_var_backward(x, dy, p, correction, dx);
        return dx;
      }),
      x, dy);
}

// y = norm(x, p, axes, keepdim) (its output): dx = dy sign(x) (|x| / y)^(p - 1), 0 where y is 0.
template <class T>
Tensor<T> norm_backward(const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& dy, double p = 2.0,
                        const Axes& axes = {}, bool keepdim = false) {
  constexpr std::string_view op = "norm_backward";
  detail::check_norm_p(op, p);
  const ReducePlan plan = detail::reduce_plan(op, x, axes, keepdim);
  detail::check_reduce_grad(op, y, plan, "y");
  detail::check_reduce_grad(op, dy, plan, "dy");
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& x, const auto& y, const auto& dy) { return cpu::reduce_norm_backward(x, y, dy, plan, p); },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& y, const auto& dy) {
        Tensor<T> dx(plan.in_shape, {.device = x.device()});
        cuda::kernels::reduce_norm_backward(x, y, dy, plan, p, dx);
        return dx;
      }),
      x, y, dy);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
