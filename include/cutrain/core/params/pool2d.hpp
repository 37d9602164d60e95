// 2-d pooling parameters and output shape, shared by the CPU and CUDA backends.
// Semantics follow PyTorch's max_pool2d / avg_pool2d, with padding allowed to differ per side and
// to reach kernel - 1 (PyTorch: kernel / 2), and dilation for both modes (PyTorch: max only).
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string_view>

#include "cutrain/core/error.hpp"
#include "cutrain/core/shape.hpp"

namespace cutrain::inline CUTRAIN_ABI {

enum class PoolMode { max, average };

inline std::string_view to_string(PoolMode m) {
  switch (m) {
    case PoolMode::max: return "max";
    case PoolMode::average: return "average";
  }
  return "?";
}
inline std::ostream& operator<<(std::ostream& os, PoolMode m) { return os << to_string(m); }

struct Pool2dParams {
  PoolMode mode = PoolMode::max;
  int kernel_h = 2, kernel_w = 2;
  int stride_h = 0, stride_w = 0;  // 0 means "equal to the kernel", as PyTorch's stride=None
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  bool count_include_pad = true;  // average only: divide by the window size inside the padded input
  bool ceil_mode = false;
  // Window taps dilation apart: a window covers dilation (kernel - 1) + 1 input rows/columns. At
  // the end so that older designated initializers still compile.
  int dilation_h = 1, dilation_w = 1;

  static Pool2dParams max(int kernel, int stride = 0, int pad = 0, int dilation = 1) {
    return {.mode = PoolMode::max, .kernel_h = kernel, .kernel_w = kernel, .stride_h = stride, .stride_w = stride,
            .pad_top = pad, .pad_bottom = pad, .pad_left = pad, .pad_right = pad, .dilation_h = dilation,
            .dilation_w = dilation};
  }
  static Pool2dParams average(int kernel, int stride = 0, int pad = 0, bool count_include_pad = true) {
    return {.mode = PoolMode::average, .kernel_h = kernel, .kernel_w = kernel, .stride_h = stride,
            .stride_w = stride, .pad_top = pad, .pad_bottom = pad, .pad_left = pad, .pad_right = pad,
            .count_include_pad = count_include_pad};
  }

