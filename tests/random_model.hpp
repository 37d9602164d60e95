// randomize(net, rng): random weights, batch-norm affine parameters and running statistics
// (variances in [0.5, 2]) for tests of a trained model's transformations (batch-norm folding).
#pragma once

#include <string>

#include "cutrain/nn/sequential.hpp"

namespace cutrain::test {

inline void randomize(nn::Sequential<double>& net, Rng& rng) {
  net.visit_params("", [&](const std::string&, autograd::Var<double>& p) {
    p.value().copy_from(Tensor<double>::uniform(p.value().shape(), rng, -0.5, 0.5));
  });
  net.visit_buffers("", [&](const std::string& name, Tensor<double>& t) {
    const bool var = name.find("running_var") != std::string::npos;
    t.copy_from(Tensor<double>::uniform(t.shape(), rng, var ? 0.5 : -0.5, var ? 2.0 : 0.5));
  });
}

}  // namespace cutrain::test
