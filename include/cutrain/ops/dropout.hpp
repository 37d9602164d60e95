// dropout_forward / dropout_backward (seeded, inverted dropout): dispatch on the tensors' device.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>

#include "cutrain/cpu/dropout.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/dropout.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

// Drops element i (logical index) when uniform_at(seed, i) < p and scales the rest by 1 / (1 - p).
template <class T>
DropoutForward<T> dropout_forward(const Tensor<T>& x, double p, std::uint64_t seed) {
  constexpr std::string_view op = "dropout_forward";
  check::defined(op, x, "x");
  // p == 1 would scale the kept elements by 1 / 0; the negated test also rejects NaN.
  CUTRAIN_REQUIRE(p >= 0.0 && p < 1.0, InvalidArgument, op, "p must be in [0, 1), got ", p, " for x ",
                  x.describe());
  return detail::dispatch<DropoutForward<T>>(
      op, [&](const auto& x) { return cpu::dropout_forward(x, p, seed); },
      CUTRAIN_IF_CUDA([&](const auto& x) {
        DropoutForward<T> out{detail::device_output<T>(x.shape(), x), detail::device_output<T>(x.shape(), x)};
        cuda::kernels::dropout_forward(x, p, seed, out.y, out.mask);
        return out;
      }),
      x);
}

// dx = dy * mask, where mask is dropout_forward's mask.
template <class T>
Tensor<T> dropout_backward(const Tensor<T>& dy, const Tensor<T>& mask) {
  constexpr std::string_view op = "dropout_backward";
  check::defined(op, dy, "dy");
  check::shape(op, mask, dy.shape(), "mask");
  return detail::dispatch<Tensor<T>>(
      op, [](const auto& dy, const auto& mask) { return cpu::dropout_backward(dy, mask); },
      CUTRAIN_IF_CUDA([](const auto& dy, const auto& mask) {
        Tensor<T> dx = detail::device_output<T>(dy.shape(), dy);
        cuda::kernels::dropout_backward(dy, mask, dx);
        return dx;
      }),
      dy, mask);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
