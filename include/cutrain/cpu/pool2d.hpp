// 2-d max and average pooling, and global average pooling, on the CPU: forward and backward.
// Inputs are staged to contiguous nchw (but an NHWC max pool's whose windows lie inside x, which
// runs in NHWC); outputs and dx come back in x's layout.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cutrain/core/params/pool2d.hpp"
#include "cutrain/cpu/common.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
struct PoolGeometry {
  std::int64_t planes, h, w, oh, ow, kh, kw, sh, sw, pt, pb, pl, pr, dh, dw;
};

inline PoolGeometry pool_geometry(const Shape& x, const Pool2dParams& p) {
  const Shape y = pool2d_output_shape(x, p);
  return {x[0] * x[1], x[2], x[3], y[2], y[3], p.kernel_h, p.kernel_w, p.effective_stride_h(),
          p.effective_stride_w(), p.pad_top, p.pad_bottom, p.pad_left, p.pad_right, p.dilation_h, p.dilation_w};
}

// The taps of output (i, j)'s window that lie inside the input: rows h0, h0 + dh, ... (nh of
// them), columns w0, w0 + dw, ... (nw); `divisor` is what an average divides by.
struct PoolWindow {
  std::int64_t h0, nh, dh, w0, nw, dw, divisor;
  std::int64_t row(std::int64_t a) const { return h0 + a * dh; }
  std::int64_t col(std::int64_t b) const { return w0 + b * dw; }
};

// Of the kernel taps start, start + d, ...: the first inside [0, in) and how many are inside
// [0, in) (taps), and how many are inside [.., in + pad_hi) (padded: those count_include_pad counts).
struct PoolTaps {
  std::int64_t first, taps, padded;
};

inline PoolTaps pool_taps(std::int64_t start, std::int64_t kernel, std::int64_t d, std::int64_t in,
                          std::int64_t pad_hi) {
  const std::int64_t t0 = start >= 0 ? 0 : (-start + d - 1) / d;
  // taps t with start + t d < limit: t < ceil((limit - start) / d)
  auto below = [&](std::int64_t limit) { return std::min(kernel, std::max<std::int64_t>(0, (limit - start + d - 1) / d)); };
  const std::int64_t t1 = below(in);
  return {start + t0 * d, std::max<std::int64_t>(0, t1 - t0), below(in + pad_hi)};
}

inline PoolWindow pool_window(const PoolGeometry& g, const Pool2dParams& p, std::int64_t i, std::int64_t j) {
  const PoolTaps r = pool_taps(i * g.sh - g.pt, g.kh, g.dh, g.h, g.pb);
  const PoolTaps c = pool_taps(j * g.sw - g.pl, g.kw, g.dw, g.w, g.pr);
  // count_include_pad counts the padding but not the ceil-mode overhang past it, as PyTorch.
  return {r.first, r.taps, g.dh, c.first, c.taps, g.dw,
          p.count_include_pad ? r.padded * c.padded : r.taps * c.taps};
}

// Offset (within a plane) of the window's maximum: the first one in row-then-column order, or the
// first NaN. Padding acts as -inf, and every valid window holds at least one input element
// (pool2d_output_shape refuses the others).
template <class T>
std::int64_t pool_argmax(const T* plane, std::int64_t w, const PoolWindow& win) {
  std::int64_t best = win.h0 * w + win.w0;
  if (std::isnan(plane[best])) return best;
  for (std::int64_t a = 0; a < win.nh; ++a)
    for (std::int64_t b = 0; b < win.nw; ++b) {
      const std::int64_t o = win.row(a) * w + win.col(b);
      const T v = plane[o];
      if (std::isnan(v)) return o;
      if (v > plane[best]) best = o;
    }
  return best;
}
}  // namespace detail

