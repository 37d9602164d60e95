// Seeded inverted dropout on the CPU. Element i (logical index) is dropped when
// uniform_at(seed, i) < p, so every backend and every layout draws the same mask.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <vector>

#include "cutrain/cpu/common.hpp"

namespace cutrain::inline CUTRAIN_ABI {

// y = x * mask; mask holds 0 (dropped) or 1 / (1 - p) (kept), in x's layout.
template <class T>
struct DropoutForward {
  Tensor<T> y, mask;
};

}  // namespace cutrain::inline CUTRAIN_ABI

namespace cutrain::inline CUTRAIN_ABI::cpu {

template <CpuFloat T>
DropoutForward<T> dropout_forward(const Tensor<T>& x, double p, std::uint64_t seed) {
  const T keep_scale = static_cast<T>(1.0 / (1.0 - p));
  const auto xs = x.to_vector();
  std::vector<T> ys(xs.size()), ms(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    ms[i] = uniform_at(seed, static_cast<std::uint64_t>(i)) < p ? T(0) : keep_scale;
    ys[i] = xs[i] * ms[i];
  }
  DropoutForward<T> out{empty_like_layout(x.shape(), x), empty_like_layout(x.shape(), x)};
  out.y.assign(ys);
  out.mask.assign(ms);
  return out;
}

// dx = dy * mask, in dy's layout.
template <CpuFloat T>
Tensor<T> dropout_backward(const Tensor<T>& dy, const Tensor<T>& mask) {
  const auto dys = dy.to_vector(), ms = mask.to_vector();
  std::vector<T> dx(dys.size());
  for (std::size_t i = 0; i < dys.size(); ++i) dx[i] = dys[i] * ms[i];
  Tensor<T> t = empty_like_layout(dy.shape(), dy);
  t.assign(dx);
  return t;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
