// Broadcasting elementwise ops on the GPU (NVRTC kernels, broadcast.cuh), with the semantics of
// cpu/broadcast.hpp: binary ops and their local gradients, unary ops and their backward,
// comparisons into u8 and where. Every input is read in place through its strides broadcast to
// the output's shape (views and stride-0 expand views included: never staged, never through the
// host); the output, allocated by the caller, is contiguous (row-major or nhwc). Dims that every
// operand walks contiguously are merged first, so same-layout inputs index as one flat dim.
// f32 arithmetic, rounded once to T. Shapes were checked by the caller (ops/broadcast.hpp).
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "cutrain/core/params/elementwise.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::broadcast, the kernels of broadcast.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
// cutrain_bcast_args of broadcast.cuh, field for field.
struct BroadcastArgs {
  long long n, rank;
  long long size[8];
  long long stride[4][8];
};
static_assert(sizeof(BroadcastArgs) == 42 * sizeof(long long));
static_assert(max_broadcast_rank == 8, "the kernels' index arrays hold 8 dims");

template <GpuFloat T>
const Program& broadcast_program() {
  static const Program p = programs::broadcast(device_type<T>);
  return p;
}

// The kernel's geometry for `shape` and up to 4 operands' strides at it: size-1 dims dropped,
// and an outer dim merged into the next inner one wherever every operand's stride allows.
inline BroadcastArgs broadcast_args(const Shape& shape, const std::vector<Strides>& strides) {
  BroadcastArgs g{};
  g.n = shape.numel();
  struct Dim {
    long long size;
    std::array<long long, 4> stride;
  };
  std::vector<Dim> dims;
  for (int d = 0; d < shape.rank(); ++d) {
    if (shape[d] == 1) continue;
    Dim cur{shape[d], {}};
    for (std::size_t k = 0; k < strides.size(); ++k) cur.stride[k] = strides[k][static_cast<std::size_t>(d)];
    if (!dims.empty()) {
      Dim& outer = dims.back();
      bool merge = true;
      for (std::size_t k = 0; k < strides.size(); ++k) merge = merge && outer.stride[k] == cur.stride[k] * cur.size;
      if (merge) {
        outer.size *= cur.size;
        outer.stride = cur.stride;
        continue;
      }
    }
    dims.push_back(cur);
  }
  g.rank = static_cast<long long>(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) {
    g.size[d] = dims[d].size;
    for (std::size_t k = 0; k < 4; ++k) g.stride[k][d] = dims[d].stride[k];
  }
  return g;
}

// t's strides at `shape` (0 along broadcast dims), after checking that it is a CUDA input.
template <class U>
Strides input_strides(std::string_view op, const Tensor<U>& t, const Shape& shape, std::string_view name) {
  require_cuda_input(op, t, name);
  return cutrain::expand(t, shape).strides();
}

inline int code(BinaryOp o) { return static_cast<int>(o); }
inline int code(UnaryOp o) { return static_cast<int>(o); }
inline int code(CompareOp o) { return static_cast<int>(o); }
}  // namespace detail

// y = a op b; y has the broadcast shape (contiguous, on a's device).
template <GpuFloat T>
void broadcast_binary(BinaryOp kind, const Tensor<T>& a, const Tensor<T>& b, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::broadcast_binary";
  const Strides sa = detail::input_strides(op, a, y.shape(), "a"), sb = detail::input_strides(op, b, y.shape(), "b");
  detail::require_output(op, y, y.shape(), a.device(), "y");
  CUTRAIN_REQUIRE(b.device() == a.device(), DeviceError, op, "a ", a.describe(), " and b ", b.describe(),
                  " are on different devices");
  const auto g = detail::broadcast_args(y.shape(), {y.strides(), sa, sb});
  const T *ad = a.data(), *bd = b.data();
  T* yd = y.data();
  const int c = detail::code(kind);
  if (g.n == 0) return;
  DeviceScope scope(y.device().index);
  launch(function(y.device().index, detail::broadcast_program<T>(), "cutrain_bcast_binary"), grid_for(g.n), 256, op, ad,
         bd, yd, g, c);
}

// gr = dy * d(a op b)/d(input which), at dy's shape (the broadcast one).
template <GpuFloat T>
void broadcast_binary_grad(BinaryOp kind, const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy, int which,
                           Tensor<T>& gr) {
  constexpr std::string_view op = "cuda::kernels::broadcast_binary_grad";
  const Shape& s = dy.shape();
  const Strides sa = detail::input_strides(op, a, s, "a"), sb = detail::input_strides(op, b, s, "b"),
                sd = detail::input_strides(op, dy, s, "dy");
  detail::require_output(op, gr, s, dy.device(), "g");
  const auto g = detail::broadcast_args(s, {gr.strides(), sa, sb, sd});
  if (g.n == 0) return;
  const T *ad = a.data(), *bd = b.data(), *dd = dy.data();
  T* gd = gr.data();
  const int c = detail::code(kind);
  const int dev = gr.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::broadcast_program<T>(), "cutrain_bcast_binary_grad"), grid_for(g.n), 256, op, ad, bd, dd,
         gd, g, c, which);
}