  int effective_stride_h() const { return stride_h > 0 ? stride_h : kernel_h; }
  int effective_stride_w() const { return stride_w > 0 ? stride_w : kernel_w; }
  // The extent a window spans in the padded input.
  std::int64_t span_h() const { return std::int64_t{dilation_h} * (kernel_h - 1) + 1; }
  std::int64_t span_w() const { return std::int64_t{dilation_w} * (kernel_w - 1) + 1; }
};

inline std::ostream& operator<<(std::ostream& os, const Pool2dParams& p) {
  os << "pool2d{" << p.mode << " kernel " << p.kernel_h << "x" << p.kernel_w << " stride " << p.stride_h << "x"
     << p.stride_w << " pad t" << p.pad_top << " b" << p.pad_bottom << " l" << p.pad_left << " r" << p.pad_right;
  if (p.mode == PoolMode::average) os << (p.count_include_pad ? " count_include_pad" : " exclude_pad");
  if (p.ceil_mode) os << " ceil_mode";
  if (p.dilation_h != 1 || p.dilation_w != 1) os << " dilation " << p.dilation_h << "x" << p.dilation_w;
  return os << "}";
}

namespace detail {
// One spatial dimension of the output, as PyTorch's pooling_output_shape: floor or ceil of
// (in + pads - kernel) / stride + 1, where in ceil mode a last window that would start past
// the input and the leading padding is dropped. Returns 0 when the kernel does not fit.
inline std::int64_t pool_out_size(std::int64_t in, std::int64_t kernel, std::int64_t stride, std::int64_t pad_lo,
                                  std::int64_t pad_hi, bool ceil_mode) {
  // In 128 bits: an input near 2^63 (an expanded view) must reach the caller's size check, not
  // wrap. A result past int64 comes back as INT64_MAX, which no shape check lets through.
  using wide = __int128;
  const wide span = wide{in} + pad_lo + pad_hi - kernel;
  if (span < 0) return 0;
  wide out = (span + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  if (ceil_mode && (out - 1) * stride >= wide{in} + pad_lo) --out;
  return out > std::numeric_limits<std::int64_t>::max() ? std::numeric_limits<std::int64_t>::max()
                                                        : static_cast<std::int64_t>(out);
}

// The first output index in [0, out) whose window taps (start = i stride - pad_lo, then every
// dilation, kernel of them) all miss [0, in); -1 when there is none. At dilation 1 there never is
// one (padding < kernel), so it is not looked for.
inline std::int64_t pool_empty_window(std::int64_t in, std::int64_t out, std::int64_t kernel, std::int64_t dilation,
                                      std::int64_t stride, std::int64_t pad_lo) {
  if (dilation == 1) return -1;
  if (in >= dilation) {
    // Taps dilation <= in apart cannot step over [0, in): a window is empty only when all its
    // taps lie before row 0 (then window 0's do too) or its first tap is at row in or later
    // (the windows from ceil((in + pad_lo) / stride) on). No walk over the rows: an expanded
    // input may have 2^36 of them.
    if (-pad_lo + (kernel - 1) * dilation < 0) return 0;
    using wide = __int128;
    const wide first_past = (wide{in} + pad_lo + stride - 1) / stride;
    return first_past < out ? static_cast<std::int64_t>(first_past) : -1;
  }
  for (std::int64_t i = 0; i < out; ++i) {  // in < dilation: a few rows, so a few windows
    const std::int64_t start = i * stride - pad_lo;
    const std::int64_t t0 = start >= 0 ? 0 : (-start + dilation - 1) / dilation;  // first tap at row >= 0
    if (t0 >= kernel || start + t0 * dilation >= in) return i;
  }
  return -1;
}
}  // namespace detail

// p with padding 'same' for input x [N, C, H, W] (TensorFlow's SAME, ONNX's auto_pad): the output
// is ceil(in / stride) per spatial dimension, the padding total = max((out - 1) * stride +
// dilation * (kernel - 1) + 1 - in, 0), split as conv2d_same_padding splits it. p's padding must
// be zero (it is replaced); its stride 0 means the kernel size, as elsewhere. Padded taps never
// win a max; an average divides by the taps inside x when count_include_pad is false (TF's rule).
inline Pool2dParams pool2d_same_padding(const Shape& x, Pool2dParams p, SamePadding mode = SamePadding::upper,
                                        std::string_view op = "pool2d_same_padding") {
  CUTRAIN_REQUIRE(x.rank() == 4 && x[2] > 0 && x[3] > 0, InvalidArgument, op, "input must be 4-d [N,C,H,W], got shape ", x);
  CUTRAIN_REQUIRE(p.kernel_h >= 1 && p.kernel_w >= 1 && p.stride_h >= 0 && p.stride_w >= 0 && p.dilation_h >= 1 &&
                      p.dilation_w >= 1,
                  InvalidArgument, op, "need a kernel of at least 1x1, stride >= 0 and dilation >= 1, got ", p);
  CUTRAIN_REQUIRE(p.pad_top == 0 && p.pad_bottom == 0 && p.pad_left == 0 && p.pad_right == 0, InvalidArgument, op,
                  "padding 'same' replaces the padding, which must be zero here, got ", p);
  const auto split = [&](std::int64_t in, int kernel, int stride, int dilation, int& before, int& after) {
    const std::int64_t s = stride > 0 ? stride : kernel;
    const std::int64_t out = (in + s - 1) / s;
    const std::int64_t total = std::max<std::int64_t>((out - 1) * s + std::int64_t{dilation} * (kernel - 1) + 1 - in, 0);
    CUTRAIN_REQUIRE(total <= std::numeric_limits<int>::max(), InvalidArgument, op, "padding 'same' of x ", x, " with ",
                    p, " is above 2^31-1");
    const std::int64_t small = total / 2, big = total - small;
    before = static_cast<int>(mode == SamePadding::upper ? small : big);
    after = static_cast<int>(mode == SamePadding::upper ? big : small);
  };
  split(x[2], p.kernel_h, p.stride_h, p.dilation_h, p.pad_top, p.pad_bottom);
  split(x[3], p.kernel_w, p.stride_w, p.dilation_w, p.pad_left, p.pad_right);
  return p;
}

// Validates x's shape and the parameters; returns [N, C, OH, OW]. `op` names the caller in errors.
inline Shape pool2d_output_shape(const Shape& x, const Pool2dParams& p, std::string_view op = "pool2d_output_shape") {
  CUTRAIN_REQUIRE(x.rank() == 4, InvalidArgument, op, "input must be 4-d [N,C,H,W], got shape ", x);
  for (auto d : x)
    CUTRAIN_REQUIRE(d > 0, InvalidArgument, op, "input shape ", x, " has a zero or negative dimension");
  CUTRAIN_REQUIRE(p.mode == PoolMode::max || p.mode == PoolMode::average, InvalidArgument, op, "unknown pool mode ",
                  static_cast<int>(p.mode));
  CUTRAIN_REQUIRE(p.kernel_h >= 1 && p.kernel_w >= 1, InvalidArgument, op, "kernel must be at least 1x1, got ",
                  p.kernel_h, "x", p.kernel_w);
  CUTRAIN_REQUIRE(p.stride_h >= 0 && p.stride_w >= 0, InvalidArgument, op,
                  "stride must be non-negative (0 means the kernel size), got ", p.stride_h, "x", p.stride_w);
  CUTRAIN_REQUIRE(p.pad_top >= 0 && p.pad_bottom >= 0 && p.pad_left >= 0 && p.pad_right >= 0, InvalidArgument, op,
                  "padding must be non-negative, got ", p);
  CUTRAIN_REQUIRE(p.dilation_h >= 1 && p.dilation_w >= 1, InvalidArgument, op, "dilation must be at least 1, got ",
                  p.dilation_h, "x", p.dilation_w, " for input ", x);
  // Padding of a whole kernel or more would put whole windows in the padding even at dilation 1.
  CUTRAIN_REQUIRE(p.pad_top < p.kernel_h && p.pad_bottom < p.kernel_h, InvalidArgument, op,
                  "padding must be smaller than the kernel: pad_top ", p.pad_top, ", pad_bottom ", p.pad_bottom,
                  " with kernel_h ", p.kernel_h, " for input ", x);
  CUTRAIN_REQUIRE(p.pad_left < p.kernel_w && p.pad_right < p.kernel_w, InvalidArgument, op,
                  "padding must be smaller than the kernel: pad_left ", p.pad_left, ", pad_right ", p.pad_right,
                  " with kernel_w ", p.kernel_w, " for input ", x);
  const std::int64_t oh = detail::pool_out_size(x[2], p.span_h(), p.effective_stride_h(), p.pad_top, p.pad_bottom,
                                                p.ceil_mode);
  const std::int64_t ow = detail::pool_out_size(x[3], p.span_w(), p.effective_stride_w(), p.pad_left, p.pad_right,
                                                p.ceil_mode);
  CUTRAIN_REQUIRE(oh > 0 && ow > 0, InvalidArgument, op, "output size would be ", oh, "x", ow, " for input ", x,
                  " with ", p, ": the kernel is larger than the padded input");
  // With padding below the kernel, a window at dilation 1 always holds an input element; dilated
  // taps can all fall in the padding (and skip the input). Such a window has no maximum and no
  // average over real elements: refused, naming the first one (PyTorch refuses these configs).
  const std::int64_t eh = detail::pool_empty_window(x[2], oh, p.kernel_h, p.dilation_h, p.effective_stride_h(), p.pad_top);
  CUTRAIN_REQUIRE(eh < 0, InvalidArgument, op, "output row ", eh, " of ", oh, ": its window's taps all lie in the padding (",
                  "no input element) for input ", x, " with ", p, "; reduce the padding or the dilation");
  const std::int64_t ew = detail::pool_empty_window(x[3], ow, p.kernel_w, p.dilation_w, p.effective_stride_w(), p.pad_left);
  CUTRAIN_REQUIRE(ew < 0, InvalidArgument, op, "output column ", ew, " of ", ow, ": its window's taps all lie in the ",
                  "padding (no input element) for input ", x, " with ", p, "; reduce the padding or the dilation");
  const Shape y{x[0], x[1], oh, ow};
  CUTRAIN_REQUIRE(shape_fits(y, 8), InvalidArgument, op, "output shape ", y, " for input ", x, " with ", p,
                  " is too large: its byte count overflows int64");
  return y;
}

}  // namespace cutrain::inline CUTRAIN_ABI
