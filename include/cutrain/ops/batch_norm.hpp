// batch_norm_forward_training / batch_norm_forward_inference / batch_norm_backward, and
// batch_norm_act_forward_training / batch_norm_act_backward (a residual block's batch norm, residual
// add and ReLU as one op): validate, then dispatch on the tensors' device.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "cutrain/cpu/activation.hpp"
#include "cutrain/cpu/batch_norm.hpp"
#include "cutrain/cpu/elementwise.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/dispatch.hpp"
#include "cutrain/ops/elementwise.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/api.hpp"
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

#ifdef CUTRAIN_WITH_CUDA
// Whether every [C] vector is dense, as the fast kernels want them (else cuDNN's graph runs).
inline bool dense_vectors(std::initializer_list<const Tensor<float>*> ts) {
  for (const Tensor<float>* t : ts)
    if (!t->is_contiguous()) return false;
  return true;
}

// act(batch_norm(x) [+ residual]) on the GPU, in training: cutrain's fast kernels for dense NCHW
// and [N, C] tensors (cuda/kernels/batch_norm_train.hpp); else one cuDNN graph where cuDNN has an
// engine for it; else batch norm (cuDNN's node, or cutrain's kernel for odd C) with the
// activation fused when there is no residual, then the add and the activation as cutrain's ops.
// The running statistics are updated in place.
template <class T>
BatchNormForward<T, float> gpu_batch_norm_forward_training(const Tensor<T>& x, const Tensor<float>& gamma,
                                                           const Tensor<float>& beta, Tensor<float>& running_mean,
                                                           Tensor<float>& running_var, const BatchNormParams& p,
                                                           const ActivationParams& act, const Tensor<T>& residual) {
  const Device dev = x.device();
  const Shape c{x.dim(1)};
  BatchNormForward<T, float> r{detail::device_output<T>(x.shape(), x), Tensor<float>(c, {.device = dev}),
                               Tensor<float>(c, {.device = dev})};
  const auto xa = detail::aligned16(x);  // cuDNN refuses misaligned pointers (a slice's view)
  const bool has_residual = residual.defined();
  const Tensor<T> ra = has_residual ? detail::contiguous_aligned(residual, r.y.layout()) : Tensor<T>{};
  // cutrain's kernels first where they are the faster (dense NCHW and [N, C]): the running
  // statistics updated in place.
  const bool dense = detail::dense_vectors({&gamma, &beta, &running_mean, &running_var});
  if (cuda::kernels::fast_batch_norm_forward() && dense && cuda::kernels::forward_prefers_fast(xa) &&
      cuda::kernels::batch_norm_act_forward_fast(xa, gamma, beta, running_mean, running_var, p, act,
                                                 has_residual ? &ra : nullptr, r.y, r.save_mean, r.save_inv_std,
                                                 running_mean, running_var)) {
    running_mean.bump_version();  // written in place, as copy_from below would mark them
    running_var.bump_version();
    return r;
  }
  Tensor<float> next_mean(c, {.device = dev}), next_var(c, {.device = dev});  // cuDNN's outputs, copied in below
  bool fused = cuda::cudnn::batch_norm_forward_training(xa, gamma, beta, running_mean, running_var, p, r.y, r.save_mean,
                                                        r.save_inv_std, next_mean, next_var, act,
                                                        has_residual ? &ra : nullptr);
  if (!fused) {
    // Without a residual the fused attempt was batch norm + act alone: the kernel is what is left.
    const ActivationParams inner = has_residual ? ActivationParams{.kind = Activation::identity} : act;
    if (!has_residual || !cuda::cudnn::batch_norm_forward_training(xa, gamma, beta, running_mean, running_var, p, r.y,
                                                                   r.save_mean, r.save_inv_std, next_mean, next_var))
      cuda::kernels::batch_norm_train_forward(x, gamma, beta, running_mean, running_var, p, r.y, r.save_mean,
                                              r.save_inv_std, next_mean, next_var, inner);
    if (has_residual) {
      r.y = ops::add(r.y, ra);
      if (act.kind != Activation::identity) r.y = ops::activation_forward(r.y, act);
    }
  }
  running_mean.copy_from(next_mean);
  running_var.copy_from(next_var);
  return r;
}
#endif

