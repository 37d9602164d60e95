// Gradient clipping by the global L2 norm over all parameters, as torch.nn.utils.clip_grad_norm_.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <vector>

#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/elementwise.hpp"

namespace cutrain::inline CUTRAIN_ABI::optim {

// Returns the global norm before clipping; when it exceeds max_norm, every gradient is scaled by
// max_norm / (norm + 1e-6). Gradients are replaced by scaled copies, never changed in place.
// The norm is summed on the host (one copy per gradient from the GPU).
template <class T>
double clip_grad_norm(const std::vector<autograd::Var<T>>& params, double max_norm) {
  CUTRAIN_REQUIRE(max_norm > 0 && std::isfinite(max_norm), InvalidArgument, "optim::clip_grad_norm",
                  "max_norm must be positive and finite, got ", max_norm);
  double sum = 0;
  for (const auto& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    for (T g : p.grad().to_vector()) sum += static_cast<double>(g) * static_cast<double>(g);
  }
  const double norm = std::sqrt(sum);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0)
    for (const auto& p : params)
      if (p.defined() && p.grad().defined()) p.grad() = ops::scale(p.grad(), coef);
  return norm;
}

}  // namespace cutrain::inline CUTRAIN_ABI::optim
