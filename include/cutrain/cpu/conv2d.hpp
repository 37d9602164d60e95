// 2-d convolution on the CPU: im2col + one Eigen GEMM per (sample, group), forward and backward.
// Everything is computed on contiguous nchw staging copies; results go back to the caller's layout.
// In a program built against cutrain::onednn the f32 forward is oneDNN's (cpu/onednn.hpp).
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "cutrain/core/params/conv2d.hpp"
#include "cutrain/cpu/activation.hpp"
#include "cutrain/cpu/common.hpp"
#include "cutrain/cpu/onednn.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {

struct ConvGeometry {
  std::int64_t N, C, H, W, K, R, S, Ho, Wo, groups, Cg, Kg;
  Conv2dParams p;

  ConvGeometry(const Shape& x, const Shape& w, const Conv2dParams& params, std::string_view op)
      : p(params) {
    const Shape y = conv2d_output_shape(x, w, params, op);
    N = x[0], C = x[1], H = x[2], W = x[3];
    K = w[0], R = w[2], S = w[3];
    Ho = y[2], Wo = y[3];
    groups = params.groups, Cg = C / groups, Kg = K / groups;
  }
  std::int64_t hw() const { return H * W; }
  std::int64_t out_hw() const { return Ho * Wo; }
  std::int64_t crs() const { return Cg * R * S; }  // rows of a column matrix, columns of a weight group
  // A 1x1 kernel with unit stride and no padding reads x as it is: no column matrix needed.
  bool is_pointwise() const {
    return R == 1 && S == 1 && p.stride_h == 1 && p.stride_w == 1 && p.pad_top == 0 && p.pad_bottom == 0 &&
           p.pad_left == 0 && p.pad_right == 0;
  }
};

// One sample's column matrix [Cg*R*S, Ho*Wo]. Up to 8M elements it lives in a buffer per thread
// that grows to the largest conv the thread has run and is reused, so that a conv allocates,
// zero-fills and page-faults no scratch memory per call (im2col writes every entry, zeros
// included); a larger one is allocated for the call alone.
template <class T>
class ColScratch {
 public:
  explicit ColScratch(std::int64_t elements) {
    const auto n = static_cast<std::size_t>(elements);
    thread_local std::vector<T> kept;
    if (n <= (std::size_t{8} << 20)) {
      if (kept.size() < n) kept.resize(n);
      ptr_ = kept.data();
    } else {
      own_ = std::make_unique_for_overwrite<T[]>(n);
      ptr_ = own_.get();
    }
  }
  T* get() const { return ptr_; }

 private:
  std::unique_ptr<T[]> own_;
  T* ptr_ = nullptr;
};

// Output columns [lo, hi) whose input column ow * stride + first lies inside [0, size).
inline void valid_range(std::int64_t first, std::int64_t stride, std::int64_t size, std::int64_t out,
                        std::int64_t& lo, std::int64_t& hi) {
  lo = first >= 0 ? 0 : (-first + stride - 1) / stride;
  hi = first > size - 1 ? 0 : std::min(out, (size - 1 - first) / stride + 1);
  lo = std::min(lo, out);
  if (hi < lo) hi = lo;
}

// Calls fn(col_row, image_row_index or -1, ow_lo, ow_hi, iw_first) for every row of one image
// row per (channel, kernel tap, output row). im2col and col2im share this walk so that they are
// exact transposes of each other.
template <class Fn>
void for_each_col_row(const ConvGeometry& g, Fn&& fn) {
  const auto& p = g.p;
  for (std::int64_t c = 0; c < g.Cg; ++c)
    for (std::int64_t r = 0; r < g.R; ++r)
      for (std::int64_t s = 0; s < g.S; ++s) {
        const std::int64_t row = (c * g.R + r) * g.S + s;
        const std::int64_t ih0 = r * p.dilation_h - p.pad_top;
        const std::int64_t iw0 = s * p.dilation_w - p.pad_left;
        std::int64_t lo, hi;
        valid_range(iw0, p.stride_w, g.W, g.Wo, lo, hi);
        for (std::int64_t oh = 0; oh < g.Ho; ++oh) {
          const std::int64_t ih = oh * p.stride_h + ih0;
          const std::int64_t in_row = (ih < 0 || ih >= g.H) ? -1 : c * g.H + ih;
          fn(row * g.out_hw() + oh * g.Wo, in_row, lo, hi, iw0);
        }
      }
}

