// activation_forward / activation_backward: dispatch on the tensors' device.
#pragma once

#include "cutrain/cpu/activation.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/cudnn/activation.hpp"
#endif

namespace cutrain::ops {

template <class T>
Tensor<T> activation_forward(const Tensor<T>& x, const ActivationParams& a) {
  constexpr std::string_view op = "activation_forward";
  check::defined(op, x, "x");
  if (detail::on_cpu(op, x)) {
    if constexpr (CpuFloat<T>) return cpu::activation_forward(x, a);
    else detail::cpu_dtype_unsupported<T>(op);
  }
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (cuda::cudnn::GpuFloat<T>) {
    const Tensor<T> xs = x.contiguous(detail::elementwise_layout(x));
    Tensor<T> y = detail::device_output<T>(x.shape(), xs);
    cuda::cudnn::activation_forward(xs, a, y);
    return y;
  } else {
    detail::gpu_dtype_unsupported<T>(op);
  }
#endif
  return {};
}

template <class T>
Tensor<T> activation_backward(const Tensor<T>& x, const Tensor<T>& dy, const ActivationParams& a) {
  constexpr std::string_view op = "activation_backward";
  check::defined(op, x, "x");
  check::shape(op, dy, x.shape(), "dy");
  if (detail::on_cpu(op, x, dy)) {
    if constexpr (CpuFloat<T>) return cpu::activation_backward(x, dy, a);
    else detail::cpu_dtype_unsupported<T>(op);
  }
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (cuda::cudnn::GpuFloat<T>) {
    const Layout l = detail::elementwise_layout(dy);
    const Tensor<T> xs = x.contiguous(l), dys = dy.contiguous(l);
    Tensor<T> dx = detail::device_output<T>(x.shape(), dys);
    cuda::cudnn::activation_backward(xs, dys, a, dx);
    return dx;
  } else {
    detail::gpu_dtype_unsupported<T>(op);
  }
#endif
  return {};
}

}  // namespace cutrain::ops
