// The activation functions cutrain knows, shared by the CPU and CUDA backends and fused epilogues.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <ostream>
#include <string_view>

#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI {

enum class Activation { identity, relu, leaky_relu, elu, sigmoid, tanh, gelu_erf, gelu_tanh, silu };

inline std::string_view to_string(Activation a) {
  switch (a) {
    case Activation::identity: return "identity";
    case Activation::relu: return "relu";
    case Activation::leaky_relu: return "leaky_relu";
    case Activation::elu: return "elu";
    case Activation::sigmoid: return "sigmoid";
    case Activation::tanh: return "tanh";
    case Activation::gelu_erf: return "gelu_erf";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::silu: return "silu";
  }
  return "?";
}
inline std::ostream& operator<<(std::ostream& os, Activation a) { return os << to_string(a); }

struct ActivationParams {
  Activation kind = Activation::relu;
  double alpha = 0.01;  // negative slope of leaky_relu; alpha of elu (set 1.0 for the usual elu)
};

namespace detail {
// A kind outside the enum (a cast from a bad int) would run as no activation at all.
inline void check_activation(std::string_view op, const ActivationParams& a) {
  CUTRAIN_REQUIRE(static_cast<int>(a.kind) >= static_cast<int>(Activation::identity) &&
                      static_cast<int>(a.kind) <= static_cast<int>(Activation::silu),
                  InvalidArgument, op, "unknown activation kind ", static_cast<int>(a.kind), " (valid: 0 identity to ",
                  static_cast<int>(Activation::silu), " silu)");
  CUTRAIN_REQUIRE(std::isfinite(a.alpha), InvalidArgument, op, "activation alpha must be finite, got ", a.alpha);
}
}  // namespace detail

}  // namespace cutrain::inline CUTRAIN_ABI
