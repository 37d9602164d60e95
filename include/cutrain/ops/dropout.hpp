// dropout_forward / dropout_backward (seeded, inverted dropout): dispatch on the tensors' device.
#pragma once

#include <cstdint>

#include "cutrain/cpu/dropout.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/dropout.hpp"
#endif

namespace cutrain::ops {

// Drops element i (logical index) when uniform_at(seed, i) < p and scales the rest by 1 / (1 - p).
template <class T>
DropoutForward<T> dropout_forward(const Tensor<T>& x, double p, std::uint64_t seed) {
  constexpr std::string_view op = "dropout_forward";
  check::defined(op, x, "x");
  // p == 1 would scale the kept elements by 1 / 0; the negated test also rejects NaN.
  CUTRAIN_REQUIRE(p >= 0.0 && p < 1.0, InvalidArgument, op, "p must be in [0, 1), got ", p, " for x ",
                  x.describe());
  if (detail::on_cpu(op, x)) {
    if constexpr (CpuFloat<T>) return cpu::dropout_forward(x, p, seed);
    else detail::cpu_dtype_unsupported<T>(op);
  }
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (cuda::GpuFloat<T>) {
    DropoutForward<T> out{detail::device_output<T>(x.shape(), x), detail::device_output<T>(x.shape(), x)};
    cuda::kernels::dropout_forward(x, p, seed, out.y, out.mask);
    return out;
  } else {
    detail::gpu_dtype_unsupported<T>(op);
  }
#endif
  return {};
}

// dx = dy * mask, where mask is dropout_forward's mask.
template <class T>
Tensor<T> dropout_backward(const Tensor<T>& dy, const Tensor<T>& mask) {
  constexpr std::string_view op = "dropout_backward";
  check::defined(op, dy, "dy");
  check::shape(op, mask, dy.shape(), "mask");
  if (detail::on_cpu(op, dy, mask)) {
    if constexpr (CpuFloat<T>) return cpu::dropout_backward(dy, mask);
    else detail::cpu_dtype_unsupported<T>(op);
  }
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (cuda::GpuFloat<T>) {
    Tensor<T> dx = detail::device_output<T>(dy.shape(), dy);
    cuda::kernels::dropout_backward(dy, mask, dx);
    return dx;
  } else {
    detail::gpu_dtype_unsupported<T>(op);
  }
#endif
  return {};
}

}  // namespace cutrain::ops
