// Transposed 2-d convolution on the CPU, as the conv2d it is the adjoint of: forward is conv2d's
// backward data (plus a bias), backward data is conv2d's forward, backward filter is conv2d's
// backward filter with the roles of input and output gradient swapped.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>

#include "cutrain/core/params/conv_transpose2d.hpp"
#include "cutrain/cpu/conv2d.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
// y[n, k, :, :] += bias[k] on a contiguous 4-d y (nchw or nhwc), through its strides.
template <class T>
void add_channel_bias(Tensor<T>& y, const Tensor<T>& bias) {
  const Tensor<T> bs = row_major(bias);
  const Strides& st = y.strides();
  T* d = y.data();
  for (std::int64_t n = 0; n < y.dim(0); ++n)
    for (std::int64_t k = 0; k < y.dim(1); ++k) {
      const T b = bs.data()[k];
      for (std::int64_t h = 0; h < y.dim(2); ++h) {
        T* row = d + n * st[0] + k * st[1] + h * st[2];
        for (std::int64_t w = 0; w < y.dim(3); ++w) row[w * st[3]] += b;
      }
    }
}
}  // namespace detail

// y = bias + the transpose of conv2d(., w, p.conv()) applied to x: x [N, Cin, H, W],
// w [Cin, Cout/groups, R, S], y [N, Cout, Ho, Wo] (conv_transpose2d_output_shape). bias [Cout]
// may be undefined. y takes x's layout.
template <CpuFloat T>
Tensor<T> conv_transpose2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias,
                                   const ConvTranspose2dParams& p) {
  const Shape ys = conv_transpose2d_output_shape(x.shape(), w.shape(), p, "conv_transpose2d_forward");
  Tensor<T> y = conv2d_backward_data(x, w, ys, p.conv());
  if (bias.defined()) detail::add_channel_bias(y, bias);
  return y;
}

// dx = conv2d(dy, w) with p.conv(): x's shape, dy's layout.
template <CpuFloat T>
Tensor<T> conv_transpose2d_backward_data(const Tensor<T>& dy, const Tensor<T>& w, const ConvTranspose2dParams& p) {
  return conv2d_forward(dy, w, p.conv());
}

// dw = conv2d's filter gradient with x := dy and dy := x; w_shape [Cin, Cout/groups, R, S]; dy's layout.
template <CpuFloat T>
Tensor<T> conv_transpose2d_backward_filter(const Tensor<T>& dy, const Tensor<T>& x, const Shape& w_shape,
                                           const ConvTranspose2dParams& p) {
  return conv2d_backward_filter(x, dy, w_shape, p.conv());
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
