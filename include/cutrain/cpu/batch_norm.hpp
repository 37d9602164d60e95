// Batch normalization on the CPU: training and inference forward, backward. x is [N,C,H,W]
// (any layout) or [N,C]; statistics are per channel, over N, H and W.
//
// Sums and statistics are accumulated in double whatever T is, so that this oracle is at least
// as accurate as any backend it checks; results are rounded to T once, at the end.
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
// x seen as [N, C, S] contiguous after staging, with S = H * W (1 for a 2-d x).
struct BatchNormDims {
  std::int64_t n, c, s;
  std::int64_t per_channel() const { return n * s; }
};

template <class T>
BatchNormDims batch_norm_dims(const Tensor<T>& x) {
  return {x.dim(0), x.dim(1), x.rank() == 4 ? x.dim(2) * x.dim(3) : 1};
}

template <class T>
std::vector<double> batch_norm_to_double(const Tensor<T>& t) {
  const auto v = t.to_vector();
  return {v.begin(), v.end()};
}

template <class T>
Tensor<T> batch_norm_channel_tensor(const std::vector<double>& v) {
  Tensor<T> t(Shape{static_cast<std::int64_t>(v.size())});
  for (std::size_t i = 0; i < v.size(); ++i) t.data()[i] = static_cast<T>(v[i]);
  return t;
}

// y = gamma * (x - mean) * inv_std + beta per channel, into a new row-major tensor.
template <class T>
Tensor<T> batch_norm_apply(const Tensor<T>& x, const std::vector<double>& mean, const std::vector<double>& inv_std,
                           const std::vector<double>& gamma, const std::vector<double>& beta) {
  const auto d = batch_norm_dims(x);
  const Tensor<T> xs = row_major(x);
  Tensor<T> y(x.shape());
  const T* xp = xs.data();
  T* yp = y.data();
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t c = 0; c < d.c; ++c) {
      const auto uc = static_cast<std::size_t>(c);
      const double scale = gamma[uc] * inv_std[uc];
      const std::int64_t base = (n * d.c + c) * d.s;
      for (std::int64_t i = base; i < base + d.s; ++i)
        yp[i] = static_cast<T>(scale * (static_cast<double>(xp[i]) - mean[uc]) + beta[uc]);
    }
  return y;
}
}  // namespace detail

// Batch statistics normalize x; running_mean/var are updated in place with the unbiased variance.
template <CpuFloat T>
BatchNormForward<T> batch_norm_forward_training(const Tensor<T>& x, const Tensor<T>& gamma, const Tensor<T>& beta,
                                                Tensor<T>& running_mean, Tensor<T>& running_var,
                                                const BatchNormParams& p) {
  const auto d = detail::batch_norm_dims(x);
  const auto uc = static_cast<std::size_t>(d.c);
  const double m = static_cast<double>(d.per_channel());
  const Tensor<T> xs = row_major(x);
  const T* xp = xs.data();

  // Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels.
  std::vector<double> mean(uc, 0.0), var(uc, 0.0), inv_std(uc);
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t c = 0; c < d.c; ++c) {
      const std::int64_t base = (n * d.c + c) * d.s;
      for (std::int64_t i = base; i < base + d.s; ++i) mean[static_cast<std::size_t>(c)] += xp[i];
    }
  for (auto& v : mean) v /= m;
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t c = 0; c < d.c; ++c) {
      const auto cc = static_cast<std::size_t>(c);
      const std::int64_t base = (n * d.c + c) * d.s;
      for (std::int64_t i = base; i < base + d.s; ++i) {
        const double dev = static_cast<double>(xp[i]) - mean[cc];
        var[cc] += dev * dev;
      }
    }
  for (std::size_t c = 0; c < uc; ++c) {
    var[c] /= m;
    inv_std[c] = 1.0 / std::sqrt(var[c] + p.eps);
  }

  Tensor<T> y = detail::batch_norm_apply(x, mean, inv_std, detail::batch_norm_to_double(gamma),
                                         detail::batch_norm_to_double(beta));

  // Running stats last: nothing below can fail, so they change only when the call succeeds.
  const auto rm = detail::batch_norm_to_double(running_mean);
  const auto rv = detail::batch_norm_to_double(running_var);
  for (std::size_t c = 0; c < uc; ++c) {
    const auto ic = static_cast<std::int64_t>(c);
    running_mean.flat(ic) = static_cast<T>((1 - p.momentum) * rm[c] + p.momentum * mean[c]);
    running_var.flat(ic) = static_cast<T>((1 - p.momentum) * rv[c] + p.momentum * var[c] * m / (m - 1));
  }
  return {in_layout_of(std::move(y), x), detail::batch_norm_channel_tensor<T>(mean),
          detail::batch_norm_channel_tensor<T>(inv_std)};
}

