// Activations on the CPU: forward and backward, elementwise, any layout.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <numbers>

#include "cutrain/cpu/common.hpp"
#include "cutrain/core/params/activation.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
template <class T>
T act_forward(T x, const ActivationParams& a) {
  const T alpha = static_cast<T>(a.alpha);
  switch (a.kind) {
    case Activation::identity: return x;
    case Activation::relu: return x > T(0) ? x : T(0);
    case Activation::leaky_relu: return x > T(0) ? x : alpha * x;
    case Activation::elu: return x > T(0) ? x : alpha * std::expm1(x);
    case Activation::sigmoid: return T(1) / (T(1) + std::exp(-x));
    case Activation::tanh: return std::tanh(x);
    case Activation::gelu_erf: return T(0.5) * x * (T(1) + std::erf(x / std::numbers::sqrt2_v<T>));
    case Activation::gelu_tanh: {
      const T k = std::sqrt(T(2) / std::numbers::pi_v<T>);
      return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
    }
    case Activation::silu: return x / (T(1) + std::exp(-x));
  }
  return x;
}

// d act(x) / dx
template <class T>
T act_derivative(T x, const ActivationParams& a) {
  const T alpha = static_cast<T>(a.alpha);
  switch (a.kind) {
    case Activation::identity: return T(1);
    case Activation::relu: return x > T(0) ? T(1) : T(0);
    case Activation::leaky_relu: return x > T(0) ? T(1) : alpha;
    case Activation::elu: return x > T(0) ? T(1) : alpha * std::exp(x);
    case Activation::sigmoid: {
      const T s = T(1) / (T(1) + std::exp(-x));
      return s * (T(1) - s);
    }
    case Activation::tanh: {
      const T t = std::tanh(x);
      return T(1) - t * t;
    }
    case Activation::gelu_erf: {
      const T cdf = T(0.5) * (T(1) + std::erf(x / std::numbers::sqrt2_v<T>));
      const T pdf = std::exp(T(-0.5) * x * x) / std::sqrt(T(2) * std::numbers::pi_v<T>);
      return cdf + x * pdf;
    }
    case Activation::gelu_tanh: {
      const T k = std::sqrt(T(2) / std::numbers::pi_v<T>);
      const T u = k * (x + T(0.044715) * x * x * x);
      const T t = std::tanh(u);
      const T du = k * (T(1) + T(3) * T(0.044715) * x * x);
      return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
    }
    case Activation::silu: {
      const T s = T(1) / (T(1) + std::exp(-x));
      return s * (T(1) + x * (T(1) - s));
    }
  }
  return T(1);
}
}  // namespace detail

// Elementwise ops run over raw memory when the inputs share one contiguous layout; anything
// else (strided views, mixed layouts) is first staged into x's layout.
template <CpuFloat T>
Tensor<T> activation_forward(const Tensor<T>& x, const ActivationParams& a) {
  const Tensor<T> xs = x.contiguous(output_layout(x));
  Tensor<T> y = empty_like_layout(x.shape(), x);
  const T* xp = xs.data();
  T* yp = y.data();
  for (std::int64_t i = 0, n = x.numel(); i < n; ++i) yp[i] = detail::act_forward(xp[i], a);
  return y;
}

// dx = dy * act'(x); dx takes the layout of dy.
template <CpuFloat T>
Tensor<T> activation_backward(const Tensor<T>& x, const Tensor<T>& dy, const ActivationParams& a) {
  const Layout l = output_layout(dy);
  const Tensor<T> xs = x.contiguous(l), dys = dy.contiguous(l);
  Tensor<T> dx = empty_like_layout(x.shape(), dy);
  const T* xp = xs.data();
  const T* gp = dys.data();
  T* dp = dx.data();
  for (std::int64_t i = 0, n = x.numel(); i < n; ++i) dp[i] = gp[i] * detail::act_derivative(xp[i], a);
  return dx;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
