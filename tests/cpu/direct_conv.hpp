// The convolution sum written out element by element, as an oracle independent of im2col and
// GEMMs: y[n, k, oh, ow] = b[k] + sum over c, r, s of w[k, c, r, s] * x[n, g*Cg + c, ih, iw] (x
// outside the image reads as zero; b may be undefined), in logical row-major order of y.
#pragma once

#include <cstdint>
#include <vector>

#include "cutrain/core/params/conv2d.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::test {

inline std::vector<double> direct_conv(const Tensor<double>& x, const Tensor<double>& w, const Tensor<double>& b,
                                       const Conv2dParams& p) {
  const Shape ys = conv2d_output_shape(x.shape(), w.shape(), p);
  const std::int64_t Cg = w.dim(1), Kg = w.dim(0) / p.groups;
  std::vector<double> y;
  for (std::int64_t n = 0; n < ys[0]; ++n)
    for (std::int64_t k = 0; k < ys[1]; ++k)
      for (std::int64_t oh = 0; oh < ys[2]; ++oh)
        for (std::int64_t ow = 0; ow < ys[3]; ++ow) {
          double acc = b.defined() ? b.flat(k) : 0.0;
          for (std::int64_t c = 0; c < Cg; ++c)
            for (std::int64_t r = 0; r < w.dim(2); ++r)
              for (std::int64_t s = 0; s < w.dim(3); ++s) {
                const std::int64_t ih = oh * p.stride_h - p.pad_top + r * p.dilation_h;
                const std::int64_t iw = ow * p.stride_w - p.pad_left + s * p.dilation_w;
                if (ih < 0 || ih >= x.dim(2) || iw < 0 || iw >= x.dim(3)) continue;
                acc += w(k, c, r, s) * x(n, (k / Kg) * Cg + c, ih, iw);
              }
          y.push_back(acc);
        }
  return y;
}

}  // namespace cutrain::test
