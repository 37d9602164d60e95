// x / scale as FP8 e4m3 bytes on the GPU (NVRTC kernel), rounded as core/fp8.hpp's
// e4m3_from_float rounds (to nearest even, saturated to +-448): the input of the deploy
// engine's 8-bit convolutions (cuda/cudnn/conv_fp8.hpp).
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <cmath>
#include <cstdint>

#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/elementwise.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::quantize, the kernel of quantize.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& quantize_program() {
  static const Program p = programs::quantize(device_type<T>);
  return p;
}
}  // namespace detail

// y (u8, x's shape, contiguous) = e4m3(x * (1 / scale)), element by element in y's layout (x is
// staged into it).
template <GpuFloat T>
void quantize_e4m3(const Tensor<T>& x, float scale, Tensor<std::uint8_t>& y) {
  constexpr std::string_view op = "cuda::kernels::quantize_e4m3";
  detail::require_cuda_input(op, x, "x");
  CUTRAIN_REQUIRE(std::isfinite(scale) && scale > 0, InvalidArgument, op, "scale must be finite and > 0, got ", scale);
  detail::require_output(op, y, x.shape(), x.device(), "y");
  const long long n = y.numel();
  if (n == 0) return;
  const Tensor<T> xs = detail::staged(x, y.layout());
  const float inv_scale = 1.0f / scale;
  const int dev = y.device().index;
  DeviceScope scope(dev);
  const int packed = reinterpret_cast<std::uintptr_t>(y.data()) % 4 == 0 ? 1 : 0;  // four bytes per store
  launch(function(dev, detail::quantize_program<T>(), "cutrain_quantize_e4m3"), grid_for(packed ? n / 4 + 1 : n), 256, op,
         xs.data(), y.data(), inv_scale, n, packed);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