// col [Cg*R*S, Ho*Wo] from one sample's group of channels x [Cg, H, W].
template <class T>
void im2col(const T* x, T* col, const ConvGeometry& g) {
  const std::int64_t sw = g.p.stride_w, W = g.W, Wo = g.Wo;
  for_each_col_row(g, [&](std::int64_t out, std::int64_t in_row, std::int64_t lo, std::int64_t hi, std::int64_t iw0) {
    T* dst = col + out;
    if (in_row < 0) {
      std::fill(dst, dst + Wo, T(0));
      return;
    }
    const T* src = x + in_row * W;
    std::fill(dst, dst + lo, T(0));
    if (sw == 1) {
      if (hi > lo) std::copy(src + lo + iw0, src + hi + iw0, dst + lo);
    } else {
      for (std::int64_t ow = lo; ow < hi; ++ow) dst[ow] = src[ow * sw + iw0];
    }
    std::fill(dst + hi, dst + Wo, T(0));
  });
}

// The transpose of im2col: x [Cg, H, W] += every column entry at the input element it came from.
template <class T>
void col2im(const T* col, T* x, const ConvGeometry& g) {
  const std::int64_t sw = g.p.stride_w, W = g.W;
  for_each_col_row(g, [&](std::int64_t out, std::int64_t in_row, std::int64_t lo, std::int64_t hi, std::int64_t iw0) {
    if (in_row < 0) return;
    const T* src = col + out;
    T* dst = x + in_row * W;
    for (std::int64_t ow = lo; ow < hi; ++ow) dst[ow * sw + iw0] += src[ow];
  });
}

// dst = src for 4-d arrays given by element strides: a plain loop over raw pointers. The core's
// generic Tensor::copy_from walks an index vector per element, which costs more than the GEMMs
// here for nhwc batches.
template <class T>
void copy_4d(const T* src, const Strides& ss, T* dst, const Strides& ds, const Shape& s) {
  for (std::int64_t n = 0; n < s[0]; ++n)
    for (std::int64_t c = 0; c < s[1]; ++c)
      for (std::int64_t h = 0; h < s[2]; ++h) {
        const T* in = src + n * ss[0] + c * ss[1] + h * ss[2];
        T* out = dst + n * ds[0] + c * ds[1] + h * ds[2];
        for (std::int64_t w = 0; w < s[3]; ++w) out[w * ds[3]] = in[w * ss[3]];
      }
}

// A 4-d tensor as a contiguous nchw array: a view when it already is one, else a copy.
template <class T>
Tensor<T> to_nchw(const Tensor<T>& t) {
  if (t.layout() == Layout::nchw) return t.view();
  Tensor<T> out(t.shape());
  copy_4d(t.data(), t.strides(), out.data(), out.strides(), t.shape());
  return out;
}

// A 4-d nchw result in the layout the op's outputs take from `like` (see cpu::output_layout).
template <class T>
Tensor<T> to_layout_of(Tensor<T> result, const Tensor<T>& like) {
  if (output_layout(like) != Layout::nhwc) return result;
  Tensor<T> out(result.shape(), {.layout = Layout::nhwc});
  copy_4d(result.data(), result.strides(), out.data(), out.strides(), result.shape());
  return out;
}

// y[k, i] = act(y[k, i] + bias[k] + r[k, i]) over a block of `rows` output channels of n
// elements (bias and r may be null): the conv's epilogue, run on each GEMM's output while it is
// in cache. ReLU and identity get loops of their own, which the compiler vectorizes.
template <class T>
void conv_epilogue(T* y, const T* bias, const T* r, std::int64_t rows, std::int64_t n, const ActivationParams& act) {
  const auto run = [&](auto f) {
    for (std::int64_t k = 0; k < rows; ++k) {
      T* yk = y + k * n;
      const T b = bias ? bias[k] : T(0);
      const T* rk = r ? r + k * n : nullptr;
      if (rk)
        for (std::int64_t i = 0; i < n; ++i) yk[i] = f(yk[i] + b + rk[i]);
      else
        for (std::int64_t i = 0; i < n; ++i) yk[i] = f(yk[i] + b);
    }
  };
  if (act.kind == Activation::identity)
    run([](T v) { return v; });
  else if (act.kind == Activation::relu)
    run([](T v) { return v > T(0) ? v : T(0); });
  else
    run([&](T v) { return act_forward(v, act); });
}

