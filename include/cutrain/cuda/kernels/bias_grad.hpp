// The convolution bias gradient on the GPU (NVRTC kernels): db[k] = sum over n, h, w of
// dy[n, k, h, w], NCHW or NHWC, accumulated in f32 in two deterministic stages (partial sums per
// channel, then one thread per channel adds them in order). cuDNN's graph reduction is not used:
// cuDNN 9.19 had no engine for it on the H200 except f32 NHWC (ops/conv2d.hpp).
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <algorithm>

#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::bias_grad, the kernels of bias_grad.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& bias_grad_program() {
  static const Program p = programs::bias_grad(device_type<T>);
  return p;
}
}  // namespace detail

// db [K] (contiguous) from dy [N, K, H, W] in nchw or nhwc (any other layout is staged to nchw).
template <GpuFloat T>
void bias_grad(const Tensor<T>& dy, Tensor<T>& db) {
  constexpr std::string_view op = "cuda::kernels::bias_grad";
  detail::require_cuda_input(op, dy, "dy");
  CUTRAIN_REQUIRE(dy.rank() == 4, InvalidArgument, op, "dy must be 4-d, got ", dy.describe());
  const long long N = dy.dim(0), K = dy.dim(1), HW = dy.dim(2) * dy.dim(3);
  detail::require_output(op, db, Shape{K}, dy.device(), "db");
  if (K == 0) return;
  const bool nhwc = dy.layout() == Layout::nhwc;
  const Tensor<T> dys = nhwc ? dy.view() : detail::staged(dy, Layout::nchw);
  // S partial sums per channel: enough blocks to fill the GPU (about 1024), no more than the work.
  // S depends on the shape alone, so the result does not depend on the GPU.
  constexpr long long target_blocks = 1024;
  const long long col_blocks = nhwc ? (K + 31) / 32 : K;
  const long long most = nhwc ? std::max(1LL, (N * HW + 7) / 8) : std::max(1LL, N);
  const long long S = std::clamp(target_blocks / col_blocks, 1LL, std::min(most, 65535LL));
  const int dev = dy.device().index;
  DeviceScope scope(dev);
  float* partial = static_cast<float*>(workspace(dev, static_cast<std::size_t>(S * K) * sizeof(float)));
  const Program& prog = detail::bias_grad_program<T>();
  if (nhwc) {
    const long long R = N * HW;
    launch(function(dev, prog, "cutrain_bias_grad_nhwc"), dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(S)),
           dim3(32, 8), op, dys.data(), R, K, partial);
  } else {
    const unsigned threads = HW >= 256 ? 256 : static_cast<unsigned>(std::max(32LL, (HW + 31) / 32 * 32));
    launch(function(dev, prog, "cutrain_bias_grad_nchw"), dim3(static_cast<unsigned>(K), static_cast<unsigned>(S)),
           threads, op, dys.data(), N, K, HW, partial);
  }
  launch(function(dev, prog, "cutrain_bias_grad_finish"), grid_for(K), 256, op, partial, K, S, db.data());
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
