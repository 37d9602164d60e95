// batch_norm_forward_training / batch_norm_forward_inference / batch_norm_backward: validate,
// then dispatch on the tensors' device.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string_view>

#include "cutrain/cpu/batch_norm.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/cudnn/norm.hpp"
#include "cutrain/cuda/kernels/batch_norm_inference.hpp"
#include "cutrain/cuda/kernels/batch_norm_train.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// x must be [N,C] or [N,C,H,W] with no zero dimension; returns C.
template <class T>
std::int64_t batch_norm_check_x(std::string_view op, const Tensor<T>& x) {
  check::defined(op, x, "x");
  CUTRAIN_REQUIRE(x.rank() == 2 || x.rank() == 4, InvalidArgument, op, "x must be [N,C] or [N,C,H,W], got ",
                  x.describe());
  check::non_empty(op, x, "x");
  return x.dim(1);
}

// A per-channel tensor (gamma, beta, the statistics) must be [C] for x's C: the error gives both.
template <class T, class S>
void batch_norm_check_channels(std::string_view op, const Tensor<T>& x, const Tensor<S>& t, std::string_view name) {
  check::defined(op, t, name);
  CUTRAIN_REQUIRE(t.shape() == Shape{x.dim(1)}, InvalidArgument, op, name, " must have shape ", Shape{x.dim(1)},
                  " (one value per channel of x ", x.describe(), "), got ", t.describe());
}
}  // namespace detail

template <class T, class S>
BatchNormForward<T, S> batch_norm_forward_training(const Tensor<T>& x, const Tensor<S>& gamma, const Tensor<S>& beta,
                                                   Tensor<S>& running_mean, Tensor<S>& running_var,
                                                   const BatchNormParams& p) {
  constexpr std::string_view op = "batch_norm_forward_training";
  [[maybe_unused]] const Shape c{detail::batch_norm_check_x(op, x)};  // the GPU path sizes its statistics by it
  detail::batch_norm_check_channels(op, x, gamma, "gamma");
  detail::batch_norm_check_channels(op, x, beta, "beta");
  detail::batch_norm_check_channels(op, x, running_mean, "running_mean");
  detail::batch_norm_check_channels(op, x, running_var, "running_var");
  cutrain::detail::norm_check_eps(op, p.eps);
  cutrain::detail::norm_check_momentum(op, p.momentum);
  const std::int64_t per_channel = x.numel() / x.dim(1);
  CUTRAIN_REQUIRE(per_channel > 1, InvalidArgument, op, "x ", x.describe(),
                  " has one value per channel (N*H*W == 1): the unbiased variance for running_var is undefined");
  // The running statistics are updated in place: the implementations take them from here.
  return detail::dispatch<BatchNormForward<T, S>, detail::NormDtypes<T, S>>(
      op,
      [&](const auto& x, const auto& gamma, const auto& beta, const auto&, const auto&) {
        return cpu::batch_norm_forward_training(x, gamma, beta, running_mean, running_var, p);
      },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& gamma, const auto& beta, const auto&, const auto&) {
        const Device dev = x.device();
        BatchNormForward<T, S> r{detail::device_output<T>(x.shape(), x), Tensor<S>(c, {.device = dev}),
                                 Tensor<S>(c, {.device = dev})};
        Tensor<S> next_mean(c, {.device = dev}), next_var(c, {.device = dev});
        const auto xa = detail::aligned16(x);  // cuDNN refuses misaligned pointers (a slice's view)
        // cuDNN's batchnorm node; where it has no engine (odd C), cutrain's kernel.
        if (!cuda::cudnn::batch_norm_forward_training(xa, gamma, beta, running_mean, running_var, p, r.y, r.save_mean,
                                                      r.save_inv_std, next_mean, next_var))
          cuda::kernels::batch_norm_train_forward(x, gamma, beta, running_mean, running_var, p, r.y, r.save_mean,
                                                  r.save_inv_std, next_mean, next_var);
        running_mean.copy_from(next_mean);
        running_var.copy_from(next_var);
        return r;
      }),
      x, gamma, beta, running_mean, running_var);
}

template <class T, class S>
Tensor<T> batch_norm_forward_inference(const Tensor<T>& x, const Tensor<S>& gamma, const Tensor<S>& beta,
                                       const Tensor<S>& running_mean, const Tensor<S>& running_var,
                                       double eps = 1e-5) {
  constexpr std::string_view op = "batch_norm_forward_inference";
  [[maybe_unused]] const Shape c{detail::batch_norm_check_x(op, x)};  // the GPU path sizes its statistics by it
  detail::batch_norm_check_channels(op, x, gamma, "gamma");
  detail::batch_norm_check_channels(op, x, beta, "beta");
  detail::batch_norm_check_channels(op, x, running_mean, "running_mean");
  detail::batch_norm_check_channels(op, x, running_var, "running_var");
  cutrain::detail::norm_check_eps(op, eps);
  return detail::dispatch<Tensor<T>, detail::NormDtypes<T, S>>(
      op,
      [&](const auto& x, const auto& gamma, const auto& beta, const auto& mean, const auto& var) {
        return cpu::batch_norm_forward_inference(x, gamma, beta, mean, var, eps);
      },
      // An NVRTC kernel, not cuDNN: cuDNN 9.19's graph API had no engine for batchnorm_inference on
      // the H200 in any layout or dtype (cuda/kernels/batch_norm_inference.hpp).
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& gamma, const auto& beta, const auto& mean, const auto& var) {
        Tensor<T> y = detail::device_output<T>(x.shape(), x);
        cuda::kernels::batch_norm_inference(x, gamma, beta, mean, var, eps, y);
        return y;
      }),
      x, gamma, beta, running_mean, running_var);
}

template <class T, class S>
NormBackward<T, S> batch_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<S>& gamma,
                                       const Tensor<S>& save_mean, const Tensor<S>& save_inv_std) {
  constexpr std::string_view op = "batch_norm_backward";
  [[maybe_unused]] const Shape c{detail::batch_norm_check_x(op, x)};  // the GPU path sizes its statistics by it
  check::shape(op, dy, x.shape(), "dy");
  detail::batch_norm_check_channels(op, x, gamma, "gamma");
  detail::batch_norm_check_channels(op, x, save_mean, "save_mean");
  detail::batch_norm_check_channels(op, x, save_inv_std, "save_inv_std");
  return detail::dispatch<NormBackward<T, S>, detail::NormDtypes<T, S>>(
      op,
      [](const auto& x, const auto& dy, const auto& gamma, const auto& mean, const auto& inv_std) {
        return cpu::batch_norm_backward(x, dy, gamma, mean, inv_std);
      },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& dy, const auto& gamma, const auto& mean, const auto& inv_std) {
        const Device dev = x.device();
        NormBackward<T, S> r{detail::device_output<T>(x.shape(), dy), Tensor<S>(c, {.device = dev}),
                             Tensor<S>(c, {.device = dev})};
        const auto xa = detail::aligned16(x), dya = detail::aligned16(dy);
        if (!cuda::cudnn::batch_norm_backward(xa, dya, gamma, mean, inv_std, r.dx, r.dgamma, r.dbeta))
          cuda::kernels::batch_norm_train_backward(x, dy, gamma, mean, inv_std, r.dx, r.dgamma, r.dbeta);
        return r;
      }),
      x, dy, gamma, save_mean, save_inv_std);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
