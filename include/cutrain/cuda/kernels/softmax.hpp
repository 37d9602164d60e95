// Softmax and log-softmax along any axis of a tensor of any rank >= 1, forward and backward, on
// the GPU (NVRTC kernels), with the CPU's semantics (cpu/softmax.hpp): each row is shifted by its
// maximum first, so large logits neither overflow nor give NaN. The last axis: one block per row
// (so C may be anything from 1 to hundreds of thousands); another axis: a block or a thread per
// row reading its elements in place, `inner` apart. f32 arithmetic and accumulation in a fixed
// order (deterministic), outputs rounded once to T.
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

// A rank >= 1 input on a CUDA device with axis in [0, rank) of size > 0, and few enough rows for
// one block each.
template <class T>
void require_axis_input(std::string_view op, const Tensor<T>& t, int axis, std::string_view name) {
  require_cuda_input(op, t, name);
  CUTRAIN_REQUIRE(t.rank() >= 1 && axis >= 0 && axis < t.rank() && t.dim(axis) > 0, InvalidArgument, op, name,
                  " must have rank >= 1 and a non-empty axis ", axis, ", got ", t.describe());
}

// The rows: x viewed as [outer, C, inner] around the axis.
struct SoftmaxGeometry {
  long long outer = 1, C = 1, inner = 1;
  long long rows() const { return outer * inner; }
};

template <class T>
SoftmaxGeometry softmax_geometry(const Tensor<T>& t, int axis) {
  SoftmaxGeometry g;
  g.C = t.dim(axis);
  for (int d = 0; d < axis; ++d) g.outer *= t.dim(d);
  for (int d = axis + 1; d < t.rank(); ++d) g.inner *= t.dim(d);
  return g;
}

// Strided rows (a block per row) when there are too few rows to fill the GPU with a thread per
// row, or they are so long that one thread each would serialize; else columns.
inline bool softmax_use_cols(const SoftmaxGeometry& g) { return g.rows() >= 4096 || (g.rows() >= 1024 && g.C <= 256); }

// out = softmax or log-softmax of x along axis.
template <GpuFloat T>
void softmax_axis_forward(std::string_view op, bool log, const Tensor<T>& x, int axis, Tensor<T>& y) {
  require_axis_input(op, x, axis, "x");
  require_output(op, y, x.shape(), x.device(), "y");
  CUTRAIN_REQUIRE(y.layout() == Layout::row_major || y.layout() == Layout::nchw, InvalidArgument, op,
                  "y must be row-major, got ", y.describe());
  const SoftmaxGeometry g = softmax_geometry(x, axis);
  if (g.rows() == 0) return;
  const Tensor<T> xs = staged(x, Layout::row_major);
  const int dev = x.device().index;
  DeviceScope scope(dev);
  const Program& prog = softmax_program<T>();
  const int lg = log ? 1 : 0;
  if (g.inner == 1) {
    CUTRAIN_REQUIRE(g.rows() < (1LL << 31), InvalidArgument, op, "at most 2^31 - 1 rows (one block each), got ",
                    x.describe());
    launch(function(dev, prog, log ? "cutrain_log_softmax_forward" : "cutrain_softmax_forward"),
           static_cast<unsigned>(g.rows()), softmax_threads(g.C), op, xs.data(), y.data(), g.C);
  } else if (softmax_use_cols(g)) {
    launch(function(dev, prog, "cutrain_softmax_forward_cols"), grid_for(g.rows(), 128), 128u, op, xs.data(), y.data(),
           g.C, g.inner, g.rows(), lg);
  } else {
    launch(function(dev, prog, "cutrain_softmax_forward_strided"), static_cast<unsigned>(g.rows()),
           softmax_threads(g.C), op, xs.data(), y.data(), g.C, g.inner, lg);
  }
}

