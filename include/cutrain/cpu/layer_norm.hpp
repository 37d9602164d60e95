// Layer normalization on the CPU: x [N, ...] is normalized per sample over all dims but the
// first; gamma and beta have x's shape without dim 0 and scale element (n, rest) by gamma(rest).
//
// As in batch_norm.hpp, sums and statistics are accumulated in double and rounded to T at the end.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "cutrain/core/params/norm.hpp"
#include "cutrain/cpu/common.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
template <class T>
std::vector<double> layer_norm_to_double(const Tensor<T>& t) {
  const auto v = t.to_vector();
  return {v.begin(), v.end()};
}

template <class T>
Tensor<T> layer_norm_from_double(const std::vector<double>& v, const Shape& shape) {
  Tensor<T> t(shape);
  for (std::size_t i = 0; i < v.size(); ++i) t.data()[i] = static_cast<T>(v[i]);
  return t;
}

inline Shape layer_norm_row_shape(const Shape& x) {
  return Shape(std::vector<std::int64_t>(x.dims().begin() + 1, x.dims().end()));
}
}  // namespace detail

template <CpuFloat T>
LayerNormForward<T> layer_norm_forward(const Tensor<T>& x, const Tensor<T>& gamma, const Tensor<T>& beta,
                                       double eps = 1e-5) {
  const std::int64_t rows = x.dim(0), d = x.numel() / rows;
  const auto ur = static_cast<std::size_t>(rows);
  const Tensor<T> xs = row_major(x);
  const T* xp = xs.data();
  const auto g = detail::layer_norm_to_double(gamma);
  const auto b = detail::layer_norm_to_double(beta);

  std::vector<double> mean(ur, 0.0), inv_std(ur);
  Tensor<T> y(x.shape());
  T* yp = y.data();
  for (std::int64_t n = 0; n < rows; ++n) {
    const T* row = xp + n * d;
    const auto un = static_cast<std::size_t>(n);
    // Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels.
    for (std::int64_t j = 0; j < d; ++j) mean[un] += row[j];
    mean[un] /= static_cast<double>(d);
    double var = 0;
    for (std::int64_t j = 0; j < d; ++j) {
      const double dev = static_cast<double>(row[j]) - mean[un];
      var += dev * dev;
    }
    var /= static_cast<double>(d);
    inv_std[un] = 1.0 / std::sqrt(var + eps);
    for (std::int64_t j = 0; j < d; ++j) {
      const auto uj = static_cast<std::size_t>(j);
      yp[n * d + j] = static_cast<T>(g[uj] * (static_cast<double>(row[j]) - mean[un]) * inv_std[un] + b[uj]);
    }
  }
  const Shape stat_shape{rows};
  return {in_layout_of(std::move(y), x), detail::layer_norm_from_double<T>(mean, stat_shape),
          detail::layer_norm_from_double<T>(inv_std, stat_shape)};
}

// With xhat = (x - mean) * inv_std per row of D elements and g = dy * gamma:
//   dbeta = sum over rows of dy, dgamma = sum over rows of dy * xhat,
//   dx = inv_std / D * (D * g - sum_row g - xhat * sum_row g * xhat).
template <CpuFloat T>
NormBackward<T> layer_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<T>& gamma,
                                    const Tensor<T>& mean, const Tensor<T>& inv_std) {
  const std::int64_t rows = x.dim(0), d = x.numel() / rows;
  const auto ud = static_cast<std::size_t>(d);
  const Tensor<T> xs = row_major(x);
  const Tensor<T> dys = row_major(dy);
  const T* xp = xs.data();
  const T* dyp = dys.data();
  const auto g = detail::layer_norm_to_double(gamma);
  const auto mu = detail::layer_norm_to_double(mean);
  const auto is = detail::layer_norm_to_double(inv_std);

  std::vector<double> dgamma(ud, 0.0), dbeta(ud, 0.0), xhat(ud);
  Tensor<T> dx(x.shape());
  T* dxp = dx.data();
  for (std::int64_t n = 0; n < rows; ++n) {
    const auto un = static_cast<std::size_t>(n);
    const std::int64_t base = n * d;
    double sum_g = 0, sum_gx = 0;
    for (std::size_t j = 0; j < ud; ++j) {
      const auto i = base + static_cast<std::int64_t>(j);
      xhat[j] = (static_cast<double>(xp[i]) - mu[un]) * is[un];
      const double gj = dyp[i] * g[j];
      sum_g += gj;
      sum_gx += gj * xhat[j];
      dbeta[j] += dyp[i];
      dgamma[j] += dyp[i] * xhat[j];
    }
    const double k = is[un] / static_cast<double>(d);
    for (std::size_t j = 0; j < ud; ++j) {
      const auto i = base + static_cast<std::int64_t>(j);
      dxp[i] = static_cast<T>(k * (static_cast<double>(d) * dyp[i] * g[j] - sum_g - xhat[j] * sum_gx));
    }
  }
  const Shape row_shape = detail::layer_norm_row_shape(x.shape());
  return {in_layout_of(std::move(dx), x), detail::layer_norm_from_double<T>(dgamma, row_shape),
          detail::layer_norm_from_double<T>(dbeta, row_shape)};
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
