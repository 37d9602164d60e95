// Pooling on the GPU (NVRTC kernels) with the semantics of cpu/pool2d.hpp: max (the first maximum
// in row-then-column order wins ties, a NaN wins outright, padding acts as -inf) and average
// (count_include_pad on or off), ceil mode with PyTorch's window rules, asymmetric padding,
// dilation (on a separate, simple path: pool2d_dilated.cuh); and
// global average pooling. Forward and backward, in f32, bf16 and f16 with f32 sums. Every tensor
// is indexed by its own strides: x, y, dy and dx may each be NCHW or NHWC, and inputs may be
// strided views. Outputs are written in whatever contiguous layout the caller allocated.
//
// Why kernels and not cuDNN: cuDNN's graph API (cudnn-frontend 1.32, cuDNN 9.19) has a resample
// forward node but no pooling backward, and the legacy cudnnPooling* calls are deprecated
// (DESIGN.md, decision 1). The backward here is a gather: each dx element visits the output
// windows that contain it and adds their dy where it is their argmax, which a first pass
// recomputes from x with the forward's tie rule (one int per output, in the workspace arena). So
// it needs no indices saved by the forward and no atomics, and its result is deterministic.
// Windows that tile the input (2x2 stride 2 on even sizes) take a one-pass kernel instead.
// Dilation != 1 takes a separate, simple path (pool2d_dilated.cuh: one element per thread, the
// backward a gather that recomputes each window's maximum), so that the fast kernels stay as
// they are.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include "cutrain/core/params/pool2d.hpp"
#include "cutrain/cuda/gpu_float.hpp"
#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::pool2d, the kernels of pool2d.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
template <GpuFloat T>
const Program& pool2d_program() {
  static const Program p = programs::pool2d(device_type<T>);
  return p;
}
template <GpuFloat T>
const Program& pool2d_dilated_program() {
  static const Program p = programs::pool2d_dilated(device_type<T>);
  return p;
}

// The magic of the kernels' FastDiv: for 0 <= n < 2^31, n / d == (umulhi(n, m) + n) >> s with
// s = ceil(log2 d) and m = 2^32 (2^s - d) / d + 1 (Granlund and Montgomery, as PyTorch's
// IntDivider). Returns m | s << 32; d must be in [1, 2^31).
inline unsigned long long fast_div_magic(std::int64_t d) {
  CUTRAIN_REQUIRE(d >= 1 && d < (std::int64_t{1} << 31), InvalidArgument, "cuda::kernels::fast_div_magic", "divisor ",
                  d, " is outside [1, 2^31)");
  const auto ud = static_cast<std::uint64_t>(d);
  std::uint64_t s = 0;
  while ((std::uint64_t{1} << s) < ud) ++s;
  const std::uint64_t m = (std::uint64_t{1} << 32) * ((std::uint64_t{1} << s) - ud) / ud + 1;
  return m | (s << 32);
}

// Below this many elements the kernels index in 32 bits (and need the magic numbers); from it on
// they divide in 64 bits.
inline constexpr long long narrow_limit = 0x80000000LL;

struct Magic3 {
  unsigned long long m0 = 0, m1 = 0, m2 = 0;
};

// The magic numbers for the kernels' unravel4 over a [N, C, H, W] tensor of `total` elements
// walked in memory order: inner extents (C, W, H) when channels_last, else (W, H, C).
inline Magic3 unravel_magic(long long total, long long C, long long H, long long W, bool channels_last) {
  if (total >= narrow_limit) return {};
  if (channels_last) return {fast_div_magic(C), fast_div_magic(W), fast_div_magic(H)};
  return {fast_div_magic(W), fast_div_magic(H), fast_div_magic(C)};
}

// Whether channels are innermost in t's memory (NHWC), which decides the order in which threads
// walk the tensor they write. When C == 1 or H == W == 1 both orders are the same memory order.
template <class T>
bool channels_last(const Tensor<T>& t) {
  return t.strides()[1] < t.strides()[3];
}

inline long long ll(std::int64_t v) { return static_cast<long long>(v); }

