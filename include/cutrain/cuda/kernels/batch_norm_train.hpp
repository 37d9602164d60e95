// Batch-norm training forward (with an optional fused activation) and backward on the GPU as
// NVRTC kernels (batch_norm_train.cuh): the path that runs where cuDNN's graph API has no engine
// (any odd channel count on the H200: cuda/cudnn/norm.hpp tries cuDNN first and remembers a
// signature it cannot build). Semantics of cpu/batch_norm.hpp; f32 sums per channel in a fixed
// order. One block per channel, so it is slow for few channels over many elements: a fallback,
// not the fast path. x, dy, y and dx are [N, C] or [N, C, H, W] with any strides whose h and w
// merge (else they are staged); the [C] vectors are dense f32.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <algorithm>
#include <string_view>
#include <utility>

#include "cutrain/core/params/activation.hpp"
#include "cutrain/core/params/norm.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/batch_norm_inference.hpp"  // NcsStrides, ncs_strides
#include "cutrain/cuda/kernels/programs.hpp"  // programs::batch_norm_train, the kernels of batch_norm_train.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& batch_norm_train_program() {
  static const Program p = programs::batch_norm_train(device_type<T>);
  return p;
}

// t as [N, C, S] strides, staged into `l` first where its h and w do not merge.
template <class T>
std::pair<Tensor<T>, NcsStrides> bn_view(const Tensor<T>& t, Layout l) {
  if (auto v = ncs_strides(t)) return {t.view(), *v};
  Tensor<T> s = t.contiguous(l);
  const NcsStrides v = *ncs_strides(s);
  return {std::move(s), v};
}

inline void require_channels(std::string_view op, std::initializer_list<std::pair<const Tensor<float>*, const char*>> ts,
                             std::int64_t c, Device dev) {
  for (const auto& [t, name] : ts) {
    CUTRAIN_REQUIRE(t->defined() && t->shape() == Shape{c} && t->is_contiguous(), InvalidArgument, op, name,
                    " must be a dense [", c, "], got ", t->defined() ? t->describe() : std::string("undefined"));
    CUTRAIN_REQUIRE(t->device() == dev, DeviceError, op, name, " ", t->describe(), " is not on ", dev);
  }
}

inline unsigned bn_train_blocks(long long C) { return static_cast<unsigned>(std::min<long long>(C, 65535)); }
}  // namespace detail

template <GpuFloat T>
void batch_norm_train_forward(const Tensor<T>& x, const Tensor<float>& gamma, const Tensor<float>& beta,
                              const Tensor<float>& running_mean, const Tensor<float>& running_var,
                              const BatchNormParams& p, Tensor<T>& y, Tensor<float>& save_mean,
                              Tensor<float>& save_inv_std, Tensor<float>& next_mean, Tensor<float>& next_var,
                              const ActivationParams& act = {.kind = Activation::identity}) {
  constexpr std::string_view op = "cuda::kernels::batch_norm_train_forward";
  detail::require_cuda_input(op, x, "x");
  CUTRAIN_REQUIRE((x.rank() == 2 || x.rank() == 4) && x.numel() > 0 && x.numel() / x.dim(1) > 1, InvalidArgument, op,
                  "x must be a non-empty [N,C] or [N,C,H,W] with more than one value per channel, got ", x.describe());
  cutrain::detail::check_activation(op, act);
  detail::require_output(op, y, x.shape(), x.device(), "y");
  const long long C = x.dim(1);
  detail::require_channels(op, {{&gamma, "gamma"}, {&beta, "beta"}, {&running_mean, "running_mean"},
                                {&running_var, "running_var"}, {&save_mean, "save_mean"},
                                {&save_inv_std, "save_inv_std"}, {&next_mean, "next_mean"}, {&next_var, "next_var"}},
                           C, x.device());
  const auto [xs, xv] = detail::bn_view(x, y.layout());
  const detail::NcsStrides yv = *detail::ncs_strides(y);
  const long long N = x.dim(0), S = x.numel() / (N * C);
  const int kind = static_cast<int>(act.kind);
  const float alpha = static_cast<float>(act.alpha);
  const int dev = x.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::batch_norm_train_program<T>(), "cutrain_batch_norm_train_forward"),
         detail::bn_train_blocks(C), 256, op, xs.data(), y.data(), gamma.data(), beta.data(), running_mean.data(),
         running_var.data(), save_mean.data(), save_inv_std.data(), next_mean.data(), next_var.data(), N, C, S, xv.n,
         xv.c, xv.s, yv.n, yv.c, yv.s, p.eps, p.momentum, kind, alpha);
}

template <GpuFloat T>
void batch_norm_train_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<float>& gamma,
                               const Tensor<float>& save_mean, const Tensor<float>& save_inv_std, Tensor<T>& dx,
                               Tensor<float>& dgamma, Tensor<float>& dbeta) {
  constexpr std::string_view op = "cuda::kernels::batch_norm_train_backward";
  detail::require_cuda_input(op, x, "x");
  detail::require_cuda_input(op, dy, "dy");
  CUTRAIN_REQUIRE((x.rank() == 2 || x.rank() == 4) && x.numel() > 0 && dy.shape() == x.shape(), InvalidArgument, op,
                  "x must be a non-empty [N,C] or [N,C,H,W] and dy of its shape, got x ", x.describe(), " and dy ",
                  dy.describe());
  CUTRAIN_REQUIRE(dy.device() == x.device(), DeviceError, op, "x ", x.describe(), " and dy ", dy.describe(),
                  " are on different devices");
  detail::require_output(op, dx, x.shape(), x.device(), "dx");
  const long long C = x.dim(1);
  detail::require_channels(op, {{&gamma, "gamma"}, {&save_mean, "save_mean"}, {&save_inv_std, "save_inv_std"},
                                {&dgamma, "dgamma"}, {&dbeta, "dbeta"}},
                           C, x.device());
  const auto [xs, xv] = detail::bn_view(x, dx.layout());
  const auto [dys, gv] = detail::bn_view(dy, dx.layout());
  const detail::NcsStrides dv = *detail::ncs_strides(dx);
  const long long N = x.dim(0), S = x.numel() / (N * C);
  const int dev = x.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::batch_norm_train_program<T>(), "cutrain_batch_norm_train_backward"),
         detail::bn_train_blocks(C), 256, op, xs.data(), dys.data(), dx.data(), gamma.data(), save_mean.data(),
         save_inv_std.data(), dgamma.data(), dbeta.data(), N, C, S, xv.n, xv.c, xv.s, gv.n, gv.c, gv.s, dv.n, dv.c,
         dv.s);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