namespace detail {
// Max pooling of a contiguous NHWC x whose every window lies inside it, into y [N, C, oh, ow]
// NHWC: for each output pixel, the max over the window's taps of C contiguous values, a loop the
// compiler vectorizes. A NaN anywhere in a window gives NaN (the NCHW path's rule).
template <class T>
void max_pool_nhwc_inside(const T* x, T* y, const PoolGeometry& g, std::int64_t N, std::int64_t C) {
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t i = 0; i < g.oh; ++i)
      for (std::int64_t j = 0; j < g.ow; ++j) {
        T* __restrict out = y + ((n * g.oh + i) * g.ow + j) * C;
        const T* at = x + ((n * g.h + i * g.sh) * g.w + j * g.sw) * C;
        for (std::int64_t c = 0; c < C; ++c) out[c] = at[c];
        for (std::int64_t a = 0; a < g.kh; ++a)
          for (std::int64_t b = 0; b < g.kw; ++b) {
            const T* __restrict in = at + (a * g.dh * g.w + b * g.dw) * C;
            for (std::int64_t c = 0; c < C; ++c) {
              const T v = in[c], m = out[c];
              out[c] = v > m || v != v ? v : m;
            }
          }
      }
}
}  // namespace detail

template <CpuFloat T>
Tensor<T> pool2d_forward(const Tensor<T>& x, const Pool2dParams& p) {
  const auto g = detail::pool_geometry(x.shape(), p);
  // Max pooling whose every window lies inside the input (no padding, no ceil-mode overhang: the
  // common 2x2 / 3x3 pools): the taps straight from the geometry, the NaN rule kept.
  const bool inside = g.pt == 0 && g.pl == 0 && (g.oh - 1) * g.sh + (g.kh - 1) * g.dh < g.h &&
                      (g.ow - 1) * g.sw + (g.kw - 1) * g.dw < g.w;
  if (p.mode == PoolMode::max && inside && x.layout() == Layout::nhwc) {  // no NCHW staging either way
    Tensor<T> y(Shape{x.dim(0), x.dim(1), g.oh, g.ow}, {.layout = Layout::nhwc});
    detail::max_pool_nhwc_inside(x.data(), y.data(), g, x.dim(0), x.dim(1));
    return y;
  }
  const Tensor<T> xc = row_major(x);
  Tensor<T> y(Shape{x.dim(0), x.dim(1), g.oh, g.ow});
  const T* xs = xc.data();
  T* ys = y.data();
  if (p.mode == PoolMode::max && inside) {
    // kh, kw, dh, dw as compile-time constants for 2x2 windows (the unrolled loop is 3-4x faster).
    const auto run = [&](auto kh, auto kw, auto dh, auto dw) {
      for (std::int64_t pl = 0; pl < g.planes; ++pl) {
        const T* plane = xs + pl * g.h * g.w;
        T* out = ys + pl * g.oh * g.ow;
        for (std::int64_t i = 0; i < g.oh; ++i)
          for (std::int64_t j = 0; j < g.ow; ++j) {
            const T* at = plane + i * g.sh * g.w + j * g.sw;
            T m = at[0];
            bool nan = false;
            for (std::int64_t a = 0; a < kh; ++a)
              for (std::int64_t b = 0; b < kw; ++b) {
                const T v = at[a * dh * g.w + b * dw];
                nan |= std::isnan(v);
                m = v > m ? v : m;
              }
            out[i * g.ow + j] = nan ? plane[detail::pool_argmax(plane, g.w, detail::pool_window(g, p, i, j))] : m;
          }
      }
    };
    using two = std::integral_constant<std::int64_t, 2>;
    using one = std::integral_constant<std::int64_t, 1>;
    if (g.kh == 2 && g.kw == 2 && g.dh == 1 && g.dw == 1)
      run(two{}, two{}, one{}, one{});
    else
      run(g.kh, g.kw, g.dh, g.dw);
    return in_layout_of(std::move(y), x);
  }
  for (std::int64_t pl = 0; pl < g.planes; ++pl) {
    const T* plane = xs + pl * g.h * g.w;
    T* out = ys + pl * g.oh * g.ow;
    for (std::int64_t i = 0; i < g.oh; ++i)
      for (std::int64_t j = 0; j < g.ow; ++j) {
        const auto win = detail::pool_window(g, p, i, j);
        if (p.mode == PoolMode::max) {
          out[i * g.ow + j] = plane[detail::pool_argmax(plane, g.w, win)];
        } else {
          T sum = 0;
          for (std::int64_t a = 0; a < win.nh; ++a)
            for (std::int64_t b = 0; b < win.nw; ++b) sum += plane[win.row(a) * g.w + win.col(b)];
          out[i * g.ow + j] = sum / static_cast<T>(win.divisor);
        }
      }
  }
  return in_layout_of(std::move(y), x);
}