// How many adjacent channels one thread moves (> 1: the _vec kernels): VMAX = 16 bytes of T when, in
// every tensor given, channels are innermost and dense (stride 1), C and the other strides are
// multiples of VMAX and the data is 16-byte aligned, so that each pack is one aligned 16-byte
// load or store; else 1. Threads must then walk in channels-last order.
template <class T>
int pool_vec(std::int64_t C, std::initializer_list<const Tensor<T>*> tensors) {
  constexpr std::int64_t V = 16 / sizeof(T);
  if (C % V != 0) return 1;
  for (const Tensor<T>* t : tensors) {
    const auto& st = t->strides();
    if (st[1] != 1 || st[0] % V != 0 || st[2] % V != 0 || st[3] % V != 0 ||
        reinterpret_cast<std::uintptr_t>(t->data()) % 16 != 0)
      return 1;
  }
  return static_cast<int>(V);
}

// The pooling geometry as the kernels take it.
struct PoolDims {
  long long N, C;
  int H, W, OH, OW, kh, kw, sh, sw, pt, pb, pl, pr, avg, count_include_pad;

  // The windows tile the input exactly: every input element lies in exactly one window.
  bool tiles() const { return sh == kh && sw == kw && pt == 0 && pb == 0 && pl == 0 && pr == 0 && OH * kh == H && OW * kw == W; }
};

// Validates x's shape and p (as the CPU does) and checks that the kernels' 32-bit window
// arithmetic cannot overflow.
inline PoolDims pool_dims(std::string_view op, const Shape& x, const Pool2dParams& p) {
  const Shape y = pool2d_output_shape(x, p, op);
  // These kernels walk contiguous windows; pool2d_forward and pool2d_backward send dilated ones to
  // the pool2d_dilated kernels before they get here.
  CUTRAIN_REQUIRE(p.dilation_h == 1 && p.dilation_w == 1, InvalidArgument, op,
                  "the contiguous-window pooling kernels got a dilated window: input ", x, " with ", p);
  const std::int64_t sh = p.effective_stride_h(), sw = p.effective_stride_w();
  constexpr std::int64_t limit = std::int64_t{1} << 30;
  CUTRAIN_REQUIRE(x[2] + p.pad_top + p.pad_bottom + p.kernel_h + sh < limit &&
                      x[3] + p.pad_left + p.pad_right + p.kernel_w + sw < limit &&
                      std::int64_t{p.kernel_h} * p.kernel_w < limit,
                  NotImplemented, op, "the GPU pooling kernels compute windows in 32 bits: input ", x, " with ", p,
                  " is too large (each spatial extent plus its padding, kernel and stride must stay below 2^30)");
  return {x[0],
          x[1],
          static_cast<int>(x[2]),
          static_cast<int>(x[3]),
          static_cast<int>(y[2]),
          static_cast<int>(y[3]),
          p.kernel_h,
          p.kernel_w,
          static_cast<int>(sh),
          static_cast<int>(sw),
          p.pad_top,
          p.pad_bottom,
          p.pad_left,
          p.pad_right,
          p.mode == PoolMode::average ? 1 : 0,
          p.count_include_pad ? 1 : 0};
}

// The plans: which kernels, their grids and their arguments. run(kernel, grid, block, args...)
// launches one (on the GPU: launch(function(...))); the plans touch no device memory themselves.
template <class T, class Run>
void pool2d_forward_plan(const Tensor<T>& x, const PoolDims& d, Tensor<T>& y, Run&& run) {
  const bool cl = channels_last(y);
  const int vec = cl ? pool_vec<T>(d.C, {&x, &y}) : 1;
  const long long total = y.numel() / vec;  // one thread per vec adjacent outputs
  const Magic3 mg = unravel_magic(total, d.C / vec, d.OH, d.OW, cl);
  const auto &xs = x.strides(), &ys = y.strides();
  run(vec > 1 ? "cutrain_pool2d_forward_vec" : "cutrain_pool2d_forward", dim3(grid_for(total)), dim3(256), x.data(),
      y.data(), d.C, d.H, d.W, d.OH, d.OW, d.kh, d.kw, d.sh, d.sw, d.pt, d.pb, d.pl, d.pr, d.avg, d.count_include_pad,
      ll(xs[0]), ll(xs[1]), ll(xs[2]), ll(xs[3]), ll(ys[0]), ll(ys[1]), ll(ys[2]), ll(ys[3]), total, cl ? 1 : 0, mg.m0,
      mg.m1, mg.m2);
}

