// 2-d convolution parameters and output-shape rule, shared by the CPU and CUDA backends.
// Semantics are PyTorch's conv2d (cross-correlation), with padding allowed to differ per side.
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

struct Conv2dParams {
  int stride_h = 1, stride_w = 1;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int dilation_h = 1, dilation_w = 1;
  int groups = 1;

  // The same stride, padding and dilation in both spatial dimensions (and on all four sides).
  static Conv2dParams make(int stride, int pad, int dilation = 1, int groups = 1) {
    return {.stride_h = stride, .stride_w = stride, .pad_top = pad, .pad_bottom = pad, .pad_left = pad,
            .pad_right = pad, .dilation_h = dilation, .dilation_w = dilation, .groups = groups};
  }
  friend bool operator==(const Conv2dParams&, const Conv2dParams&) = default;
};

inline std::ostream& operator<<(std::ostream& os, const Conv2dParams& p) {
  return os << "{stride " << p.stride_h << "x" << p.stride_w << ", pad t" << p.pad_top << " b" << p.pad_bottom << " l"
            << p.pad_left << " r" << p.pad_right << ", dilation " << p.dilation_h << "x" << p.dilation_w << ", groups "
            << p.groups << "}";
}

namespace detail {
// Dimensions above this are refused, so that no size arithmetic below can overflow (cuDNN takes
// 32-bit dimensions anyway).
inline constexpr std::int64_t conv_max_dim = std::numeric_limits<std::int32_t>::max();

inline void conv2d_check_dims(std::string_view op, const Shape& s, std::string_view name) {
  CUTRAIN_REQUIRE(s.rank() == 4, InvalidArgument, op, name, " must be 4-d, got ", s);
  for (auto d : s) {
    CUTRAIN_REQUIRE(d > 0, InvalidArgument, op, name, " ", s, " has a zero or negative dimension");
    CUTRAIN_REQUIRE(d <= conv_max_dim, InvalidArgument, op, name, " ", s, " has a dimension above 2^31-1");
  }
  // Four dims below 2^31 can still overflow int64 together: bound the element count.
  std::int64_t n = 1;
  for (auto d : s) {
    CUTRAIN_REQUIRE(n <= std::numeric_limits<std::int64_t>::max() / 8 / d, InvalidArgument, op, name, " ", s,
                    " has too many elements");
    n *= d;
  }
}
}  // namespace detail

// Output shape [N, K, Ho, Wo] of a convolution of x [N, C, H, W] with w [K, C/groups, R, S]:
//   Ho = (H + pad_top + pad_bottom - dilation_h * (R - 1) - 1) / stride_h + 1, and likewise Wo.
// Validates shapes and parameters; errors name `op`.
inline Shape conv2d_output_shape(const Shape& x, const Shape& w, const Conv2dParams& p,
                                 std::string_view op = "conv2d_output_shape") {
  CUTRAIN_REQUIRE(p.stride_h >= 1 && p.stride_w >= 1, InvalidArgument, op, "stride must be >= 1, got ", p);
  CUTRAIN_REQUIRE(p.dilation_h >= 1 && p.dilation_w >= 1, InvalidArgument, op, "dilation must be >= 1, got ", p);
  CUTRAIN_REQUIRE(p.pad_top >= 0 && p.pad_bottom >= 0 && p.pad_left >= 0 && p.pad_right >= 0, InvalidArgument, op,
                  "padding must be >= 0, got ", p);
  CUTRAIN_REQUIRE(p.groups >= 1, InvalidArgument, op, "groups must be >= 1, got ", p);
  detail::conv2d_check_dims(op, x, "x");
  detail::conv2d_check_dims(op, w, "w");
  const std::int64_t C = x[1], K = w[0], g = p.groups;
  CUTRAIN_REQUIRE(C % g == 0, InvalidArgument, op, "input channels of x ", x, " are not divisible by groups ", g);
  CUTRAIN_REQUIRE(K % g == 0, InvalidArgument, op, "output channels of w ", w, " are not divisible by groups ", g);
  CUTRAIN_REQUIRE(w[1] * g == C, InvalidArgument, op, "x ", x, " has ", C, " channels but w ", w, " with groups ", g,
                  " expects ", w[1] * g);
  const std::int64_t hp = x[2] + p.pad_top + p.pad_bottom, wp = x[3] + p.pad_left + p.pad_right;
  const std::int64_t rd = std::int64_t{p.dilation_h} * (w[2] - 1) + 1, sd = std::int64_t{p.dilation_w} * (w[3] - 1) + 1;
  CUTRAIN_REQUIRE(rd <= hp && sd <= wp, InvalidArgument, op, "dilated kernel ", rd, "x", sd, " of w ", w,
                  " is larger than the padded input ", hp, "x", wp, " of x ", x, " (", p, ")");
  const std::int64_t ho = (hp - rd) / p.stride_h + 1, wo = (wp - sd) / p.stride_w + 1;
  // Unreachable after the check above; kept so the rule stands on its own if that check changes.
  CUTRAIN_REQUIRE(ho > 0 && wo > 0, InvalidArgument, op, "output size ", ho, "x", wo, " is not positive");
  const Shape y{x[0], K, ho, wo};
  // The output, and the CPU's im2col buffer (C/groups * R * S rows of Ho * Wo), must be
  // countable in bytes: huge padding makes both huge.
  CUTRAIN_REQUIRE(shape_fits(y, 8) && shape_fits(Shape{w[1], w[2], w[3], ho, wo}, 8), InvalidArgument, op,
                  "output ", y, " of x ", x, " and w ", w, " with ", p, " is too large: its byte count overflows int64");
  return y;
}