// What batch norm in training needs of its inputs.
template <class T, class S>
void batch_norm_training_check(std::string_view op, const Tensor<T>& x, const Tensor<S>& gamma, const Tensor<S>& beta,
                               const Tensor<S>& running_mean, const Tensor<S>& running_var, const BatchNormParams& p) {
  batch_norm_check_x(op, x);
  batch_norm_check_channels(op, x, gamma, "gamma");
  batch_norm_check_channels(op, x, beta, "beta");
  batch_norm_check_channels(op, x, running_mean, "running_mean");
  batch_norm_check_channels(op, x, running_var, "running_var");
  cutrain::detail::norm_check_eps(op, p.eps);
  cutrain::detail::norm_check_momentum(op, p.momentum);
  CUTRAIN_REQUIRE(x.numel() / x.dim(1) > 1, InvalidArgument, op, "x ", x.describe(),
                  " has one value per channel (N*H*W == 1): the unbiased variance for running_var is undefined");
}
}  // namespace detail

template <class T, class S>
BatchNormForward<T, S> batch_norm_forward_training(const Tensor<T>& x, const Tensor<S>& gamma, const Tensor<S>& beta,
                                                   Tensor<S>& running_mean, Tensor<S>& running_var,
                                                   const BatchNormParams& p) {
  constexpr std::string_view op = "batch_norm_forward_training";
  detail::batch_norm_training_check(op, x, gamma, beta, running_mean, running_var, p);
  // The running statistics are updated in place: the implementations take them from here.
  return detail::dispatch<BatchNormForward<T, S>, detail::NormDtypes<T, S>>(
      op,
      [&](const auto& x, const auto& gamma, const auto& beta, const auto&, const auto&) {
        return cpu::batch_norm_forward_training(x, gamma, beta, running_mean, running_var, p);
      },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& gamma, const auto& beta, const auto&, const auto&) {
        return detail::gpu_batch_norm_forward_training(x, gamma, beta, running_mean, running_var, p,
                                                       {.kind = Activation::identity}, Tensor<T>{});
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
        if (cuda::kernels::fast_batch_norm_backward() && detail::dense_vectors({&gamma, &mean, &inv_std}) &&
            cuda::kernels::batch_norm_act_backward_fast(xa, Tensor<T>{}, dya, gamma, mean, inv_std, false, r.dx,
                                                        r.dgamma, r.dbeta, nullptr))
          return r;
        if (!cuda::cudnn::batch_norm_backward(xa, dya, gamma, mean, inv_std, r.dx, r.dgamma, r.dbeta))
          cuda::kernels::batch_norm_train_backward(x, dy, gamma, mean, inv_std, r.dx, r.dgamma, r.dbeta);
        return r;
      }),
      x, dy, gamma, save_mean, save_inv_std);
}

namespace detail {
// The fused ops keep y, not act's input: only relu's and identity's derivative can be read from it.
inline void batch_norm_act_check(std::string_view op, const ActivationParams& act) {
  cutrain::detail::check_activation(op, act);
  CUTRAIN_REQUIRE(act.kind == Activation::relu || act.kind == Activation::identity, NotImplemented, op,
                  "the activation must be relu or identity (its derivative is read from the output), got ", act.kind);
}
}  // namespace detail

// y = act(batch_norm(x) + residual) in training, act relu or identity, residual undefined (none)
// or of x's shape: the running statistics are updated as batch_norm_forward_training does. On the
// GPU one cuDNN graph where cuDNN has an engine, else batch norm and the add and act after it.
template <class T, class S>
BatchNormForward<T, S> batch_norm_act_forward_training(const Tensor<T>& x, const Tensor<S>& gamma,
                                                       const Tensor<S>& beta, Tensor<S>& running_mean,
                                                       Tensor<S>& running_var, const BatchNormParams& p,
                                                       const ActivationParams& act, const Tensor<T>& residual = {}) {
  constexpr std::string_view op = "batch_norm_act_forward_training";
  detail::batch_norm_training_check(op, x, gamma, beta, running_mean, running_var, p);
  detail::batch_norm_act_check(op, act);
  if (residual.defined()) check::shape(op, residual, x.shape(), "residual");
  return detail::dispatch<BatchNormForward<T, S>, detail::NormDtypes<T, S>>(
      op,
      [&](const auto& x, const auto& gamma, const auto& beta, const auto&, const auto&, const auto& residual) {
        auto r = cpu::batch_norm_forward_training(x, gamma, beta, running_mean, running_var, p);  // auto: typed by the lambda's arguments, so a GPU dtype never instantiates cpu::
        if (residual.defined()) r.y = cpu::add(r.y, residual);
        if (act.kind != Activation::identity) r.y = cpu::activation_forward(r.y, act);
        return r;
      },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& gamma, const auto& beta, const auto&, const auto&,
                          const auto& residual) {
        return detail::gpu_batch_norm_forward_training(x, gamma, beta, running_mean, running_var, p, act, residual);
      }),
      x, gamma, beta, running_mean, running_var, residual);
}