// The backward. Windows that tile the input: one kernel, one thread per window. Otherwise a
// gather over dx; for max pooling it is preceded by an argmax pass that writes each window's
// argmax (an int per output) into scratch(bytes), so that the gather does not rescan windows.
template <class T, class Scratch, class Run>
void pool2d_backward_plan(const Tensor<T>& x, const Tensor<T>& dy, const PoolDims& d, Tensor<T>& dx, Scratch&& scratch,
                          Run&& run) {
  const bool cl = channels_last(dx);
  const auto &xs = x.strides(), &dys = dy.strides(), &dxs = dx.strides();
  if (d.tiles()) {
    const int vec = cl ? pool_vec<T>(d.C, {&x, &dy, &dx}) : 1;
    const long long total = dy.numel() / vec;  // one thread per vec adjacent windows
    const Magic3 mg = unravel_magic(total, d.C / vec, d.OH, d.OW, cl);
    run(vec > 1 ? "cutrain_pool2d_backward_tiled_vec" : "cutrain_pool2d_backward_tiled", dim3(grid_for(total)),
        dim3(256), x.data(), dy.data(), dx.data(), d.C, d.H, d.W, d.OH, d.OW, d.kh, d.kw, d.avg, ll(xs[0]), ll(xs[1]),
        ll(xs[2]), ll(xs[3]), ll(dys[0]), ll(dys[1]), ll(dys[2]), ll(dys[3]), ll(dxs[0]), ll(dxs[1]), ll(dxs[2]),
        ll(dxs[3]), total, cl ? 1 : 0, mg.m0, mg.m1, mg.m2);
    return;
  }
  // The argmax of each window, in dy's extents walked in dx's order. The _vec kernels read and
  // write it in packs of VMAX ints, which must be aligned to their size.
  const int* arg = nullptr;
  bool arg_packs = true;
  if (!d.avg) {
    const long long outputs = dy.numel();
    int* a = scratch(static_cast<std::size_t>(outputs) * sizeof(int));
    arg_packs = reinterpret_cast<std::uintptr_t>(a) % (16 / sizeof(T) * sizeof(int)) == 0;
    const int vec = cl && arg_packs ? pool_vec<T>(d.C, {&x}) : 1;
    const long long total = outputs / vec;
    const Magic3 mg = unravel_magic(total, d.C / vec, d.OH, d.OW, cl);
    run(vec > 1 ? "cutrain_pool2d_argmax_vec" : "cutrain_pool2d_argmax", dim3(grid_for(total)), dim3(256), x.data(), a,
        d.C, d.H, d.W, d.OH, d.OW, d.kh, d.kw, d.sh, d.sw, d.pt, d.pb, d.pl, d.pr, ll(xs[0]), ll(xs[1]), ll(xs[2]),
        ll(xs[3]), total, cl ? 1 : 0, mg.m0, mg.m1, mg.m2);
    arg = a;
  }
  const int vec = cl && arg_packs ? pool_vec<T>(d.C, {&dy, &dx}) : 1;
  const long long total = dx.numel() / vec;  // one thread per vec adjacent dx elements
  const Magic3 mg = unravel_magic(total, d.C / vec, d.H, d.W, cl);
  run(vec > 1 ? "cutrain_pool2d_backward_vec" : "cutrain_pool2d_backward", dim3(grid_for(total)), dim3(256), arg,
      cl ? 1 : 0, dy.data(), dx.data(), d.C, d.H, d.W, d.OH, d.OW, d.kh, d.kw, d.sh, d.sw, d.pt, d.pb, d.pl, d.pr, d.avg,
      d.count_include_pad, ll(dys[0]), ll(dys[1]), ll(dys[2]), ll(dys[3]), ll(dxs[0]), ll(dxs[1]), ll(dxs[2]),
      ll(dxs[3]), total, cl ? 1 : 0, mg.m0, mg.m1, mg.m2, fast_div_magic(d.sh), fast_div_magic(d.sw));
}

