// Transposed 2-d convolution parameters and output-shape rule, shared by the CPU and CUDA
// backends. Semantics are PyTorch's conv_transpose2d: the adjoint (backward data) of the conv2d
// with the same stride, padding, dilation and groups, whose input is the transposed conv's output.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <ostream>
#include <string_view>

#include "cutrain/core/params/conv2d.hpp"

namespace cutrain::inline CUTRAIN_ABI {

struct ConvTranspose2dParams {
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;  // removed from both sides of the full output, as in PyTorch
  int output_padding_h = 0, output_padding_w = 0;  // added at the bottom / right of the output
  int dilation_h = 1, dilation_w = 1;
  int groups = 1;

  static ConvTranspose2dParams make(int stride, int pad, int output_padding = 0, int dilation = 1, int groups = 1) {
    return {.stride_h = stride, .stride_w = stride, .pad_h = pad, .pad_w = pad, .output_padding_h = output_padding,
            .output_padding_w = output_padding, .dilation_h = dilation, .dilation_w = dilation, .groups = groups};
  }
  // The conv2d this is the data gradient of: its input is this op's output, its output this op's input.
  Conv2dParams conv() const {
    return {.stride_h = stride_h, .stride_w = stride_w, .pad_top = pad_h, .pad_bottom = pad_h, .pad_left = pad_w,
            .pad_right = pad_w, .dilation_h = dilation_h, .dilation_w = dilation_w, .groups = groups};
  }
  friend bool operator==(const ConvTranspose2dParams&, const ConvTranspose2dParams&) = default;
};

inline std::ostream& operator<<(std::ostream& os, const ConvTranspose2dParams& p) {
  return os << "{stride " << p.stride_h << "x" << p.stride_w << ", pad " << p.pad_h << "x" << p.pad_w
            << ", output_padding " << p.output_padding_h << "x" << p.output_padding_w << ", dilation " << p.dilation_h
            << "x" << p.dilation_w << ", groups " << p.groups << "}";
}

// Output shape [N, Cout, Ho, Wo] of a transposed convolution of x [N, Cin, H, W] with
// w [Cin, Cout/groups, R, S] (PyTorch's weight layout, which is the filter of the conv2d
// p.conv() read as [K = Cin, C/groups, R, S]):
//   Ho = (H - 1) * stride_h - 2 * pad_h + dilation_h * (R - 1) + output_padding_h + 1, likewise Wo.
// output_padding must be below the stride: PyTorch also takes output_padding < dilation, but then
// the output is one the conv2d p.conv() does not map back onto x's shape, and cuDNN refuses it.
inline Shape conv_transpose2d_output_shape(const Shape& x, const Shape& w, const ConvTranspose2dParams& p,
                                           std::string_view op = "conv_transpose2d_output_shape") {
  CUTRAIN_REQUIRE(p.stride_h >= 1 && p.stride_w >= 1, InvalidArgument, op, "stride must be >= 1, got ", p);
  CUTRAIN_REQUIRE(p.dilation_h >= 1 && p.dilation_w >= 1, InvalidArgument, op, "dilation must be >= 1, got ", p);
  CUTRAIN_REQUIRE(p.pad_h >= 0 && p.pad_w >= 0, InvalidArgument, op, "padding must be >= 0, got ", p);
  CUTRAIN_REQUIRE(p.output_padding_h >= 0 && p.output_padding_w >= 0, InvalidArgument, op,
                  "output_padding must be >= 0, got ", p);
  CUTRAIN_REQUIRE(p.output_padding_h < p.stride_h && p.output_padding_w < p.stride_w, InvalidArgument, op,
                  "output_padding must be smaller than the stride (output_padding < dilation alone is not supported), got ",
                  p);
  CUTRAIN_REQUIRE(p.groups >= 1, InvalidArgument, op, "groups must be >= 1, got ", p);
  detail::conv2d_check_dims(op, x, "x");
  detail::conv2d_check_dims(op, w, "w");
  const std::int64_t g = p.groups;
  CUTRAIN_REQUIRE(x[1] == w[0], InvalidArgument, op, "x ", x, " has ", x[1], " channels but w ", w,
                  " ([Cin, Cout/groups, R, S]) expects ", w[0]);
  CUTRAIN_REQUIRE(w[0] % g == 0, InvalidArgument, op, "input channels of w ", w, " are not divisible by groups ", g);
  const std::int64_t ho = (x[2] - 1) * p.stride_h - 2 * std::int64_t{p.pad_h} + std::int64_t{p.dilation_h} * (w[2] - 1) +
                          p.output_padding_h + 1;
  const std::int64_t wo = (x[3] - 1) * p.stride_w - 2 * std::int64_t{p.pad_w} + std::int64_t{p.dilation_w} * (w[3] - 1) +
                          p.output_padding_w + 1;
  CUTRAIN_REQUIRE(ho > 0 && wo > 0, InvalidArgument, op, "output size ", ho, "x", wo, " of x ", x, " and w ", w,
                  " with ", p, " is not positive (the padding removes more than the output has)");
  const Shape y{x[0], w[1] * g, ho, wo};
  detail::conv2d_check_dims(op, y, "output");
  // By construction p.conv() maps y back onto x; checked so that the rule cannot drift from conv2d's.
  const Shape back = conv2d_output_shape(y, w, p.conv(), op);
  CUTRAIN_REQUIRE(back == x, InvalidArgument, op, "output ", y, " of x ", x, " and w ", w, " with ", p,
                  " does not map back onto x (got ", back, ")");
  return y;
}

}  // namespace cutrain::inline CUTRAIN_ABI
