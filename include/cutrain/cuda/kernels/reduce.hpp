// Reductions over any set of axes on the GPU (NVRTC kernels, reduce.cuh), forward and backward,
// with the semantics of cpu/reduce.hpp: sum (scaled: mean), max/min with int32 indices, var,
// p-norm. Inputs of any strides are read in place (never staged, never through the host);
// outputs are contiguous row-major tensors that the caller allocates. The plan
// (core/params/reduce.hpp) has been checked by the caller (ops/reduce.hpp).
//
// Forward: one block per output element, 32 threads for up to 32 reduced elements, 128 up to
// 1024, 256 beyond; the block adds (or compares) in a fixed order, so results are deterministic.
// A sum whose outputs are adjacent in x (the last kept axis has stride 1) and that either has many
// outputs (32768 or more) and at most 1024 elements each, or at most 32 elements each, runs one
// thread per output instead (sum_by_columns): a sum over leading axes, such as the gradient of a
// position embedding broadcast over the batch, [16, 1024, 768] -> [1024, 768], would otherwise
// start 786,432 blocks that each read 16 values.
// Backward: one thread per input element. f32 arithmetic and accumulation; outputs rounded once.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "cutrain/core/params/reduce.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::reduce, the kernels of reduce.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
// cutrain_reduce_args and cutrain_reduce_grad_args of reduce.cuh, field for field.
struct ReduceArgs {
  long long n_out, n_red, out_rank, red_rank;
  long long out_size[8], out_stride[8];
  long long red_size[8], red_stride[8];
};
struct ReduceGradArgs {
  long long n, rank;
  long long size[8], x_stride[8], dy_stride[8], aux_stride[8], red_index[8];
};
static_assert(sizeof(ReduceArgs) == 36 * sizeof(long long) && sizeof(ReduceGradArgs) == 42 * sizeof(long long));
static_assert(max_reduce_rank == 8, "the kernels' index arrays hold 8 axes");

template <GpuFloat T>
const Program& reduce_program() {
  static const Program p = programs::reduce(device_type<T>);
  return p;
}

// Threads per output: a multiple of 32 (the block reductions need it), more for more elements.
inline unsigned reduce_threads(std::int64_t n_red) { return n_red <= 32 ? 32 : n_red <= 1024 ? 128 : 256; }

// Whether a sum runs one thread per output (cutrain_reduce_sum_columns; see the top).
inline bool sum_by_columns(const ReduceArgs& a) {
  return a.out_rank > 0 && a.out_stride[a.out_rank - 1] == 1 && (a.n_red <= 32 || (a.n_out >= 32768 && a.n_red <= 1024));
}

// Blocks for n_out > 0 outputs: one each, up to 2^20 (the kernels loop over the rest).
inline unsigned reduce_blocks(std::int64_t n_out) { return static_cast<unsigned>(std::min<std::int64_t>(n_out, 1 << 20)); }

template <class T>
ReduceArgs forward_args(const ReducePlan& p, const Tensor<T>& x) {
  ReduceArgs a{};
  std::vector<std::int64_t> sizes;
  Strides strides;
  split_axes(p, x, false, sizes, strides);
  a.out_rank = static_cast<long long>(sizes.size());
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    a.out_size[k] = sizes[k];
    a.out_stride[k] = strides[k];
  }
  split_axes(p, x, true, sizes, strides);
  a.red_rank = static_cast<long long>(sizes.size());
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    a.red_size[k] = sizes[k];
    a.red_stride[k] = strides[k];
  }
  a.n_out = p.n_out;
  a.n_red = p.n_red;
  return a;
}

// x_strides: x's (or dx's row-major ones where the kernel reads no x); dy and aux: output-shaped.
inline ReduceGradArgs grad_args(const ReducePlan& p, const Strides& x_strides, const Strides& dy_strides,
                                const Strides& aux_strides) {
  ReduceGradArgs a{};
  const Strides dys = broadcast_strides(p, dy_strides), auxs = broadcast_strides(p, aux_strides);
  const Strides reds = reduced_index_strides(p);
  a.n = p.in_shape.numel();
  a.rank = p.in_shape.rank();
  for (int d = 0; d < p.in_shape.rank(); ++d) {
    const auto k = static_cast<std::size_t>(d);
    a.size[k] = p.in_shape[d];
    a.x_stride[k] = x_strides[k];
    a.dy_stride[k] = dys[k];
    a.aux_stride[k] = auxs[k];
    a.red_index[k] = reds[k];
  }
  return a;
}