template <class T, class Run>
void global_avg_pool_forward_plan(const Tensor<T>& x, Tensor<T>& y, Run&& run) {
  const long long N = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  const auto &xs = x.strides(), &ys = y.strides();
  if (xs[1] == 1 && C > 1) {  // channels innermost (NHWC): a warp reads 32 adjacent channels
    const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(std::min<long long>(N, 65535)));
    run("cutrain_global_avg_pool_channels", grid, dim3(32, 8), x.data(), y.data(), N, C, H, W, ll(xs[0]), ll(xs[1]),
        ll(xs[2]), ll(xs[3]), ll(ys[0]), ll(ys[1]));
  } else {  // one warp per plane, 8 planes per block
    const long long blocks = std::min<long long>((N * C + 7) / 8, 65535);
    run("cutrain_global_avg_pool_planes", dim3(static_cast<unsigned>(blocks)), dim3(256), x.data(), y.data(), N, C, H,
        W, ll(xs[0]), ll(xs[1]), ll(xs[2]), ll(xs[3]), ll(ys[0]), ll(ys[1]));
  }
}

template <class T, class Run>
void global_avg_pool_backward_plan(const Tensor<T>& dy, Tensor<T>& dx, Run&& run) {
  const long long C = dx.dim(1), H = dx.dim(2), W = dx.dim(3), total = dx.numel();
  const bool cl = channels_last(dx);
  const Magic3 mg = unravel_magic(total, C, H, W, cl);
  const auto &dys = dy.strides(), &dxs = dx.strides();
  run("cutrain_global_avg_pool_backward", dim3(grid_for(total)), dim3(256), dy.data(), dx.data(), C, H, W, ll(dys[0]),
      ll(dys[1]), ll(dxs[0]), ll(dxs[1]), ll(dxs[2]), ll(dxs[3]), total, cl ? 1 : 0, mg.m0, mg.m1, mg.m2);
}

inline bool dilated(const Pool2dParams& p) { return p.dilation_h != 1 || p.dilation_w != 1; }

// The dilated path (pool2d_dilated.cuh): one thread per output (forward) or per dx element
// (backward), walking the tensor it writes in its memory order; 64-bit index math, so no size
// limit beyond the shape's. ys: the output shape, from pool2d_output_shape.
#define CUTRAIN_POOL2D_DILATED_GEOM(xs_, ys_, p_)                                                                 \
  ll(xs_[1]), ll(xs_[2]), ll(xs_[3]), ll(ys_[2]), ll(ys_[3]), p_.kernel_h, p_.kernel_w, p_.effective_stride_h(), \
      p_.effective_stride_w(), p_.pad_top, p_.pad_bottom, p_.pad_left, p_.pad_right, p_.dilation_h, p_.dilation_w, \
      p_.mode == PoolMode::average ? 1 : 0, p_.count_include_pad ? 1 : 0
template <class T, class Run>
void pool2d_dilated_forward_plan(const Tensor<T>& x, const Pool2dParams& p, const Shape& ys, Tensor<T>& y, Run&& run) {
  const Shape& xsh = x.shape();
  const auto &xs = x.strides(), &yst = y.strides();
  const long long total = y.numel();
  run("cutrain_pool2d_dilated_forward", dim3(grid_for(total)), dim3(256), x.data(), y.data(),
      CUTRAIN_POOL2D_DILATED_GEOM(xsh, ys, p), ll(xs[0]), ll(xs[1]), ll(xs[2]), ll(xs[3]), ll(yst[0]), ll(yst[1]),
      ll(yst[2]), ll(yst[3]), total, channels_last(y) ? 1 : 0);
}

