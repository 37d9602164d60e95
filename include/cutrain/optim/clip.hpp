// Gradient clipping by the global L2 norm over all parameters, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <vector>

#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/reduce.hpp"
#include "cutrain/ops/shape_ops.hpp"

namespace cutrain::inline CUTRAIN_ABI::optim {

// Returns the global norm before clipping; when it exceeds max_norm, every gradient is scaled by
// max_norm / (norm + 1e-6). Gradients are replaced by scaled copies, never changed in place.
// Host gradients are summed on the host; device ones on the device (each gradient's norm, stacked
// and combined there), with one 4-byte read of the result.
template <class T>
double clip_grad_norm(const std::vector<autograd::Var<T>>& params, double max_norm) {
  CUTRAIN_REQUIRE(max_norm > 0 && std::isfinite(max_norm), InvalidArgument, "optim::clip_grad_norm",
                  "max_norm must be positive and finite, got ", max_norm);
  double sum = 0;
  std::vector<Tensor<T>> device_norms;
  for (const auto& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    if (p.grad().device().is_cpu()) {
      for (T g : p.grad().to_vector()) sum += static_cast<double>(g) * static_cast<double>(g);
    } else {
      CUTRAIN_REQUIRE(device_norms.empty() || device_norms.front().device() == p.grad().device(), DeviceError,
                      "optim::clip_grad_norm", "gradients on different devices: ", device_norms.front().device(),
                      " and ", p.grad().device());
      device_norms.push_back(ops::norm(p.grad()).reshape(Shape{1}));
    }
  }
  if (!device_norms.empty()) {
    const double n = static_cast<double>(ops::norm(ops::concat(device_norms, 0)).to_vector()[0]);
    sum += n * n;
  }
  const double norm = std::sqrt(sum);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (const auto& p : params)
      if (p.defined() && p.grad().defined()) p.grad() = ops::scale(p.grad(), coef);
  return norm;
}

}  // namespace cutrain::inline CUTRAIN_ABI::optim