template <class T>
void require_reduce_output(std::string_view op, const Tensor<T>& t, const ReducePlan& p, Device device,
                           std::string_view name) {
  require_output(op, t, p.out_shape, device, name);
  CUTRAIN_REQUIRE(t.layout() != Layout::nhwc || p.out_shape.rank() != 4 || t.numel() <= 1, InvalidArgument, op, name,
                  " must be row-major, got ", t.describe());
}

template <class T>
void require_grad_output(std::string_view op, const Tensor<T>& dx, const ReducePlan& p, Device device) {
  require_output(op, dx, p.in_shape, device, "dx");
  CUTRAIN_REQUIRE(dx.layout() != Layout::nhwc || dx.numel() <= 1, InvalidArgument, op, "dx must be row-major, got ",
                  dx.describe());
}

// Runs a forward kernel over p's outputs: args... follow x and the outputs.
template <GpuFloat T, class... Args>
void launch_forward(std::string_view op, std::string_view kernel, const ReducePlan& p, const Tensor<T>& x,
                    const Args&... args) {
  if (p.n_out == 0) return;
  const int dev = x.device().index;
  DeviceScope scope(dev);
  launch(function(dev, reduce_program<T>(), kernel), reduce_blocks(p.n_out), reduce_threads(p.n_red), op, args...);
}

template <GpuFloat T, class... Args>
void launch_backward(std::string_view op, std::string_view kernel, const ReducePlan& p, const Tensor<T>& dy,
                     const Args&... args) {
  const std::int64_t n = p.in_shape.numel();
  if (n == 0) return;
  const int dev = dy.device().index;
  DeviceScope scope(dev);
  launch(function(dev, reduce_program<T>(), kernel), grid_for(n), 256, op, args...);
}
}  // namespace detail

// y = scale * sum of x over p's reduced axes (scale 1: sum; 1 / n_red: mean). y: p.out_shape.
template <GpuFloat T>
void reduce_sum(const Tensor<T>& x, const ReducePlan& p, double scale, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::reduce_sum";
  detail::require_cuda_input(op, x, "x");
  detail::require_reduce_output(op, y, p, x.device(), "y");
  const T* xd = x.data();
  T* yd = y.data();
  const detail::ReduceArgs a = detail::forward_args(p, x);
  if (p.n_out > 0 && detail::sum_by_columns(a)) {
    const int dev = x.device().index;
    DeviceScope scope(dev);
    launch(function(dev, detail::reduce_program<T>(), "cutrain_reduce_sum_columns"), grid_for(p.n_out), 256, op, xd, yd,
           a, static_cast<float>(scale));
    return;
  }
  detail::launch_forward(op, "cutrain_reduce_sum", p, x, xd, yd, a, static_cast<float>(scale));
}

// The max (is_max) or min over p's reduced axes and its index (p.n_red > 0).
template <GpuFloat T>
void reduce_arg(const Tensor<T>& x, const ReducePlan& p, bool is_max, Tensor<T>& values, Tensor<std::int32_t>& indices) {
  constexpr std::string_view op = "cuda::kernels::reduce_arg";
  detail::require_cuda_input(op, x, "x");
  CUTRAIN_REQUIRE(p.n_red > 0 || p.n_out == 0, InvalidArgument, op, "no elements to compare in x ", x.describe());
  detail::require_reduce_output(op, values, p, x.device(), "values");
  detail::require_reduce_output(op, indices, p, x.device(), "indices");
  const T* xd = x.data();
  T* yd = values.data();
  int* id = reinterpret_cast<int*>(indices.data());
  detail::launch_forward(op, "cutrain_reduce_arg", p, x, xd, yd, id, detail::forward_args(p, x), is_max ? 1 : 0);
}

// sum (x - mean)^2 / (n_red - correction), n_red - correction > 0.
template <GpuFloat T>
void reduce_var(const Tensor<T>& x, const ReducePlan& p, double correction, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::reduce_var";
  detail::require_cuda_input(op, x, "x");
  CUTRAIN_REQUIRE(static_cast<double>(p.n_red) - correction > 0 || p.n_out == 0, InvalidArgument, op,
                  "needs more than correction ", correction, " elements per output, got ", p.n_red);
  detail::require_reduce_output(op, y, p, x.device(), "y");
  const T* xd = x.data();
  T* yd = y.data();
  const double n = static_cast<double>(p.n_red);
  detail::launch_forward(op, "cutrain_reduce_var", p, x, xd, yd, detail::forward_args(p, x), static_cast<float>(1.0 / n),
                         static_cast<float>(1.0 / (n - correction)));
}

