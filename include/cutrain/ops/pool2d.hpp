// pool2d_forward / pool2d_backward / global_avg_pool_forward / global_avg_pool_backward, and a max
// pool's indices with max_unpool2d: validate, then dispatch on the tensors' device.
//
// On the GPU all four are NVRTC kernels (cuda/kernels/pool2d.hpp), not cuDNN: cuDNN's graph API
// (cudnn-frontend 1.32, cuDNN 9.19) has a resample forward node but no pooling backward, and the
// legacy cudnnPooling* calls are deprecated.
#pragma once

#include "cutrain/core/abi.hpp"

#include <limits>

#include "cutrain/core/view.hpp"
#include "cutrain/cpu/pool2d.hpp"
#include "cutrain/ops/dispatch.hpp"
#include "cutrain/ops/index.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/pool2d.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
template <class T>
void check_pool_input(std::string_view op, const Tensor<T>& x) {
  check::rank(op, x, 4, "x");
  check::non_empty(op, x, "x");
}
}  // namespace detail

template <class T>
Tensor<T> pool2d_forward(const Tensor<T>& x, const Pool2dParams& p) {
  constexpr std::string_view op = "pool2d_forward";
  detail::check_pool_input(op, x);
  [[maybe_unused]] const Shape out = pool2d_output_shape(x.shape(), p, op);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& x) { return cpu::pool2d_forward(x, p); },
      CUTRAIN_IF_CUDA([&](const auto& x) {
        Tensor<T> y = detail::device_output<T>(out, x);
        cuda::kernels::pool2d_forward(x, p, y);
        return y;
      }),
      x);
}

// dx for dy = dL/dy, where y = pool2d_forward(x, p). dx takes x's layout.
template <class T>
Tensor<T> pool2d_backward(const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& dy, const Pool2dParams& p) {
  constexpr std::string_view op = "pool2d_backward";
  detail::check_pool_input(op, x);
  const Shape out = pool2d_output_shape(x.shape(), p, op);
  check::shape(op, y, out, "y");
  check::shape(op, dy, out, "dy");
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& x, const auto& y, const auto& dy) { return cpu::pool2d_backward(x, y, dy, p); },
      // y is not needed: the kernel recomputes each window's argmax from x.
      CUTRAIN_IF_CUDA([&](const auto& x, const auto&, const auto& dy) {
        Tensor<T> dx = detail::device_output<T>(x.shape(), x);
        cuda::kernels::pool2d_backward(x, dy, p, dx);
        return dx;
      }),
      x, y, dy);
}

// A max pool's indices (PyTorch's return_indices): int32 [N, C, OH, OW], NCHW, on x's device; each
// the flat index h W + w, in its (n, c) plane of x, of its window's maximum: the element
// pool2d_forward returns and pool2d_backward routes the gradient to (the first maximum in
// row-then-column order, or the first NaN).
template <class T>
Tensor<std::int32_t> max_pool2d_indices(const Tensor<T>& x, const Pool2dParams& p) {
  constexpr std::string_view op = "max_pool2d_indices";
  detail::check_pool_input(op, x);
  CUTRAIN_REQUIRE(p.mode == PoolMode::max, InvalidArgument, op, "indices are a max pool's; got ", p);
  CUTRAIN_REQUIRE(x.dim(2) <= std::numeric_limits<std::int32_t>::max() / x.dim(3), InvalidArgument, op, "x ",
                  x.describe(), " has planes of more than 2^31 - 1 elements: their indices do not fit int32");
  [[maybe_unused]] const Shape out = pool2d_output_shape(x.shape(), p, op);
  return detail::dispatch<Tensor<std::int32_t>>(
      op, [&](const auto& x) { return cpu::max_pool2d_indices(x, p); },
      CUTRAIN_IF_CUDA([&](const auto& x) {
        Tensor<std::int32_t> idx(out, {.device = x.device()});
        cuda::kernels::max_pool2d_indices(x, p, idx);
        return idx;
      }),
      x);
}

