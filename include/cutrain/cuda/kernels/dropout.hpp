// Seeded inverted dropout on the GPU (NVRTC kernel), with exactly the CPU's mask: element i
// (logical row-major index, whatever the layout) is dropped when cutrain::uniform_at(seed, i) < p;
// the kernel reproduces core/random.hpp's splitmix64 generator bit for bit.
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
#include "cutrain/cuda/kernels/programs.hpp"  // programs::dropout, the kernels of dropout.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& dropout_program() {
  static const Program p = programs::dropout(device_type<T>);
  return p;
}
}  // namespace detail

// mask = 0 (dropped) or 1 / (1 - p) rounded to T (kept); y = x * mask. y and mask are contiguous
// and laid out alike; x is staged into their layout.
template <GpuFloat T>
void dropout_forward(const Tensor<T>& x, double p, std::uint64_t seed, Tensor<T>& y, Tensor<T>& mask) {
  constexpr std::string_view op = "cuda::kernels::dropout_forward";
  detail::require_cuda_input(op, x, "x");
  CUTRAIN_REQUIRE(p >= 0.0 && p < 1.0, InvalidArgument, op, "p must be in [0, 1), got ", p);
  detail::require_output(op, y, x.shape(), x.device(), "y");
  detail::require_output(op, mask, x.shape(), x.device(), "mask");
  CUTRAIN_REQUIRE(mask.layout() == y.layout(), InvalidArgument, op, "y ", y.describe(), " and mask ", mask.describe(),
                  " must be laid out alike");
  const long long n = y.numel();
  if (n == 0) return;
  const Tensor<T> xs = detail::staged(x, y.layout());
  const bool nhwc = y.layout() == Layout::nhwc;
  const long long C = nhwc ? y.dim(1) : 1, H = nhwc ? y.dim(2) : 1, W = nhwc ? y.dim(3) : 1;
  const int nhwc_flag = nhwc ? 1 : 0;
  const unsigned long long seed_ull = seed;
  const float keep_scale = static_cast<float>(static_cast<T>(1.0 / (1.0 - p)));  // as the CPU's mask value
  const int dev = y.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::dropout_program<T>(), "cutrain_dropout_forward"), grid_for(n), 256, op, xs.data(),
         y.data(), mask.data(), n, p, seed_ull, keep_scale, nhwc_flag, C, H, W);
}

// dx = dy * mask (dx contiguous; dy and mask staged into its layout).
template <GpuFloat T>
void dropout_backward(const Tensor<T>& dy, const Tensor<T>& mask, Tensor<T>& dx) {
  detail::elementwise_binary("cuda::kernels::dropout_backward", "cutrain_multiply", nullptr, dy, mask, dx);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