// p with padding 'same' for a kh x kw kernel (TensorFlow's and PyTorch's rule): per spatial
// dimension a total of dilation * (k - 1), half before and the odd one after (bottom, right), so
// that the output has the input's size. p's stride must be 1, since no padding gives a strided
// output the input's size (PyTorch refuses it too), and p's padding must be zero (it is replaced).
inline Conv2dParams conv2d_same_padding(int kernel_h, int kernel_w, Conv2dParams p = {},
                                        std::string_view op = "conv2d_same_padding") {
  CUTRAIN_REQUIRE(p.stride_h == 1 && p.stride_w == 1, InvalidArgument, op,
                  "padding 'same' needs stride 1 (a strided output cannot have the input's size), got ", p);
  CUTRAIN_REQUIRE(kernel_h >= 1 && kernel_w >= 1, InvalidArgument, op, "padding 'same' needs a kernel of at least 1x1, got ",
                  kernel_h, "x", kernel_w);
  CUTRAIN_REQUIRE(p.dilation_h >= 1 && p.dilation_w >= 1, InvalidArgument, op, "dilation must be >= 1, got ", p);
  CUTRAIN_REQUIRE(p.pad_top == 0 && p.pad_bottom == 0 && p.pad_left == 0 && p.pad_right == 0, InvalidArgument, op,
                  "padding 'same' replaces the padding, which must be zero here, got ", p);
  const std::int64_t th = std::int64_t{p.dilation_h} * (kernel_h - 1), tw = std::int64_t{p.dilation_w} * (kernel_w - 1);
  CUTRAIN_REQUIRE(th <= detail::conv_max_dim && tw <= detail::conv_max_dim, InvalidArgument, op, "padding 'same' of a ",
                  kernel_h, "x", kernel_w, " kernel with ", p, " is above 2^31-1");
  p.pad_top = static_cast<int>(th / 2), p.pad_bottom = static_cast<int>(th - th / 2);
  p.pad_left = static_cast<int>(tw / 2), p.pad_right = static_cast<int>(tw - tw / 2);
  return p;
}

// Padding 'same' with any stride (TensorFlow's SAME, ONNX's auto_pad SAME_UPPER / SAME_LOWER):
// the output is ceil(input / stride) per spatial dimension, and the padding that takes, total =
// max((out - 1) * stride + dilation * (k - 1) + 1 - in, 0), goes half before and half after, the
// odd one after (upper) or before (lower). It depends on the input's size: x [N, C, H, W], w [K,
// C/groups, R, S]. With stride 1 and upper it is conv2d_same_padding(w) above.

inline Conv2dParams conv2d_same_padding(const Shape& x, const Shape& w, Conv2dParams p, SamePadding mode = SamePadding::upper,
                                        std::string_view op = "conv2d_same_padding") {
  detail::conv2d_check_dims(op, x, "x");
  detail::conv2d_check_dims(op, w, "w");
  CUTRAIN_REQUIRE(p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 && p.dilation_w >= 1, InvalidArgument, op,
                  "stride and dilation must be >= 1, got ", p);
  CUTRAIN_REQUIRE(p.pad_top == 0 && p.pad_bottom == 0 && p.pad_left == 0 && p.pad_right == 0, InvalidArgument, op,
                  "padding 'same' replaces the padding, which must be zero here, got ", p);
  CUTRAIN_REQUIRE(w[2] <= detail::conv_max_dim && w[3] <= detail::conv_max_dim && x[2] <= detail::conv_max_dim &&
                      x[3] <= detail::conv_max_dim,
                  InvalidArgument, op, "x ", x, " and w ", w, " need spatial sizes below 2^31");
  const auto split = [&](std::int64_t in, std::int64_t k, int stride, int dilation, int& before, int& after) {
    const std::int64_t out = (in + stride - 1) / stride;
    const std::int64_t total = std::max<std::int64_t>((out - 1) * stride + std::int64_t{dilation} * (k - 1) + 1 - in, 0);
    CUTRAIN_REQUIRE(total <= detail::conv_max_dim, InvalidArgument, op, "padding 'same' of x ", x, " and w ", w,
                    " with ", p, " is above 2^31-1");
    const std::int64_t small = total / 2, big = total - small;
    before = static_cast<int>(mode == SamePadding::upper ? small : big);
    after = static_cast<int>(mode == SamePadding::upper ? big : small);
  };
  split(x[2], w[2], p.stride_h, p.dilation_h, p.pad_top, p.pad_bottom);
  split(x[3], w[3], p.stride_w, p.dilation_w, p.pad_left, p.pad_right);
  return p;
}

// The same for the kernel of w [K, C/groups, R, S].
inline Conv2dParams conv2d_same_padding(const Shape& w, Conv2dParams p = {}, std::string_view op = "conv2d_same_padding") {
  detail::conv2d_check_dims(op, w, "w");
  CUTRAIN_REQUIRE(w[2] <= detail::conv_max_dim && w[3] <= detail::conv_max_dim, InvalidArgument, op, "w ", w,
                  " has a kernel above 2^31-1");
  return conv2d_same_padding(static_cast<int>(w[2]), static_cast<int>(w[3]), p, op);
}

}  // namespace cutrain::inline CUTRAIN_ABI
