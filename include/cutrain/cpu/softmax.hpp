// Softmax and log-softmax over the last dimension of a 2-d [N, C] tensor, on the CPU.
// Each row is shifted by its maximum first, so large logits do not overflow exp().
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cmath>

#include "cutrain/cpu/common.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
// For one row of C logits: the maximum and log(sum exp(x - max)), so that
// log_softmax(x)_c = x_c - max - log_sum.
template <class T>
void row_log_normalizer(const T* x, std::int64_t C, T& max, T& log_sum) {
  max = *std::max_element(x, x + C);
  T s = 0;
  for (std::int64_t c = 0; c < C; ++c) s += std::exp(x[c] - max);
  log_sum = std::log(s);  // s >= 1: the max element contributes exp(0)
}
}  // namespace detail

template <CpuFloat T>
Tensor<T> softmax_forward(const Tensor<T>& x) {
  const auto N = x.dim(0), C = x.dim(1);
  const Tensor<T> xs = row_major(x);
  Tensor<T> y({N, C});
  for (std::int64_t i = 0; i < N; ++i) {
    const T* xr = xs.data() + i * C;
    T* yr = y.data() + i * C;
    T max, log_sum;
    detail::row_log_normalizer(xr, C, max, log_sum);
    for (std::int64_t c = 0; c < C; ++c) yr[c] = std::exp(xr[c] - max - log_sum);
  }
  return y;
}

template <CpuFloat T>
Tensor<T> log_softmax_forward(const Tensor<T>& x) {
  const auto N = x.dim(0), C = x.dim(1);
  const Tensor<T> xs = row_major(x);
  Tensor<T> y({N, C});
  for (std::int64_t i = 0; i < N; ++i) {
    const T* xr = xs.data() + i * C;
    T* yr = y.data() + i * C;
    T max, log_sum;
    detail::row_log_normalizer(xr, C, max, log_sum);
    for (std::int64_t c = 0; c < C; ++c) yr[c] = xr[c] - max - log_sum;
  }
  return y;
}

// y = softmax(x): dx_c = y_c (dy_c - sum_k dy_k y_k).
template <CpuFloat T>
Tensor<T> softmax_backward(const Tensor<T>& y, const Tensor<T>& dy) {
  const auto N = y.dim(0), C = y.dim(1);
  const Tensor<T> ys = row_major(y), dys = row_major(dy);
  Tensor<T> dx({N, C});
  for (std::int64_t i = 0; i < N; ++i) {
    const T* yr = ys.data() + i * C;
    const T* dyr = dys.data() + i * C;
    T dot = 0;
    for (std::int64_t c = 0; c < C; ++c) dot += dyr[c] * yr[c];
    for (std::int64_t c = 0; c < C; ++c) dx.data()[i * C + c] = yr[c] * (dyr[c] - dot);
  }
  return dx;
}

// y = log_softmax(x): dx_c = dy_c - exp(y_c) sum_k dy_k.
template <CpuFloat T>
Tensor<T> log_softmax_backward(const Tensor<T>& y, const Tensor<T>& dy) {
  const auto N = y.dim(0), C = y.dim(1);
  const Tensor<T> ys = row_major(y), dys = row_major(dy);
  Tensor<T> dx({N, C});
  for (std::int64_t i = 0; i < N; ++i) {
    const T* yr = ys.data() + i * C;
    const T* dyr = dys.data() + i * C;
    T sum = 0;
    for (std::int64_t c = 0; c < C; ++c) sum += dyr[c];
    for (std::int64_t c = 0; c < C; ++c) dx.data()[i * C + c] = dyr[c] - std::exp(yr[c]) * sum;
  }
  return dx;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
