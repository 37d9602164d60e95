// gelu_mlp_forward / gelu_mlp_backward: a transformer's MLP, y = gelu_tanh(x w1^T + b1) w2^T + b2
// (+ residual), as one op. On the CPU: the linear, activation and add ops in turn. On CUDA: the
// GELU rides on the first matmul (cuBLASLt's GELU_AUX_BIAS epilogue keeps its input z), the
// residual is the second matmul's C operand, and in backward the GELU's gradient rides on the
// second matmul's input gradient (the DGELU epilogue reads z): no elementwise pass over the
// [N, hidden] activations either way. Where cuBLASLt has no algorithm with those epilogues, the
// unfused matmuls and kernels run instead, with the same results.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <type_traits>

#include "cutrain/cpu/activation.hpp"
#include "cutrain/cpu/elementwise.hpp"
#include "cutrain/cpu/linear.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/api.hpp"
#include "cutrain/cuda/kernels/activation.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI {

// What backward needs besides the weights: z = x w1^T + b1 and g = gelu_tanh(z), both [N, hidden].
template <class T>
struct GeluMlpForward {
  Tensor<T> y, z, g;
};

template <class T>
struct GeluMlpBackward {
  Tensor<T> dx, dw1, db1, dw2, db2;  // db1 / db2 undefined without that bias
};

}  // namespace cutrain::inline CUTRAIN_ABI

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
inline constexpr ActivationParams gelu_tanh_params{.kind = Activation::gelu_tanh};

// The element type of a dispatch lambda's tensor argument: a result type named through it is
// compiled only where that backend computes in T.
template <class A>
using element_of = typename std::remove_cvref_t<A>::value_type;

template <class T>
void check_gelu_mlp(std::string_view op, const Tensor<T>& x, const Tensor<T>& w1, const Tensor<T>& b1,
                    const Tensor<T>& w2, const Tensor<T>& b2) {
  check::defined(op, x, "x");
  check::defined(op, w1, "w1");
  check::defined(op, w2, "w2");
  check::rank(op, x, 2, "x");
  check::rank(op, w1, 2, "w1");
  check::rank(op, w2, 2, "w2");
  CUTRAIN_REQUIRE(x.dim(1) == w1.dim(1) && w2.dim(1) == w1.dim(0), InvalidArgument, op, "x ", x.describe(), ", w1 ",
                  w1.describe(), " and w2 ", w2.describe(), " do not chain (x [N, in], w1 [hidden, in], w2 [out, hidden])");
  if (b1.defined()) check::shape(op, b1, Shape{w1.dim(0)}, "b1");
  if (b2.defined()) check::shape(op, b2, Shape{w2.dim(0)}, "b2");
  CUTRAIN_REQUIRE(shape_fits(Shape{x.dim(0), std::max(w1.dim(0), w2.dim(0))}, sizeof(T)), InvalidArgument, op,
                  "the activations of x ", x.describe(), " and w1 ", w1.describe(),
                  " are too large: their byte count overflows int64");
}
}  // namespace detail

// y = gelu_tanh(x w1^T + b1) w2^T + b2 + residual, with z and g kept for backward. x [N, in],
// w1 [hidden, in], b1 [hidden], w2 [out, hidden], b2 [out], residual [N, out]; the biases and the
// residual may be undefined.
template <class T>
GeluMlpForward<T> gelu_mlp_forward(const Tensor<T>& x, const Tensor<T>& w1, const Tensor<T>& b1, const Tensor<T>& w2,
                                   const Tensor<T>& b2, const Tensor<T>& residual) {
  constexpr std::string_view op = "gelu_mlp_forward";
  detail::check_gelu_mlp(op, x, w1, b1, w2, b2);
  if (residual.defined()) check::shape(op, residual, Shape{x.dim(0), w2.dim(0)}, "residual");
  return detail::dispatch<GeluMlpForward<T>>(
      op,
      [](const auto& x, const auto& w1, const auto& b1, const auto& w2, const auto& b2, const auto& r) {
        GeluMlpForward<detail::element_of<decltype(x)>> f;  // of x's type: compiled only where the CPU computes
        f.z = cpu::linear_forward(x, w1, b1);
        f.g = cpu::activation_forward(f.z, detail::gelu_tanh_params);
        f.y = cpu::linear_forward(f.g, w2, b2);
        if (r.defined()) f.y = cpu::add(f.y, r);
        return f;
      },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& w1, const auto& b1, const auto& w2, const auto& b2, const auto& r) {
        using U = detail::element_of<decltype(x)>;  // T, named through x: compiled only for the GPU's types
        const Shape hidden{x.dim(0), w1.dim(0)};
        GeluMlpForward<U> f{detail::device_output<U>(Shape{x.dim(0), w2.dim(0)}, x), detail::device_output<U>(hidden, x),
                            detail::device_output<U>(hidden, x)};
        if (!cuda::cublas::linear_gelu_forward(x, w1, b1, f.g, f.z, op)) {
          cuda::cublas::linear_forward(x, w1, b1, Activation::identity, f.z, op);
          cuda::kernels::activation_forward(f.z, detail::gelu_tanh_params, f.g);
        }
        const Tensor<U> rows = r.defined() ? r.contiguous(Layout::row_major) : Tensor<U>{};
        cuda::cublas::linear_forward(f.g, w2, b2, Activation::identity, f.y, op, r.defined() ? &rows : nullptr);
        return f;
      }),
      x, w1, b1, w2, b2, residual);
}