// The inverse of a max pool (PyTorch's max_unpool2d): x [N, C, H, W] (x_shape; NCHW) zero but where
// indices (max_pool2d_indices) point, which get the values of y [N, C, OH, OW]. Where two windows
// chose the same element their values add up, so max_unpool2d(dy, indices, x.shape()) is the max
// pool's gradient (pool2d_backward).
template <class T>
Tensor<T> max_unpool2d(const Tensor<T>& y, const Tensor<std::int32_t>& indices, const Shape& x_shape) {
  constexpr std::string_view op = "max_unpool2d";
  check::rank(op, y, 4, "y [N, C, OH, OW]");
  CUTRAIN_REQUIRE(indices.defined() && indices.shape() == y.shape(), InvalidArgument, op,
                  "indices must have y's shape ", y.describe(), ", got ",
                  indices.defined() ? indices.describe() : std::string("an undefined tensor"));
  CUTRAIN_REQUIRE(indices.device() == y.device(), DeviceError, op, "indices are on ", indices.device(), ", y on ",
                  y.device());
  CUTRAIN_REQUIRE(x_shape.rank() == 4 && x_shape[0] == y.dim(0) && x_shape[1] == y.dim(1) && x_shape[2] > 0 &&
                      x_shape[3] > 0 && x_shape[2] <= std::numeric_limits<std::int32_t>::max() / x_shape[3],
                  InvalidArgument, op, "x_shape must be [N, C, H, W] with y's N and C and H W < 2^31, got ", x_shape,
                  " for y ", y.describe());
  const std::int64_t planes = y.dim(0) * y.dim(1);
  if (planes == 0 || y.numel() == 0) return Tensor<T>::zeros(x_shape, {.device = y.device()});
  const Shape flat{planes, y.dim(2) * y.dim(3)};
  const Tensor<T> y2 = cutrain::reshape(y.contiguous(Layout::row_major), flat);
  const Tensor<std::int32_t> i2 = cutrain::reshape(indices.contiguous(Layout::row_major), flat);
  return cutrain::reshape(gather_backward(y2, Shape{planes, x_shape[2] * x_shape[3]}, 1, i2), x_shape);
}

// [N, C, H, W] -> [N, C, 1, 1], the mean over each channel's plane.
template <class T>
Tensor<T> global_avg_pool_forward(const Tensor<T>& x) {
  constexpr std::string_view op = "global_avg_pool_forward";
  detail::check_pool_input(op, x);
  return detail::dispatch<Tensor<T>>(
      op, [](const auto& x) { return cpu::global_avg_pool_forward(x); },
      CUTRAIN_IF_CUDA([](const auto& x) {
        Tensor<T> y = detail::device_output<T>(Shape{x.dim(0), x.dim(1), 1, 1}, x);
        cuda::kernels::global_avg_pool_forward(x, y);
        return y;
      }),
      x);
}

// dx of shape x_shape for dy of shape [N, C, 1, 1]. A [N, C, 1, 1] tensor does not show whether x
// was nchw or nhwc, so the caller says which layout dx should take (nchw or nhwc).
template <class T>
Tensor<T> global_avg_pool_backward(const Tensor<T>& dy, const Shape& x_shape, Layout dx_layout = Layout::nchw) {
  constexpr std::string_view op = "global_avg_pool_backward";
  CUTRAIN_REQUIRE(x_shape.rank() == 4, InvalidArgument, op, "x_shape must be 4-d [N,C,H,W], got ", x_shape);
  for (auto d : x_shape)
    CUTRAIN_REQUIRE(d > 0, InvalidArgument, op, "x_shape ", x_shape, " has a zero or negative dimension");
  CUTRAIN_REQUIRE(shape_fits(x_shape, sizeof(T)), InvalidArgument, op, "x_shape ", x_shape,
                  " is too large: its byte count overflows int64");
  CUTRAIN_REQUIRE(dx_layout == Layout::nchw || dx_layout == Layout::row_major || dx_layout == Layout::nhwc,
                  InvalidArgument, op, "dx_layout must be nchw or nhwc, got ", dx_layout);
  check::shape(op, dy, Shape{x_shape[0], x_shape[1], 1, 1}, "dy");
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& dy) { return cpu::global_avg_pool_backward(dy, x_shape, dx_layout); },
      CUTRAIN_IF_CUDA([&](const auto& dy) {
        Tensor<T> dx(x_shape, {.layout = dx_layout == Layout::nhwc ? Layout::nhwc : Layout::row_major, .device = dy.device()});
        cuda::kernels::global_avg_pool_backward(dy, dx);
        return dx;
      }),
      dy);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
