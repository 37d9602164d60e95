// Layer norm forward on the GPU (an NVRTC kernel, layer_norm.cuh): x viewed as [R, d] rows (R its
// first dim, d the product of the rest), y = (x - mean) * inv_std * gamma + beta per row with the
// row's mean and inv_std = 1 / sqrt(var + eps) (biased var), the semantics of cpu/layer_norm.hpp.
// One warp per row; 16-byte loads and stores when d is a multiple of 16 bytes of T and x and y are
// 16-byte aligned.
//
// Why a kernel and not cuDNN: cuDNN 9.19's layer norm (its training-phase graph, the one with an
// engine) took 0.030 ms for [8192, 384] bf16 on an H100 (bench_deploy_gpu's GPT profile), twice
// PyTorch's kernel, for 12.6 MB of traffic (0.4 TB/s). The backward stays on cuDNN.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <cstdint>
#include <string_view>

#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::layer_norm, the kernels of layer_norm.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& layer_norm_program() {
  static const Program p = programs::layer_norm(device_type<T>);
  return p;
}
}  // namespace detail

// y (x's shape, row-major, allocated by the caller) and, when given, mean and inv_std ([R] f32)
// for x (row-major, R = x.dim(0) rows of d = numel / R) with gamma and beta of d elements (f32).
template <GpuFloat T>
void layer_norm_forward(const Tensor<T>& x, const Tensor<float>& gamma, const Tensor<float>& beta, double eps,
                        Tensor<T>& y, Tensor<float>* mean = nullptr, Tensor<float>* inv_std = nullptr) {
  constexpr std::string_view op = "cuda::kernels::layer_norm_forward";
  const auto row_major = [](const auto& t) { return t.layout() == Layout::row_major || t.layout() == Layout::nchw; };
  detail::require_cuda_input(op, x, "x");
  CUTRAIN_REQUIRE(x.rank() >= 1 && x.numel() > 0 && row_major(x), InvalidArgument, op,
                  "x must be non-empty and row-major, got ", x.describe());
  const std::int64_t R = x.dim(0), d = x.numel() / R;
  detail::require_output(op, y, x.shape(), x.device(), "y");
  CUTRAIN_REQUIRE(row_major(y), InvalidArgument, op, "y must be row-major, got ", y.describe());
  for (const auto* p : {&gamma, &beta}) {
    detail::require_cuda_input(op, *p, "gamma and beta");
    CUTRAIN_REQUIRE(p->numel() == d && row_major(*p) && p->device() == x.device(),
                    InvalidArgument, op, "gamma and beta must be ", d, " contiguous elements on x's device (x ",
                    x.describe(), "), got ", p->describe());
  }
  CUTRAIN_REQUIRE((mean == nullptr) == (inv_std == nullptr), InvalidArgument, op, "give both mean and inv_std or neither");
  if (mean) {
    detail::require_output(op, *mean, Shape{R}, x.device(), "mean");
    detail::require_output(op, *inv_std, Shape{R}, x.device(), "inv_std");
  }
  constexpr std::int64_t V = 16 / sizeof(T);
  const bool vec = d % V == 0 && reinterpret_cast<std::uintptr_t>(x.data()) % 16 == 0 &&
                   reinterpret_cast<std::uintptr_t>(y.data()) % 16 == 0;
  const int dev = x.device().index;
  DeviceScope scope(dev);
  const T* xd = x.data();
  T* yd = y.data();
  const float *gd = gamma.data(), *bd = beta.data();
  float* md = mean ? mean->data() : nullptr;
  float* id = inv_std ? inv_std->data() : nullptr;
  // 8 rows (warps) per block of 256 threads, at most 65536 blocks (a grid-stride loop beyond).
  launch(function(dev, detail::layer_norm_program<T>(), vec ? "cutrain_layer_norm_forward_vec" : "cutrain_layer_norm_forward"),
         grid_for(R * 32), 256u, op, xd, yd, gd, bd, md, id, static_cast<long long>(R), static_cast<long long>(d),
         static_cast<float>(eps));
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