// The backward of batch_norm_act_forward_training from x, its output y and dy: dresidual =
// act'(y) dy (asked for with want_dresidual: the residual's gradient) and batch norm's dx,
// dgamma and dbeta of it. On the GPU one cuDNN graph where cuDNN has an engine.
template <class T, class S>
BatchNormActBackward<T, S> batch_norm_act_backward(const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& dy,
                                                   const Tensor<S>& gamma, const Tensor<S>& save_mean,
                                                   const Tensor<S>& save_inv_std, const ActivationParams& act,
                                                   bool want_dresidual) {
  constexpr std::string_view op = "batch_norm_act_backward";
  detail::batch_norm_act_check(op, act);
  [[maybe_unused]] const Shape c{detail::batch_norm_check_x(op, x)};
  check::shape(op, y, x.shape(), "y");
  check::shape(op, dy, x.shape(), "dy");
  detail::batch_norm_check_channels(op, x, gamma, "gamma");
  detail::batch_norm_check_channels(op, x, save_mean, "save_mean");
  detail::batch_norm_check_channels(op, x, save_inv_std, "save_inv_std");
  return detail::dispatch<BatchNormActBackward<T, S>, detail::NormDtypes<T, S>>(
      op,
      [&](const auto& x, const auto& y, const auto& dy, const auto& gamma, const auto& mean, const auto& inv_std) {
        Tensor<T> dz = act.kind == Activation::identity ? dy.view() : cpu::activation_backward(y, dy, act);
        NormBackward<T, S> n = cpu::batch_norm_backward(x, dz, gamma, mean, inv_std);
        return BatchNormActBackward<T, S>{std::move(n.dx), std::move(n.dgamma), std::move(n.dbeta),
                                          want_dresidual ? std::move(dz) : Tensor<T>{}};
      },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& y, const auto& dy, const auto& gamma, const auto& mean,
                          const auto& inv_std) {
        const Device dev = x.device();
        const auto xa = detail::aligned16(x), ya = detail::aligned16(y), dya = detail::aligned16(dy);
        BatchNormActBackward<T, S> r{detail::device_output<T>(x.shape(), dy), Tensor<S>(c, {.device = dev}),
                                     Tensor<S>(c, {.device = dev}), Tensor<T>{}};
        if (want_dresidual) r.dresidual = detail::device_output<T>(x.shape(), dy);
        // The NVRTC kernels first (faster than cuDNN's graph in the ResNet-18 and Fashion-MNIST
        // profiles: docs/kernels.md), cuDNN where they do not take the layout.
        if (cuda::kernels::fast_batch_norm_backward() && detail::dense_vectors({&gamma, &mean, &inv_std}) &&
            cuda::kernels::batch_norm_act_backward_fast(xa, ya, dya, gamma, mean, inv_std,
                                                        act.kind == Activation::relu, r.dx, r.dgamma, r.dbeta,
                                                        want_dresidual ? &r.dresidual : nullptr))
          return r;
        if (cuda::cudnn::batch_norm_act_backward(xa, ya, dya, gamma, mean, inv_std, act, r.dx, r.dgamma, r.dbeta,
                                                 want_dresidual ? &r.dresidual : nullptr))
          return r;
        Tensor<T> dz = act.kind == Activation::identity ? dy.view() : ops::activation_backward(y, dy, act);
        NormBackward<T, S> n = batch_norm_backward(x, dz, gamma, mean, inv_std);
        return BatchNormActBackward<T, S>{std::move(n.dx), std::move(n.dgamma), std::move(n.dbeta),
                                          want_dresidual ? std::move(dz) : Tensor<T>{}};
      }),
      x, y, dy, gamma, save_mean, save_inv_std);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