// (sum |x|^pn)^(1 / pn), pn finite and >= 1.
template <GpuFloat T>
void reduce_norm(const Tensor<T>& x, const ReducePlan& p, double pn, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::reduce_norm";
  detail::require_cuda_input(op, x, "x");
  detail::require_reduce_output(op, y, p, x.device(), "y");
  const T* xd = x.data();
  T* yd = y.data();
  detail::launch_forward(op, "cutrain_reduce_norm", p, x, xd, yd, detail::forward_args(p, x), static_cast<float>(pn));
}

// dx = scale * dy broadcast over p's reduced axes. dy: p.out_shape, any strides; dx: p.in_shape.
template <GpuFloat T>
void reduce_sum_backward(const Tensor<T>& dy, const ReducePlan& p, double scale, Tensor<T>& dx) {
  constexpr std::string_view op = "cuda::kernels::reduce_sum_backward";
  detail::require_cuda_input(op, dy, "dy");
  detail::require_grad_output(op, dx, p, dy.device());
  const auto a = detail::grad_args(p, dx.strides(), dy.strides(), dy.strides());
  const T* dyd = dy.data();
  T* dxd = dx.data();
  detail::launch_backward(op, "cutrain_reduce_sum_backward", p, dy, dyd, dxd, a, static_cast<float>(scale));
}

// dx = dy at the element indices names, 0 elsewhere (max and min).
template <GpuFloat T>
void reduce_arg_backward(const Tensor<T>& dy, const Tensor<std::int32_t>& indices, const ReducePlan& p, Tensor<T>& dx) {
  constexpr std::string_view op = "cuda::kernels::reduce_arg_backward";
  detail::require_cuda_input(op, dy, "dy");
  detail::require_cuda_input(op, indices, "indices");
  detail::require_grad_output(op, dx, p, dy.device());
  const auto a = detail::grad_args(p, dx.strides(), dy.strides(), indices.strides());
  const T* dyd = dy.data();
  const int* id = reinterpret_cast<const int*>(indices.data());
  T* dxd = dx.data();
  detail::launch_backward(op, "cutrain_reduce_arg_backward", p, dy, dyd, id, dxd, a);
}

// dx = dy * 2 (x - mean) / (n_red - correction); the mean is recomputed in f32.
template <GpuFloat T>
void reduce_var_backward(const Tensor<T>& x, const Tensor<T>& dy, const ReducePlan& p, double correction, Tensor<T>& dx) {
  constexpr std::string_view op = "cuda::kernels::reduce_var_backward";
  detail::require_cuda_input(op, x, "x");
  detail::require_cuda_input(op, dy, "dy");
  detail::require_grad_output(op, dx, p, x.device());
  if (p.in_shape.numel() == 0) return;
  const double n = static_cast<double>(p.n_red);
  Tensor<float> mean(p.out_shape, {.device = x.device()});
  {
    const T* xd = x.data();
    float* md = mean.data();
    detail::launch_forward(op, "cutrain_reduce_sum_f32", p, x, xd, md, detail::forward_args(p, x),
                           static_cast<float>(1.0 / n));
  }
  const auto a = detail::grad_args(p, x.strides(), dy.strides(), mean.strides());
  const T* xd = x.data();
  const float* md = mean.data();
  const T* dyd = dy.data();
  T* dxd = dx.data();
  detail::launch_backward(op, "cutrain_reduce_var_backward", p, dy, xd, md, dyd, dxd, a,
                          static_cast<float>(2.0 / (n - correction)));
}

// y = norm_pn(x) (forward's output): dx = dy sign(x) (|x| / y)^(pn - 1), 0 where y is 0.
template <GpuFloat T>
void reduce_norm_backward(const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& dy, const ReducePlan& p, double pn,
                          Tensor<T>& dx) {
  constexpr std::string_view op = "cuda::kernels::reduce_norm_backward";
  detail::require_cuda_input(op, x, "x");
  detail::require_cuda_input(op, y, "y");
  detail::require_cuda_input(op, dy, "dy");
  detail::require_grad_output(op, dx, p, x.device());
  const auto a = detail::grad_args(p, x.strides(), dy.strides(), y.strides());
  const T* xd = x.data();
  const T* yd = y.data();
  const T* dyd = dy.data();
  T* dxd = dx.data();
  detail::launch_backward(op, "cutrain_reduce_norm_backward", p, dy, xd, yd, dyd, dxd, a, static_cast<float>(pn));
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