// dx: max routes each dy to its window's argmax (recomputed from x; y is not needed on the CPU but
// is part of the API because cuDNN's backward takes it); average spreads dy / divisor over the
// window's input elements.
template <CpuFloat T>
Tensor<T> pool2d_backward(const Tensor<T>& x, const Tensor<T>& /*y*/, const Tensor<T>& dy, const Pool2dParams& p) {
  const auto g = detail::pool_geometry(x.shape(), p);
  const Tensor<T> xc = row_major(x);
  const Tensor<T> dyc = row_major(dy);
  Tensor<T> dx = Tensor<T>::zeros(x.shape());  // accumulated into: overlapping windows share inputs
  const T* xs = xc.data();
  const T* dys = dyc.data();
  T* dxs = dx.data();
  for (std::int64_t pl = 0; pl < g.planes; ++pl) {
    const T* plane = xs + pl * g.h * g.w;
    const T* dout = dys + pl * g.oh * g.ow;
    T* dplane = dxs + pl * g.h * g.w;
    for (std::int64_t i = 0; i < g.oh; ++i)
      for (std::int64_t j = 0; j < g.ow; ++j) {
        const auto win = detail::pool_window(g, p, i, j);
        const T d = dout[i * g.ow + j];
        if (p.mode == PoolMode::max) {
          dplane[detail::pool_argmax(plane, g.w, win)] += d;
        } else {
          const T share = d / static_cast<T>(win.divisor);
          for (std::int64_t a = 0; a < win.nh; ++a)
            for (std::int64_t b = 0; b < win.nw; ++b) dplane[win.row(a) * g.w + win.col(b)] += share;
        }
      }
  }
  return in_layout_of(std::move(dx), x);
}

// The flat index h W + w, in its (n, c) plane, of each max-pool window's maximum (pool_argmax's
// rule: the first in row-then-column order, or the first NaN): int32 [N, C, OH, OW], NCHW.
template <CpuFloat T>
Tensor<std::int32_t> max_pool2d_indices(const Tensor<T>& x, const Pool2dParams& p) {
  const auto g = detail::pool_geometry(x.shape(), p);
  const Tensor<T> xc = row_major(x);
  Tensor<std::int32_t> idx(Shape{x.dim(0), x.dim(1), g.oh, g.ow});
  std::int32_t* out = idx.data();
  for (std::int64_t pl = 0; pl < g.planes; ++pl) {
    const T* plane = xc.data() + pl * g.h * g.w;
    for (std::int64_t i = 0; i < g.oh; ++i)
      for (std::int64_t j = 0; j < g.ow; ++j)
        *out++ = static_cast<std::int32_t>(detail::pool_argmax(plane, g.w, detail::pool_window(g, p, i, j)));
  }
  return idx;
}

// y[n, c, 0, 0] = mean over h, w of x[n, c, h, w].
template <CpuFloat T>
Tensor<T> global_avg_pool_forward(const Tensor<T>& x) {
  const std::int64_t planes = x.dim(0) * x.dim(1), hw = x.dim(2) * x.dim(3);
  const Tensor<T> xc = row_major(x);
  Tensor<T> y(Shape{x.dim(0), x.dim(1), 1, 1});
  ConstMapRM<T> xm(xc.data(), planes, hw);
  MapRM<T> ym(y.data(), planes, 1);
  ym = xm.rowwise().sum() / static_cast<T>(hw);
  return in_layout_of(std::move(y), x);
}

// dx[n, c, h, w] = dy[n, c] / (H * W), in dx_layout (nchw or nhwc).
template <CpuFloat T>
Tensor<T> global_avg_pool_backward(const Tensor<T>& dy, const Shape& x_shape, Layout dx_layout = Layout::nchw) {
  const std::int64_t planes = x_shape[0] * x_shape[1], hw = x_shape[2] * x_shape[3];
  const Tensor<T> dyc = row_major(dy);
  Tensor<T> dx(x_shape);
  ConstMapRM<T> dym(dyc.data(), planes, 1);
  MapRM<T> dxm(dx.data(), planes, hw);
  dxm = (dym / static_cast<T>(hw)).replicate(1, hw);
  if (dx_layout == Layout::nhwc) return dx.contiguous(Layout::nhwc);
  return dx;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