template <class T>
Tensor<T> conv2d_forward_impl(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, const Tensor<T>& residual,
                              const ActivationParams& act, const Conv2dParams& p, std::string_view op) {
  const ConvGeometry g(x.shape(), w.shape(), p, op);
  const Shape y_shape{g.N, g.K, g.Ho, g.Wo};
  CUTRAIN_REQUIRE(!residual.defined() || residual.shape() == y_shape, InvalidArgument, op, "the residual must have the output's shape ",
                  y_shape, ", got ", residual.describe());
  CUTRAIN_REQUIRE(!bias.defined() || bias.numel() == g.K, InvalidArgument, op, "the bias must have ", g.K, " elements, got ",
                  bias.describe());
#ifdef CUTRAIN_ONEDNN
  if constexpr (std::same_as<T, float>) {  // f32 through oneDNN's direct kernels where it has them
    const Tensor<T> xo = x.layout() == Layout::nhwc ? x.view() : detail::to_nchw(x);
    const onednn::Conv2d conv(w, bias, p, act);
    auto y = Tensor<T>::empty(y_shape, {.layout = output_layout(x)});
    if (conv.forward(xo, residual, y)) {
      if (!conv.fuses_activation()) detail::conv_epilogue<T>(y.data(), nullptr, nullptr, 1, y.numel(), act);
      return y;
    }
  }
#endif
  const Tensor<T> xs = detail::to_nchw(x), ws = detail::to_nchw(w);
  const Tensor<T> rs = residual.defined() ? detail::to_nchw(residual) : Tensor<T>{};
  Tensor<T> y(y_shape);
  Tensor<T> bs = bias.defined() ? row_major(bias) : Tensor<T>{};
  const bool pointwise = g.is_pointwise();
  const detail::ColScratch<T> scratch(pointwise ? 0 : g.crs() * g.out_hw());
  T* col = pointwise ? nullptr : scratch.get();
  for (std::int64_t n = 0; n < g.N; ++n)
    for (std::int64_t gi = 0; gi < g.groups; ++gi) {
      const T* xg = xs.data() + (n * g.C + gi * g.Cg) * g.hw();
      if (!pointwise) detail::im2col(xg, col, g);
      ConstMapRM<T> cm(pointwise ? xg : col, g.crs(), g.out_hw());
      ConstMapRM<T> wg(ws.data() + gi * g.Kg * g.crs(), g.Kg, g.crs());
      const std::int64_t at = (n * g.K + gi * g.Kg) * g.out_hw();
      MapRM<T> yg(y.data() + at, g.Kg, g.out_hw());
      yg.noalias() = wg * cm;
      if (bs.defined() || rs.defined() || act.kind != Activation::identity)
        detail::conv_epilogue(y.data() + at, bs.defined() ? bs.data() + gi * g.Kg : nullptr,
                              rs.defined() ? rs.data() + at : nullptr, g.Kg, g.out_hw(), act);
    }
  return detail::to_layout_of(std::move(y), x);
}
}  // namespace detail

// y = act(conv(x, w) + bias + residual): y[n, k] = bias[k] + sum_{c, r, s} w[k, c, r, s] *
// x[n, g*Cg + c, oh*sh - pt + r*dh, ow*sw - pl + s*dw] (zero outside x), for k in group g, then
// the residual (y's shape) added and the activation applied, in one pass over each sample's
// output right after its GEMM. bias and residual may be undefined. y takes x's layout.
template <CpuFloat T>
Tensor<T> conv2d_fused_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, const Tensor<T>& residual,
                               const ActivationParams& act, const Conv2dParams& p) {
  return detail::conv2d_forward_impl(x, w, bias, residual, act, p, "conv2d_fused_forward");
}

// y = conv(x, w) + bias: conv2d_fused_forward with no residual and no activation. bias may be
// undefined. y takes x's layout.
template <CpuFloat T>
Tensor<T> conv2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, const Conv2dParams& p) {
  return detail::conv2d_forward_impl(x, w, bias, Tensor<T>{}, ActivationParams{.kind = Activation::identity}, p,
                                     "conv2d_forward");
}

