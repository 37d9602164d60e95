// RMS normalization on the CPU (torch.nn.RMSNorm): x [N, ...] is scaled per row by the inverse
// root mean square of all dims but the first, y = gamma * x * inv_rms; gamma has x's shape
// without dim 0. ops/rms_norm.hpp brings any normalized shape to this form.
//
// As in layer_norm.hpp, sums are accumulated in double and rounded to T at the end.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "cutrain/core/params/norm.hpp"
#include "cutrain/cpu/common.hpp"
#include "cutrain/cpu/layer_norm.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

// inv_rms = 1 / sqrt(sum_j x_j^2 / D + eps) per row of D elements.
template <CpuFloat T>
RmsNormForward<T> rms_norm_forward(const Tensor<T>& x, const Tensor<T>& gamma, double eps = 1e-5) {
  const std::int64_t rows = x.dim(0), d = x.numel() / rows;
  const Tensor<T> xs = row_major(x);
  const T* xp = xs.data();
  const auto g = detail::layer_norm_to_double(gamma);

  std::vector<double> inv_rms(static_cast<std::size_t>(rows));
  Tensor<T> y(x.shape());
  T* yp = y.data();
  for (std::int64_t n = 0; n < rows; ++n) {
    const T* row = xp + n * d;
    double ss = 0;
    for (std::int64_t j = 0; j < d; ++j) ss += static_cast<double>(row[j]) * static_cast<double>(row[j]);
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(d) + eps);
    inv_rms[static_cast<std::size_t>(n)] = r;
    for (std::int64_t j = 0; j < d; ++j)
      yp[n * d + j] = static_cast<T>(g[static_cast<std::size_t>(j)] * static_cast<double>(row[j]) * r);
  }
  return {in_layout_of(std::move(y), x), detail::layer_norm_from_double<T>(inv_rms, Shape{rows})};
}

// With xhat = x * inv_rms per row of D elements and g = dy * gamma:
//   dgamma = sum over rows of dy * xhat,
//   dx = inv_rms * (g - xhat * sum_row(g * xhat) / D).
template <CpuFloat T>
RmsNormBackward<T> rms_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<T>& gamma,
                                     const Tensor<T>& inv_rms) {
  const std::int64_t rows = x.dim(0), d = x.numel() / rows;
  const auto ud = static_cast<std::size_t>(d);
  const Tensor<T> xs = row_major(x);
  const Tensor<T> dys = row_major(dy);
  const T* xp = xs.data();
  const T* dyp = dys.data();
  const auto g = detail::layer_norm_to_double(gamma);
  const auto ir = detail::layer_norm_to_double(inv_rms);

  std::vector<double> dgamma(ud, 0.0), xhat(ud);
  Tensor<T> dx(x.shape());
  T* dxp = dx.data();
  for (std::int64_t n = 0; n < rows; ++n) {
    const double r = ir[static_cast<std::size_t>(n)];
    const std::int64_t base = n * d;
    double sum_gx = 0;
    for (std::size_t j = 0; j < ud; ++j) {
      const auto i = base + static_cast<std::int64_t>(j);
      xhat[j] = static_cast<double>(xp[i]) * r;
      const double dyi = static_cast<double>(dyp[i]);
      sum_gx += dyi * g[j] * xhat[j];
      dgamma[j] += dyi * xhat[j];
    }
    const double mean_gx = sum_gx / static_cast<double>(d);
    for (std::size_t j = 0; j < ud; ++j) {
      const auto i = base + static_cast<std::int64_t>(j);
      dxp[i] = static_cast<T>(r * (static_cast<double>(dyp[i]) * g[j] - xhat[j] * mean_gx));
    }
  }
  return {in_layout_of(std::move(dx), x),
          detail::layer_norm_from_double<T>(dgamma, detail::layer_norm_row_shape(x.shape()))};
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
