// Batch, layer and RMS normalization: parameters and the results that forward hands to backward,
// shared by the CPU and CUDA backends.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <ostream>
#include <string_view>

#include "cutrain/core/error.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI {

// PyTorch's and cuDNN's meaning: running = (1 - momentum) * running + momentum * batch_stat.
struct BatchNormParams {
  double momentum = 0.1;
  double eps = 1e-5;
  friend bool operator==(const BatchNormParams&, const BatchNormParams&) = default;
};

inline std::ostream& operator<<(std::ostream& os, const BatchNormParams& p) {
  return os << "{momentum " << p.momentum << ", eps " << p.eps << "}";
}

// T is the element type of x and y, S that of the parameters and statistics: S == T on the CPU;
// on the GPU S is float (f32 statistics, also for bf16 and f16 activations).

// save_mean and save_inv_std ([C]) are the batch mean and 1 / sqrt(biased variance + eps) that
// batch_norm_backward consumes.
template <class T, class S = T>
struct BatchNormForward {
  Tensor<T> y;
  Tensor<S> save_mean, save_inv_std;
};

// mean and inv_std ([N]) are per sample, for layer_norm_backward.
template <class T, class S = T>
struct LayerNormForward {
  Tensor<T> y;
  Tensor<S> mean, inv_std;
};

template <class T, class S = T>
struct NormBackward {
  Tensor<T> dx;
  Tensor<S> dgamma, dbeta;
};

// batch_norm_act_backward: NormBackward's three and dresidual, the gradient of act's input
// (batch norm's output plus the residual), which is the residual's gradient; undefined when not asked.
template <class T, class S = T>
struct BatchNormActBackward {
  Tensor<T> dx;
  Tensor<S> dgamma, dbeta;
  Tensor<T> dresidual;
};

// inv_rms (the leading dims' shape) is 1 / sqrt(mean(x^2) + eps) per row, for rms_norm_backward.
template <class T, class S = T>
struct RmsNormForward {
  Tensor<T> y;
  Tensor<S> inv_rms;
};

// RMS norm has no bias: dgamma only.
template <class T, class S = T>
struct RmsNormBackward {
  Tensor<T> dx;
  Tensor<S> dgamma;
};

namespace detail {
// eps keeps 1 / sqrt(var + eps) finite when a channel is constant, so it must be positive.
inline void norm_check_eps(std::string_view op, double eps) {
  CUTRAIN_REQUIRE(eps > 0 && std::isfinite(eps), InvalidArgument, op, "eps must be positive and finite, got ", eps);
}

inline void norm_check_momentum(std::string_view op, double momentum) {
  CUTRAIN_REQUIRE(momentum >= 0 && momentum <= 1, InvalidArgument, op, "momentum must lie in [0, 1], got ",
                  momentum);
}
}  // namespace detail

}  // namespace cutrain::inline CUTRAIN_ABI