template <CpuFloat T>
Tensor<T> conv2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Conv2dParams& p) {
  return conv2d_forward(x, w, Tensor<T>{}, p);
}

// dx = the transpose of the forward map applied to dy: per (sample, group) a GEMM w_g^T dy_g
// gives the column matrix, col2im scatters it back. dx takes dy's layout.
template <CpuFloat T>
Tensor<T> conv2d_backward_data(const Tensor<T>& dy, const Tensor<T>& w, const Shape& x_shape, const Conv2dParams& p) {
  const detail::ConvGeometry g(x_shape, w.shape(), p, "conv2d_backward_data");
  const Tensor<T> dys = detail::to_nchw(dy), ws = detail::to_nchw(w);
  Tensor<T> dx(x_shape);  // zero-filled: col2im accumulates into it
  const bool pointwise = g.is_pointwise();
  const detail::ColScratch<T> scratch(pointwise ? 0 : g.crs() * g.out_hw());
  T* col = pointwise ? nullptr : scratch.get();
  for (std::int64_t n = 0; n < g.N; ++n)
    for (std::int64_t gi = 0; gi < g.groups; ++gi) {
      T* dxg = dx.data() + (n * g.C + gi * g.Cg) * g.hw();
      ConstMapRM<T> wg(ws.data() + gi * g.Kg * g.crs(), g.Kg, g.crs());
      ConstMapRM<T> dyg(dys.data() + (n * g.K + gi * g.Kg) * g.out_hw(), g.Kg, g.out_hw());
      MapRM<T> cm(pointwise ? dxg : col, g.crs(), g.out_hw());
      cm.noalias() = wg.transpose() * dyg;
      if (!pointwise) detail::col2im(col, dxg, g);
    }
  return detail::to_layout_of(std::move(dx), dy);
}

// dw[k, c, r, s] = sum over samples and outputs of dy * the x element that w[k, c, r, s] met:
// per (sample, group) dw_g += dy_g col^T. dw takes x's layout (nhwc x gives a KRSC filter).
template <CpuFloat T>
Tensor<T> conv2d_backward_filter(const Tensor<T>& dy, const Tensor<T>& x, const Shape& w_shape,
                                 const Conv2dParams& p) {
  const detail::ConvGeometry g(x.shape(), w_shape, p, "conv2d_backward_filter");
  const Tensor<T> dys = detail::to_nchw(dy), xs = detail::to_nchw(x);
  Tensor<T> dw(w_shape);  // zero-filled: samples accumulate into it
  const bool pointwise = g.is_pointwise();
  const detail::ColScratch<T> scratch(pointwise ? 0 : g.crs() * g.out_hw());
  T* col = pointwise ? nullptr : scratch.get();
  for (std::int64_t n = 0; n < g.N; ++n)
    for (std::int64_t gi = 0; gi < g.groups; ++gi) {
      const T* xg = xs.data() + (n * g.C + gi * g.Cg) * g.hw();
      if (!pointwise) detail::im2col(xg, col, g);
      ConstMapRM<T> cm(pointwise ? xg : col, g.crs(), g.out_hw());
      ConstMapRM<T> dyg(dys.data() + (n * g.K + gi * g.Kg) * g.out_hw(), g.Kg, g.out_hw());
      MapRM<T> dwg(dw.data() + gi * g.Kg * g.crs(), g.Kg, g.crs());
      dwg.noalias() += dyg * cm.transpose();
    }
  return detail::to_layout_of(std::move(dw), x);
}

// db[k] = sum over n, h, w of dy[n, k, h, w]; row-major [K].
template <CpuFloat T>
Tensor<T> conv2d_backward_bias(const Tensor<T>& dy) {
  const Tensor<T> dys = detail::to_nchw(dy);
  const std::int64_t N = dy.dim(0), K = dy.dim(1), hw = dy.dim(2) * dy.dim(3);
  Tensor<T> db({K});
  T* out = db.data();
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t k = 0; k < K; ++k) {
      out[k] += Eigen::Map<const Eigen::Vector<T, Eigen::Dynamic>>(dys.data() + (n * K + k) * hw, hw).sum();
    }
  return db;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