template <class T, class Run>
void pool2d_dilated_backward_plan(const Tensor<T>& x, const Tensor<T>& dy, const Pool2dParams& p, Tensor<T>& dx,
                                  Run&& run) {
  const Shape &xsh = x.shape(), &ys = dy.shape();
  const auto &xs = x.strides(), &dys = dy.strides(), &dxs = dx.strides();
  const long long total = dx.numel();
  run("cutrain_pool2d_dilated_backward", dim3(grid_for(total)), dim3(256), x.data(), dy.data(), dx.data(),
      CUTRAIN_POOL2D_DILATED_GEOM(xsh, ys, p), ll(xs[0]), ll(xs[1]), ll(xs[2]), ll(xs[3]), ll(dys[0]), ll(dys[1]),
      ll(dys[2]), ll(dys[3]), ll(dxs[0]), ll(dxs[1]), ll(dxs[2]), ll(dxs[3]), total, channels_last(dx) ? 1 : 0);
}
template <class T, class Run>
void max_pool2d_indices_plan(const Tensor<T>& x, const Pool2dParams& p, const Shape& ys, Tensor<std::int32_t>& idx,
                             Run&& run) {
  const Shape& xsh = x.shape();
  const auto& xs = x.strides();
  const long long total = idx.numel();
  run("cutrain_pool2d_dilated_indices", dim3(grid_for(total)), dim3(256), x.data(), idx.data(),
      CUTRAIN_POOL2D_DILATED_GEOM(xsh, ys, p), ll(xs[0]), ll(xs[1]), ll(xs[2]), ll(xs[3]), total);
}
#undef CUTRAIN_POOL2D_DILATED_GEOM

// run() for the dilated plans.
template <GpuFloat T>
auto pool2d_dilated_launcher(int dev, std::string_view op) {
  return [dev, op](const char* kernel, dim3 grid, dim3 block, const auto&... args) {
    launch(function(dev, pool2d_dilated_program<T>(), kernel), grid, block, op, args...);
  };
}

// run() for the plans: launches the program's kernel on device dev.
template <GpuFloat T>
auto pool2d_launcher(int dev, std::string_view op) {
  return [dev, op](const char* kernel, dim3 grid, dim3 block, const auto&... args) {
    launch(function(dev, pool2d_program<T>(), kernel), grid, block, op, args...);
  };
}

template <class T>
void require_same_device(std::string_view op, const Tensor<T>& a, const Tensor<T>& b, std::string_view an,
                         std::string_view bn) {
  CUTRAIN_REQUIRE(a.device() == b.device(), DeviceError, op, an, " ", a.describe(), " and ", bn, " ", b.describe(),
                  " are on different devices");
}
}  // namespace detail

// y [N, C, OH, OW] (contiguous, NCHW or NHWC, allocated by the caller) from x [N, C, H, W] (any
// layout, may be strided).
template <GpuFloat T>
void pool2d_forward(const Tensor<T>& x, const Pool2dParams& p, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::pool2d_forward";
  detail::require_cuda_input(op, x, "x");
  const int dev = x.device().index;
  if (detail::dilated(p)) {
    const Shape ys = pool2d_output_shape(x.shape(), p, op);
    detail::require_output(op, y, ys, x.device(), "y");
    DeviceScope scope(dev);
    detail::pool2d_dilated_forward_plan(x, p, ys, y, detail::pool2d_dilated_launcher<T>(dev, op));
    return;
  }
  const detail::PoolDims d = detail::pool_dims(op, x.shape(), p);
  detail::require_output(op, y, Shape{d.N, d.C, d.OH, d.OW}, x.device(), "y");
  DeviceScope scope(dev);
  detail::pool2d_forward_plan(x, d, y, detail::pool2d_launcher<T>(dev, op));
}

// dx [N, C, H, W] (contiguous, NCHW or NHWC) for dy = dL/dy, y = pool2d_forward(x, p); x and dy in
// any layout. Every dx element is written (zero where no window routes anything to it).
template <GpuFloat T>
void pool2d_backward(const Tensor<T>& x, const Tensor<T>& dy, const Pool2dParams& p, Tensor<T>& dx) {
  constexpr std::string_view op = "cuda::kernels::pool2d_backward";
  detail::require_cuda_input(op, x, "x");
  detail::require_cuda_input(op, dy, "dy");
  detail::require_same_device(op, x, dy, "x", "dy");
  const Shape ys = pool2d_output_shape(x.shape(), p, op);
  CUTRAIN_REQUIRE(dy.shape() == ys, InvalidArgument, op, "dy must have the output shape ", ys, " of x ", x.describe(),
                  " with ", p, ", got ", dy.describe());
  detail::require_output(op, dx, x.shape(), x.device(), "dx");
  const int dev = x.device().index;
  if (detail::dilated(p)) {
    DeviceScope scope(dev);
    detail::pool2d_dilated_backward_plan(x, dy, p, dx, detail::pool2d_dilated_launcher<T>(dev, op));
    return;
  }
  const detail::PoolDims d = detail::pool_dims(op, x.shape(), p);
  DeviceScope scope(dev);
  auto scratch = [dev](std::size_t bytes) { return static_cast<int*>(workspace(dev, bytes)); };
  detail::pool2d_backward_plan(x, dy, d, dx, scratch, detail::pool2d_launcher<T>(dev, op));
}