// y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta.
template <CpuFloat T>
Tensor<T> batch_norm_forward_inference(const Tensor<T>& x, const Tensor<T>& gamma, const Tensor<T>& beta,
                                       const Tensor<T>& running_mean, const Tensor<T>& running_var, double eps = 1e-5) {
  auto inv_std = detail::batch_norm_to_double(running_var);
  for (auto& v : inv_std) v = 1.0 / std::sqrt(v + eps);
  Tensor<T> y = detail::batch_norm_apply(x, detail::batch_norm_to_double(running_mean), inv_std,
                                         detail::batch_norm_to_double(gamma), detail::batch_norm_to_double(beta));
  return in_layout_of(std::move(y), x);
}

// With xhat = (x - mean) * inv_std and M = N*H*W per channel:
//   dbeta = sum dy, dgamma = sum dy * xhat, dx = gamma * inv_std / M * (M * dy - dbeta - xhat * dgamma).
template <CpuFloat T>
NormBackward<T> batch_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<T>& gamma,
                                    const Tensor<T>& save_mean, const Tensor<T>& save_inv_std) {
  const auto d = detail::batch_norm_dims(x);
  const auto uc = static_cast<std::size_t>(d.c);
  const double m = static_cast<double>(d.per_channel());
  const Tensor<T> xs = row_major(x);
  const Tensor<T> dys = row_major(dy);
  const T* xp = xs.data();
  const T* dyp = dys.data();
  const auto mean = detail::batch_norm_to_double(save_mean);
  const auto inv_std = detail::batch_norm_to_double(save_inv_std);
  const auto g = detail::batch_norm_to_double(gamma);

  std::vector<double> dgamma(uc, 0.0), dbeta(uc, 0.0);
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t c = 0; c < d.c; ++c) {
      const auto cc = static_cast<std::size_t>(c);
      const std::int64_t base = (n * d.c + c) * d.s;
      for (std::int64_t i = base; i < base + d.s; ++i) {
        const double xhat = (static_cast<double>(xp[i]) - mean[cc]) * inv_std[cc];
        dbeta[cc] += dyp[i];
        dgamma[cc] += dyp[i] * xhat;
      }
    }

  Tensor<T> dx(x.shape());
  T* dxp = dx.data();
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t c = 0; c < d.c; ++c) {
      const auto cc = static_cast<std::size_t>(c);
      const double k = g[cc] * inv_std[cc] / m;
      const std::int64_t base = (n * d.c + c) * d.s;
      for (std::int64_t i = base; i < base + d.s; ++i) {
        const double xhat = (static_cast<double>(xp[i]) - mean[cc]) * inv_std[cc];
        dxp[i] = static_cast<T>(k * (m * dyp[i] - dbeta[cc] - xhat * dgamma[cc]));
      }
    }
  return {in_layout_of(std::move(dx), x), detail::batch_norm_channel_tensor<T>(dgamma),
          detail::batch_norm_channel_tensor<T>(dbeta)};
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
