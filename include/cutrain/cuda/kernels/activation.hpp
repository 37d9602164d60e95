// Activations on the GPU as NVRTC kernels (activation.cuh): the path that runs where cuDNN's graph
// API has no engine for the pointwise node (a tensor of 3 elements on the H200, among others:
// cuda/cudnn/activation.hpp tries cuDNN first and remembers a signature it cannot build). Same
// semantics as cpu/activation.hpp, f32 arithmetic, rounded once to T. x, dy, y and dx are laid out
// alike (the caller stages them), elementwise over their n elements.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <string_view>

#include "cutrain/core/params/activation.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::activation, the kernels of activation.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& activation_program() {
  static const Program p = programs::activation(device_type<T>);
  return p;
}

template <class T>
void require_alike(std::string_view op, const Tensor<T>& a, std::string_view a_name, const Tensor<T>& b,
                   std::string_view b_name) {
  CUTRAIN_REQUIRE(a.shape() == b.shape() && a.is_contiguous() && a.layout() == b.layout(), InvalidArgument, op,
                  a_name, " ", a.describe(), " and ", b_name, " ", b.describe(),
                  " must be contiguous and laid out alike");
  CUTRAIN_REQUIRE(a.device() == b.device(), DeviceError, op, a_name, " ", a.describe(), " and ", b_name, " ",
                  b.describe(), " are on different devices");
}
}  // namespace detail

// y = act(x).
template <GpuFloat T>
void activation_forward(const Tensor<T>& x, const ActivationParams& a, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::activation_forward";
  detail::require_cuda_input(op, x, "x");
  cutrain::detail::check_activation(op, a);
  detail::require_output(op, y, x.shape(), x.device(), "y");
  detail::require_alike(op, x, "x", y, "y");
  const long long n = y.numel();
  if (n == 0) return;
  const int kind = static_cast<int>(a.kind);
  const float alpha = static_cast<float>(a.alpha);
  const int dev = y.device().index;
  DeviceScope scope(dev);
  if (const long long packs = vec_packs<T>(n, x.data(), y.data()); packs > 0)
    launch(function(dev, detail::activation_program<T>(), "cutrain_activation_forward_vec"), grid_for(packs), 256, op,
           x.data(), y.data(), packs, kind, alpha);
  else
    launch(function(dev, detail::activation_program<T>(), "cutrain_activation_forward"), grid_for(n), 256, op,
           x.data(), y.data(), n, kind, alpha);
}

// dx = dy * act'(x).
template <GpuFloat T>
void activation_backward(const Tensor<T>& x, const Tensor<T>& dy, const ActivationParams& a, Tensor<T>& dx) {
  constexpr std::string_view op = "cuda::kernels::activation_backward";
  detail::require_cuda_input(op, x, "x");
  detail::require_cuda_input(op, dy, "dy");
  cutrain::detail::check_activation(op, a);
  detail::require_output(op, dx, x.shape(), x.device(), "dx");
  detail::require_alike(op, x, "x", dy, "dy");
  detail::require_alike(op, x, "x", dx, "dx");
  const long long n = dx.numel();
  if (n == 0) return;
  const int kind = static_cast<int>(a.kind);
  const float alpha = static_cast<float>(a.alpha);
  const int dev = dx.device().index;
  DeviceScope scope(dev);
  if (const long long packs = vec_packs<T>(n, x.data(), dy.data(), dx.data()); packs > 0)
    launch(function(dev, detail::activation_program<T>(), "cutrain_activation_backward_vec"), grid_for(packs), 256, op,
           x.data(), dy.data(), dx.data(), packs, kind, alpha);
  else
    launch(function(dev, detail::activation_program<T>(), "cutrain_activation_backward"), grid_for(n), 256, op,
           x.data(), dy.data(), dx.data(), n, kind, alpha);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