// idx [N, C, OH, OW] (contiguous NCHW, int32) = the flat index h W + w, in its (n, c) plane of x,
// of each max-pool window's maximum (the first in row-then-column order, or the first NaN); x in
// any layout. One kernel for every geometry (the dilated path's).
template <GpuFloat T>
void max_pool2d_indices(const Tensor<T>& x, const Pool2dParams& p, Tensor<std::int32_t>& idx) {
  constexpr std::string_view op = "cuda::kernels::max_pool2d_indices";
  detail::require_cuda_input(op, x, "x");
  CUTRAIN_REQUIRE(p.mode == PoolMode::max, InvalidArgument, op, "indices are a max pool's, got ", p);
  const Shape ys = pool2d_output_shape(x.shape(), p, op);
  CUTRAIN_REQUIRE(idx.defined() && idx.shape() == ys && idx.is_contiguous() && idx.layout() != Layout::nhwc &&
                      idx.device() == x.device(),
                  InvalidArgument, op, "idx must be a contiguous NCHW ", ys, " on ", x.device(), ", got ",
                  idx.defined() ? idx.describe() : std::string("an undefined tensor"));
  const int dev = x.device().index;
  DeviceScope scope(dev);
  detail::max_pool2d_indices_plan(x, p, ys, idx, detail::pool2d_dilated_launcher<T>(dev, op));
}

// y [N, C, 1, 1] (contiguous) = the mean of each (n, c) plane of x [N, C, H, W] (any layout).
template <GpuFloat T>
void global_avg_pool_forward(const Tensor<T>& x, Tensor<T>& y) {
  constexpr std::string_view op = "cuda::kernels::global_avg_pool_forward";
  detail::require_cuda_input(op, x, "x");
  CUTRAIN_REQUIRE(x.rank() == 4 && x.numel() > 0, InvalidArgument, op, "x must be a non-empty [N,C,H,W], got ",
                  x.describe());
  detail::require_output(op, y, Shape{x.dim(0), x.dim(1), 1, 1}, x.device(), "y");
  const int dev = x.device().index;
  DeviceScope scope(dev);
  detail::global_avg_pool_forward_plan(x, y, detail::pool2d_launcher<T>(dev, op));
}

// dx [N, C, H, W] (contiguous, NCHW or NHWC: its layout is the caller's choice) = dy[n, c] / (H W),
// dy [N, C, 1, 1] in any layout.
template <GpuFloat T>
void global_avg_pool_backward(const Tensor<T>& dy, Tensor<T>& dx) {
  constexpr std::string_view op = "cuda::kernels::global_avg_pool_backward";
  detail::require_cuda_input(op, dy, "dy");
  CUTRAIN_REQUIRE(dx.defined() && dx.rank() == 4 && dx.numel() > 0, InvalidArgument, op,
                  "dx must be a non-empty [N,C,H,W], got ", dx.defined() ? dx.describe() : std::string("an undefined tensor"));
  const Shape ys{dx.dim(0), dx.dim(1), 1, 1};
  CUTRAIN_REQUIRE(dy.shape() == ys, InvalidArgument, op, "dy must be ", ys, " for dx ", dx.describe(), ", got ",
                  dy.describe());
  detail::require_output(op, dx, dx.shape(), dy.device(), "dx");
  const int dev = dy.device().index;
  DeviceScope scope(dev);
  detail::global_avg_pool_backward_plan(dy, dx, detail::pool2d_launcher<T>(dev, op));
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
