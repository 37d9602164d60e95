// add, multiply and scale on the GPU (NVRTC kernels): y = a + b, a * b, alpha * a, pairing
// elements by logical index. y is contiguous; inputs laid out unlike y are staged into y's layout
// first. Arithmetic in f32, rounded once to T.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::elementwise, the kernels of elementwise.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& elementwise_program() {
  static const Program p = programs::elementwise(device_type<T>);
  return p;
}

// kernel_vec (may be null): its 16-byte form, used where vec_packs allows.
template <GpuFloat T>
void elementwise_binary(std::string_view op, const char* kernel, const char* kernel_vec, const Tensor<T>& a,
                        const Tensor<T>& b, Tensor<T>& y) {
  require_cuda_input(op, a, "a");
  require_cuda_input(op, b, "b");
  CUTRAIN_REQUIRE(a.shape() == b.shape(), InvalidArgument, op, "a ", a.describe(), " and b ", b.describe(),
                  " differ in shape");
  CUTRAIN_REQUIRE(a.device() == b.device(), DeviceError, op, "a ", a.describe(), " and b ", b.describe(),
                  " are on different devices");
  require_output(op, y, a.shape(), a.device(), "y");
  const long long n = y.numel();
  if (n == 0) return;
  const Tensor<T> as = staged(a, y.layout()), bs = staged(b, y.layout());
  const int dev = y.device().index;
  DeviceScope scope(dev);
  const long long packs = kernel_vec != nullptr ? vec_packs<T>(n, as.data(), bs.data(), y.data()) : 0;
  if (packs > 0)
    launch(function(dev, elementwise_program<T>(), kernel_vec), grid_for(packs), 256, op, as.data(), bs.data(), y.data(),
           packs);
  else
    launch(function(dev, elementwise_program<T>(), kernel), grid_for(n), 256, op, as.data(), bs.data(), y.data(), n);
}
}  // namespace detail

template <GpuFloat T>
void add(const Tensor<T>& a, const Tensor<T>& b, Tensor<T>& y) {
  detail::elementwise_binary("cuda::kernels::add", "cutrain_add", "cutrain_add_vec", a, b, y);
}

template <GpuFloat T>
void multiply(const Tensor<T>& a, const Tensor<T>& b, Tensor<T>& y) {
  detail::elementwise_binary("cuda::kernels::multiply", "cutrain_multiply", nullptr, a, b, y);
}

// y = alpha * a (alpha rounded to f32). scale(a, 1.0, y) is an exact copy.
template <GpuFloat T>
void scale(const Tensor<T>& a, double alpha, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::scale";
  detail::require_cuda_input(op, a, "a");
  detail::require_output(op, y, a.shape(), a.device(), "y");
  const long long n = y.numel();
  if (n == 0) return;
  const Tensor<T> as = detail::staged(a, y.layout());
  const float alpha_f = static_cast<float>(alpha);
  const int dev = y.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::elementwise_program<T>(), "cutrain_scale"), grid_for(n), 256, op, as.data(), alpha_f,
         y.data(), n);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
