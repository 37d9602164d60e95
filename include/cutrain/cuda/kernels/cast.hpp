// Element type conversion on the GPU between f32, bf16 and f16 (NVRTC kernel), with the host's
// rounding (core/dtype.hpp: round to nearest even), so a device cast equals cutrain::cast bit
// for bit (NaN payloads aside).
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::cast, the kernels of cast.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T, GpuFloat U>
const Program& cast_program() {
  static const Program p = programs::cast(device_type<T>, device_type<U>);
  return p;
}
}  // namespace detail

// y = x converted to U; y is contiguous in any layout (x is staged into it).
template <GpuFloat T, GpuFloat U>
void cast_into(const Tensor<T>& x, Tensor<U>& y) {
  constexpr std::string_view op = "cuda::kernels::cast";
  detail::require_cuda_input(op, x, "x");
  detail::require_output(op, y, x.shape(), x.device(), "y");
  const long long n = y.numel();
  if (n == 0) return;
  const Tensor<T> xs = detail::staged(x, y.layout());
  const int dev = y.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::cast_program<T, U>(), "cutrain_cast"), grid_for(n), 256, op, xs.data(), y.data(), n);
}

// x converted to U, on x's device, nhwc when x is nhwc (else row-major), as cutrain::cast does.
template <GpuFloat U, GpuFloat T>
Tensor<U> cast(const Tensor<T>& x) {
  detail::require_cuda_input("cuda::kernels::cast", x, "x");
  const Layout l = is_channels_last(x.shape(), x.strides()) ? Layout::nhwc : Layout::row_major;
  Tensor<U> y(x.shape(), {.layout = l, .device = x.device()});
  cast_into(x, y);
  return y;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
