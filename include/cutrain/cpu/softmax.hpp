// Softmax and log-softmax along one axis of a tensor of any rank >= 1, on the CPU (axis in
// [0, rank), default the last: the [N, C] rows of the loss). The tensor is read row-major as
// [outer, C, inner]: a row's C elements lie inner apart. Each row is shifted by its maximum
// first, so large logits do not overflow exp().
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cutrain/cpu/common.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
// x around axis: outer rows of C blocks of inner elements.
struct AxisRows {
  std::int64_t outer = 1, C = 1, inner = 1;
};

inline AxisRows axis_rows(const Shape& s, int axis) {
  AxisRows g;
  g.C = s[axis];
  for (int d = 0; d < axis; ++d) g.outer *= s[d];
  for (int d = axis + 1; d < s.rank(); ++d) g.inner *= s[d];
  return g;
}

inline int last_axis(int axis, int rank) { return axis < 0 ? axis + rank : axis; }

// For one row of C logits s apart: the maximum and log(sum exp(x - max)), so that
// log_softmax(x)_c = x_c - max - log_sum.
template <class T>
void row_log_normalizer(const T* x, std::int64_t C, std::int64_t s, T& max, T& log_sum) {
  max = x[0];
  for (std::int64_t c = 1; c < C; ++c) max = std::max(max, x[c * s]);
  T sum = 0;
  for (std::int64_t c = 0; c < C; ++c) sum += std::exp(x[c * s] - max);
  log_sum = std::log(sum);  // sum >= 1: the max element contributes exp(0)
}

// fn(offset of the row's first element, C, stride) for every row.
template <class Fn>
void for_each_row(const AxisRows& g, Fn&& fn) {
  for (std::int64_t o = 0; o < g.outer; ++o)
    for (std::int64_t i = 0; i < g.inner; ++i) fn(o * g.C * g.inner + i);
}

template <class T>
Tensor<T> softmax_fwd(const Tensor<T>& x, int axis, bool log) {
  axis = last_axis(axis, x.rank());
  const AxisRows g = axis_rows(x.shape(), axis);
  const Tensor<T> xs = row_major(x);
  Tensor<T> y(x.shape());
  const std::int64_t s = g.inner;
  for_each_row(g, [&](std::int64_t off) {
    const T* xr = xs.data() + off;
    T* yr = y.data() + off;
    T max, log_sum;
    row_log_normalizer(xr, g.C, s, max, log_sum);
    for (std::int64_t c = 0; c < g.C; ++c) {
      const T v = xr[c * s] - max - log_sum;
      yr[c * s] = log ? v : std::exp(v);
    }
  });
  return y;
}

// softmax: dx_c = y_c (dy_c - sum_k dy_k y_k); log-softmax: dx_c = dy_c - exp(y_c) sum_k dy_k.
template <class T>
Tensor<T> softmax_bwd(const Tensor<T>& y, const Tensor<T>& dy, int axis, bool log) {
  axis = last_axis(axis, y.rank());
  const AxisRows g = axis_rows(y.shape(), axis);
  const Tensor<T> ys = row_major(y), dys = row_major(dy);
  Tensor<T> dx(y.shape());
  const std::int64_t s = g.inner;
  for_each_row(g, [&](std::int64_t off) {
    const T* yr = ys.data() + off;
    const T* dyr = dys.data() + off;
    T* dxr = dx.data() + off;
    T acc = 0;
    for (std::int64_t c = 0; c < g.C; ++c) acc += log ? dyr[c * s] : dyr[c * s] * yr[c * s];
    for (std::int64_t c = 0; c < g.C; ++c)
      dxr[c * s] = log ? dyr[c * s] - std::exp(yr[c * s]) * acc : yr[c * s] * (dyr[c * s] - acc);
  });
  return dx;
}
}  // namespace detail

// y = exp(x - max) / sum exp(x - max) along axis (negative: from the end).
template <CpuFloat T>
Tensor<T> softmax_forward(const Tensor<T>& x, int axis = -1) {
  return detail::softmax_fwd(x, axis, false);
}

// y = x - max - log(sum exp(x - max)) along axis.
template <CpuFloat T>
Tensor<T> log_softmax_forward(const Tensor<T>& x, int axis = -1) {
  return detail::softmax_fwd(x, axis, true);
}

// y = softmax(x): dx_c = y_c (dy_c - sum_k dy_k y_k).
template <CpuFloat T>
Tensor<T> softmax_backward(const Tensor<T>& y, const Tensor<T>& dy, int axis = -1) {
  return detail::softmax_bwd(y, dy, axis, false);
}

// y = log_softmax(x): dx_c = dy_c - exp(y_c) sum_k dy_k.
template <CpuFloat T>
Tensor<T> log_softmax_backward(const Tensor<T>& y, const Tensor<T>& dy, int axis = -1) {
  return detail::softmax_bwd(y, dy, axis, true);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
