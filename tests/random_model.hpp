// randomize(net, rng): random weights, batch-norm affine parameters and running statistics
// (variances in [0.5, 2]) for tests of a trained model's transformations (batch-norm folding);
// small_resnet(rng, blocks): a randomized ResNet of a stem and one or two residual blocks.
#pragma once

#include <string>

#include "cutrain/nn/batch_norm.hpp"
#include "cutrain/nn/conv2d.hpp"
#include "cutrain/nn/layer_norm.hpp"
#include "cutrain/nn/layers.hpp"
#include "cutrain/nn/linear.hpp"
#include "cutrain/nn/residual.hpp"
#include "cutrain/nn/rms_norm.hpp"
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

// Norms and softmax (engine steps in deploy/): a 2-d model (layer norm and RMS norm over
// features, a softmax head) and a 4-d one (layer norm over [C, H, W], RMS norm over W, softmax
// over channels); randomized. Inputs [N, 12] and [N, 3, 6, 6].
inline nn::Sequential<double> norm_mlp(Rng& rng) {
  nn::Sequential<double> net{nn::Linear<double>({.in = 12, .out = 16}, rng), nn::LayerNorm<double>({.shape = {16}}),
                             nn::ReLU{},
                             nn::Linear<double>({.in = 16, .out = 8}, rng),
                             nn::RMSNorm<double>({.shape = {8}, .eps = 1e-6}),
                             nn::Softmax{}};
  randomize(net, rng);
  return net;
}
inline nn::Sequential<double> norm_cnn(Rng& rng) {
  nn::Sequential<double> net{nn::Conv2d<double>({.in = 3, .out = 4, .kernel = 3, .padding = 1}, rng),
                             nn::LayerNorm<double>({.shape = {4, 6, 6}}),
                             nn::ReLU{},
                             nn::Conv2d<double>({.in = 4, .out = 5, .kernel = 3, .padding = 1}, rng),
                             nn::RMSNorm<double>({.shape = {6}}),
                             nn::Softmax{.axis = 1},
                             nn::Flatten{},
                             nn::Linear<double>({.in = 5 * 36, .out = 3}, rng)};
  randomize(net, rng);
  return net;
}

}  // namespace cutrain::test
