// Softmax and log-softmax over the last dimension of [N, C], forward and backward, on the GPU
// (NVRTC kernels), with the CPU's semantics (cpu/softmax.hpp): each row is shifted by its maximum
// first, so large logits neither overflow nor give NaN. One block per row (so C may be anything
// from 1 to hundreds of thousands), f32 arithmetic and accumulation in a fixed order
// (deterministic), outputs rounded once to T.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <string_view>

#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::softmax, the kernels of softmax.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& softmax_program() {
  static const Program p = programs::softmax(device_type<T>);
  return p;
}

// Threads per row: a multiple of 32 (the block reductions need it), more for longer rows.
inline unsigned softmax_threads(long long C) { return C <= 32 ? 32 : C <= 1024 ? 128 : C <= 8192 ? 256 : 512; }

// A [N, C] input on a CUDA device, C > 0, and few enough rows for one block each.
template <class T>
void require_rows(std::string_view op, const Tensor<T>& t, std::string_view name) {
  require_cuda_input(op, t, name);
  CUTRAIN_REQUIRE(t.rank() == 2 && t.dim(1) > 0, InvalidArgument, op, name, " must be [N, C] with C > 0, got ",
                  t.describe());
  CUTRAIN_REQUIRE(t.dim(0) < (1LL << 31), InvalidArgument, op, "at most 2^31 - 1 rows (one block each), got ",
                  t.describe());
}

// out = kernel(x) row by row: softmax or log-softmax forward.
template <GpuFloat T>
void softmax_rows_forward(std::string_view op, std::string_view kernel, const Tensor<T>& x, Tensor<T>& y) {
  require_rows(op, x, "x");
  require_output(op, y, x.shape(), x.device(), "y");
  const long long N = x.dim(0), C = x.dim(1);
  if (N == 0) return;
  const Tensor<T> xs = staged(x, Layout::row_major);
  const int dev = x.device().index;
  DeviceScope scope(dev);
  launch(function(dev, softmax_program<T>(), kernel), static_cast<unsigned>(N), softmax_threads(C), op, xs.data(),
         y.data(), C);
}

// dx = kernel(y, dy) row by row: softmax or log-softmax backward.
template <GpuFloat T>
void softmax_rows_backward(std::string_view op, std::string_view kernel, const Tensor<T>& y, const Tensor<T>& dy,
                           Tensor<T>& dx) {
  require_rows(op, y, "y");
  require_cuda_input(op, dy, "dy");
  CUTRAIN_REQUIRE(dy.shape() == y.shape(), InvalidArgument, op, "dy must have y's shape ", y.shape(), ", got ",
                  dy.describe());
  CUTRAIN_REQUIRE(dy.device() == y.device(), DeviceError, op, "y ", y.describe(), " and dy ", dy.describe(),
                  " are on different devices");
  require_output(op, dx, y.shape(), y.device(), "dx");
  const long long N = y.dim(0), C = y.dim(1);
  if (N == 0) return;
  const Tensor<T> ys = staged(y, Layout::row_major), dys = staged(dy, Layout::row_major);
  const int dev = y.device().index;
  DeviceScope scope(dev);
  launch(function(dev, softmax_program<T>(), kernel), static_cast<unsigned>(N), softmax_threads(C), op, ys.data(),
         dys.data(), dx.data(), C);
}
}  // namespace detail

// y = softmax(x) over the last dimension. x [N, C] (C > 0) may be strided: it is staged to
// row-major (through the host today, see Tensor::contiguous). y is a contiguous [N, C] tensor on
// x's device.
template <GpuFloat T>
void softmax_forward(const Tensor<T>& x, Tensor<T>& y) {
  detail::softmax_rows_forward("cuda::kernels::softmax_forward", "cutrain_softmax_forward", x, y);
}

// y = log_softmax(x) = x - max - log(sum exp(x - max)) over the last dimension; as softmax_forward.
template <GpuFloat T>
void log_softmax_forward(const Tensor<T>& x, Tensor<T>& y) {
  detail::softmax_rows_forward("cuda::kernels::log_softmax_forward", "cutrain_log_softmax_forward", x, y);
}

// dx = y (dy - sum_k dy_k y_k), y = softmax_forward's output. y and dy are staged to row-major;
// dx is a contiguous [N, C] tensor on their device.
template <GpuFloat T>
void softmax_backward(const Tensor<T>& y, const Tensor<T>& dy, Tensor<T>& dx) {
  detail::softmax_rows_backward("cuda::kernels::softmax_backward", "cutrain_softmax_backward", y, dy, dx);
}

// dx = dy - exp(y) sum_k dy_k, y = log_softmax_forward's output; as softmax_backward.
template <GpuFloat T>
void log_softmax_backward(const Tensor<T>& y, const Tensor<T>& dy, Tensor<T>& dx) {
  detail::softmax_rows_backward("cuda::kernels::log_softmax_backward", "cutrain_log_softmax_backward", y, dy, dx);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