// dx = the backward of softmax or log-softmax along axis, from its output y and dy.
template <GpuFloat T>
void softmax_axis_backward(std::string_view op, bool log, const Tensor<T>& y, const Tensor<T>& dy, int axis,
                           Tensor<T>& dx) {
  require_axis_input(op, y, axis, "y");
  require_cuda_input(op, dy, "dy");
  CUTRAIN_REQUIRE(dy.shape() == y.shape(), InvalidArgument, op, "dy must have y's shape ", y.shape(), ", got ",
                  dy.describe());
  CUTRAIN_REQUIRE(dy.device() == y.device(), DeviceError, op, "y ", y.describe(), " and dy ", dy.describe(),
                  " are on different devices");
  require_output(op, dx, y.shape(), y.device(), "dx");
  CUTRAIN_REQUIRE(dx.layout() == Layout::row_major || dx.layout() == Layout::nchw, InvalidArgument, op,
                  "dx must be row-major, got ", dx.describe());
  const SoftmaxGeometry g = softmax_geometry(y, axis);
  if (g.rows() == 0) return;
  const Tensor<T> ys = staged(y, Layout::row_major), dys = staged(dy, Layout::row_major);
  const int dev = y.device().index;
  DeviceScope scope(dev);
  const Program& prog = softmax_program<T>();
  const int lg = log ? 1 : 0;
  if (g.inner == 1) {
    CUTRAIN_REQUIRE(g.rows() < (1LL << 31), InvalidArgument, op, "at most 2^31 - 1 rows (one block each), got ",
                    y.describe());
    launch(function(dev, prog, log ? "cutrain_log_softmax_backward" : "cutrain_softmax_backward"),
           static_cast<unsigned>(g.rows()), softmax_threads(g.C), op, ys.data(), dys.data(), dx.data(), g.C);
  } else if (softmax_use_cols(g)) {
    launch(function(dev, prog, "cutrain_softmax_backward_cols"), grid_for(g.rows(), 128), 128u, op, ys.data(),
           dys.data(), dx.data(), g.C, g.inner, g.rows(), lg);
  } else {
    launch(function(dev, prog, "cutrain_softmax_backward_strided"), static_cast<unsigned>(g.rows()),
           softmax_threads(g.C), op, ys.data(), dys.data(), dx.data(), g.C, g.inner, lg);
  }
}

// axis in [-rank, rank) as [0, rank).
template <class T>
int softmax_axis(std::string_view op, const Tensor<T>& t, int axis) {
  const int r = t.defined() ? t.rank() : 0;
  CUTRAIN_REQUIRE(r >= 1 && axis >= -r && axis < r, InvalidArgument, op, "axis ", axis, " out of range for ",
                  t.defined() ? t.describe() : std::string("an undefined tensor"), " (rank ", r, ")");
  return axis < 0 ? axis + r : axis;
}
}  // namespace detail

// y = softmax(x) along axis (negative counts from the end; default the last). x (rank >= 1, the
// axis non-empty) may be strided: it is staged to row-major on its device. y is a row-major
// tensor of x's shape on x's device. The last axis takes the [N, C] path (a block per row);
// another axis reads its rows s = inner apart in place, with no permute.
template <GpuFloat T>
void softmax_forward(const Tensor<T>& x, Tensor<T>& y, int axis = -1) {
  constexpr std::string_view op = "cuda::kernels::softmax_forward";
  detail::softmax_axis_forward(op, false, x, detail::softmax_axis(op, x, axis), y);
}

// y = log_softmax(x) = x - max - log(sum exp(x - max)) along axis; as softmax_forward.
template <GpuFloat T>
void log_softmax_forward(const Tensor<T>& x, Tensor<T>& y, int axis = -1) {
  constexpr std::string_view op = "cuda::kernels::log_softmax_forward";
  detail::softmax_axis_forward(op, true, x, detail::softmax_axis(op, x, axis), y);
}

// dx = y (dy - sum_k dy_k y_k) along axis, y = softmax_forward's output. y and dy are staged to
// row-major; dx is a row-major tensor of y's shape on their device.
template <GpuFloat T>
void softmax_backward(const Tensor<T>& y, const Tensor<T>& dy, Tensor<T>& dx, int axis = -1) {
  constexpr std::string_view op = "cuda::kernels::softmax_backward";
  detail::softmax_axis_backward(op, false, y, dy, detail::softmax_axis(op, y, axis), dx);
}

// dx = dy - exp(y) sum_k dy_k along axis, y = log_softmax_forward's output; as softmax_backward.
template <GpuFloat T>
void log_softmax_backward(const Tensor<T>& y, const Tensor<T>& dy, Tensor<T>& dx, int axis = -1) {
  constexpr std::string_view op = "cuda::kernels::log_softmax_backward";
  detail::softmax_axis_backward(op, true, y, dy, detail::softmax_axis(op, y, axis), dx);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