// The gradients of gelu_mlp_forward's x, w1, w2 and (has_b1, has_b2) its biases from dy [N, out],
// given its x, w1, w2 and the z and g it returned. (The residual's gradient is dy itself.)
template <class T>
GeluMlpBackward<T> gelu_mlp_backward(const Tensor<T>& x, const Tensor<T>& w1, const Tensor<T>& w2, const Tensor<T>& z,
                                     const Tensor<T>& g, const Tensor<T>& dy, bool has_b1, bool has_b2) {
  constexpr std::string_view op = "gelu_mlp_backward";
  detail::check_gelu_mlp(op, x, w1, Tensor<T>{}, w2, Tensor<T>{});
  const Shape hidden{x.dim(0), w1.dim(0)};
  check::shape(op, z, hidden, "z");
  check::shape(op, g, hidden, "g");
  check::shape(op, dy, Shape{x.dim(0), w2.dim(0)}, "dy");
  return detail::dispatch<GeluMlpBackward<T>>(
      op,
      [&](const auto& x, const auto& w1, const auto& w2, const auto& z, const auto& g, const auto& dy) {
        using U = detail::element_of<decltype(x)>;
        LinearBackward<U> second = cpu::linear_backward(g, w2, dy, has_b2);
        const Tensor<U> dz = cpu::activation_backward(z, second.dx, detail::gelu_tanh_params);
        LinearBackward<U> first = cpu::linear_backward(x, w1, dz, has_b1);
        return GeluMlpBackward<U>{std::move(first.dx), std::move(first.dw), std::move(first.db),
                                  std::move(second.dw), std::move(second.db)};
      },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& w1, const auto& w2, const auto& z, const auto& g, const auto& dy) {
        using U = detail::element_of<decltype(x)>;
        const auto out = [&](const Shape& s) { return detail::device_output<U>(s, dy); };
        GeluMlpBackward<U> r{out(x.shape()), out(w1.shape()), has_b1 ? out(Shape{w1.dim(0)}) : Tensor<U>{},
                             out(w2.shape()), has_b2 ? out(Shape{w2.dim(0)}) : Tensor<U>{}};
        const Tensor<U> zs = z.contiguous(Layout::row_major), dys = dy.contiguous(Layout::row_major);
        Tensor<U> dz = out(hidden);
        if (cuda::cublas::linear_dgrad_gelu(w2, dys, zs, dz, op)) {
          Tensor<U> no_dx;  // dz came from the fused matmul
          cuda::cublas::linear_backward(g, w2, dys, has_b2, no_dx, r.dw2, r.db2, op);
        } else {
          Tensor<U> dg = out(hidden);
          cuda::cublas::linear_backward(g, w2, dys, has_b2, dg, r.dw2, r.db2, op);
          cuda::kernels::activation_backward(zs, dg, detail::gelu_tanh_params, dz);
        }
        cuda::cublas::linear_backward(x, w1, dz, has_b1, r.dx, r.dw1, r.db1, op);
        return r;
      }),
      x, w1, w2, z, g, dy);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