// y = f(x) (p: pow's exponent, rounded to f32); y has x's shape.
template <GpuFloat T>
void unary(UnaryOp kind, const Tensor<T>& x, double p, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::unary";
  const Strides sx = detail::input_strides(op, x, x.shape(), "x");
  detail::require_output(op, y, x.shape(), x.device(), "y");
  const auto g = detail::broadcast_args(x.shape(), {y.strides(), sx});
  if (g.n == 0) return;
  const T* xd = x.data();
  T* yd = y.data();
  const int c = detail::code(kind);
  const float pf = static_cast<float>(p);
  const int dev = y.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::broadcast_program<T>(), "cutrain_bcast_unary"), grid_for(g.n), 256, op, xd, yd, g, c, pf);
}

// dx = dy * f'(x); x, dy and dx of one shape.
template <GpuFloat T>
void unary_backward(UnaryOp kind, const Tensor<T>& x, const Tensor<T>& dy, double p, Tensor<T>& dx) {
  constexpr std::string_view op = "cuda::kernels::unary_backward";
  const Strides sx = detail::input_strides(op, x, x.shape(), "x");
  CUTRAIN_REQUIRE(dy.defined() && dy.shape() == x.shape(), InvalidArgument, op, "dy must have x's shape ", x.shape(),
                  ", got ", dy.describe());
  const Strides sd = detail::input_strides(op, dy, x.shape(), "dy");
  detail::require_output(op, dx, x.shape(), x.device(), "dx");
  const auto g = detail::broadcast_args(x.shape(), {dx.strides(), sx, sd});
  if (g.n == 0) return;
  const T *xd = x.data(), *dd = dy.data();
  T* od = dx.data();
  const int c = detail::code(kind);
  const float pf = static_cast<float>(p);
  const int dev = dx.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::broadcast_program<T>(), "cutrain_bcast_unary_grad"), grid_for(g.n), 256, op, xd, dd, od,
         g, c, pf);
}

// y = (a op b) ? 1 : 0 in u8; y has the broadcast shape.
template <GpuFloat T>
void compare(CompareOp kind, const Tensor<T>& a, const Tensor<T>& b, Tensor<std::uint8_t>& y) {
  constexpr std::string_view op = "cuda::kernels::compare";
  const Strides sa = detail::input_strides(op, a, y.shape(), "a"), sb = detail::input_strides(op, b, y.shape(), "b");
  detail::require_output(op, y, y.shape(), a.device(), "y");
  const auto g = detail::broadcast_args(y.shape(), {y.strides(), sa, sb});
  if (g.n == 0) return;
  const T *ad = a.data(), *bd = b.data();
  unsigned char* yd = reinterpret_cast<unsigned char*>(y.data());
  const int c = detail::code(kind);
  const int dev = y.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::broadcast_program<T>(), "cutrain_bcast_compare"), grid_for(g.n), 256, op, ad, bd, yd, g, c);
}

// y = cond != 0 ? a : b; y has the broadcast shape of the three.
template <GpuFloat T>
void where(const Tensor<std::uint8_t>& cond, const Tensor<T>& a, const Tensor<T>& b, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::where";
  const Strides sc = detail::input_strides(op, cond, y.shape(), "cond"), sa = detail::input_strides(op, a, y.shape(), "a"),
                sb = detail::input_strides(op, b, y.shape(), "b");
  detail::require_output(op, y, y.shape(), a.device(), "y");
  const auto g = detail::broadcast_args(y.shape(), {y.strides(), sc, sa, sb});
  if (g.n == 0) return;
  const unsigned char* cd = reinterpret_cast<const unsigned char*>(cond.data());
  const T *ad = a.data(), *bd = b.data();
  T* yd = y.data();
  const int dev = y.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::broadcast_program<T>(), "cutrain_bcast_where"), grid_for(g.n), 256, op, cd, ad, bd, yd, g);
}

// gr = dy where cond selects input which (0: a, 1: b), else 0, at dy's shape; cond broadcasts to it.
template <GpuFloat T>
void where_grad(const Tensor<std::uint8_t>& cond, const Tensor<T>& dy, int which, Tensor<T>& gr) {
  constexpr std::string_view op = "cuda::kernels::where_grad";
  const Shape& s = dy.shape();
  const Strides sc = detail::input_strides(op, cond, s, "cond"), sd = detail::input_strides(op, dy, s, "dy");
  detail::require_output(op, gr, s, dy.device(), "g");
  const auto g = detail::broadcast_args(s, {gr.strides(), sc, sd});
  if (g.n == 0) return;
  const unsigned char* cd = reinterpret_cast<const unsigned char*>(cond.data());
  const T* dd = dy.data();
  T* gd = gr.data();
  const int dev = gr.device().index;
  DeviceScope scope(dev);
  launch(function(dev, detail::broadcast_program<T>(), "cutrain_bcast_where_grad"), grid_for(g.n), 256, op, cd, dd, gd, g,
         which);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
