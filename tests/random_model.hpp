// randomize(net, rng): random weights, batch-norm affine parameters and running statistics
// (variances in [0.5, 2]) for tests of a trained model's transformations (batch-norm folding);
// small_resnet(rng, blocks): a randomized ResNet of a stem and one or two residual blocks.
#pragma once

#include <string>

#include "cutrain/nn/batch_norm.hpp"
#include "cutrain/nn/conv2d.hpp"
#include "cutrain/nn/layers.hpp"
#include "cutrain/nn/linear.hpp"
#include "cutrain/nn/residual.hpp"
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

// A 3x3 stem (32 channels, batch norm, relu), with blocks == 2 a residual block of 32, then a
// strided block to 64 (its shortcut a 1x1 conv), global average pool, flatten, Linear(64, 10);
// randomized. Input [N, 3, H, W].
inline nn::Sequential<double> small_resnet(Rng& rng, int blocks = 2) {
  nn::Sequential<double> net{nn::Conv2d<double>({.in = 3, .out = 32, .kernel = 3, .padding = 1, .bias = false}, rng),
                             nn::BatchNorm2d<double>({.features = 32}), nn::ReLU{}};
  if (blocks == 2) net.push_back(nn::ResidualBlock<double>({.in = 32}));
  net.push_back(nn::ResidualBlock<double>({.in = 32, .out = 64, .stride = 2}));
  net.push_back(nn::AdaptiveAvgPool2d{});
  net.push_back(nn::Flatten{});
  net.push_back(nn::Linear<double>({.in = 64, .out = 10}, rng));
  randomize(net, rng);
  return net;
}

}  // namespace cutrain::test
