// randomize(net, rng): random weights, batch-norm affine parameters and running statistics
// (variances in [0.5, 2]) for tests of a trained model's transformations (batch-norm folding);
// small_resnet(rng, blocks): a randomized ResNet of a stem and one or two residual blocks;
// norm_mlp, norm_cnn and token_transformer: models of the engine's other steps.
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
#include "cutrain/nn/transformer.hpp"

namespace cutrain::test {

// Any f64 module with visit_params and visit_buffers (a Sequential, a GPT): parameters uniform in
// [-scale, scale].
template <class Module>
void randomize(Module& net, Rng& rng, double scale = 0.5) {
  net.visit_params("", [&](const std::string&, autograd::Var<double>& p) {
    p.value().copy_from(Tensor<double>::uniform(p.value().shape(), rng, -scale, scale));
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

// Transformer modules (engine steps in deploy/): a causal pre-norm block of 4 heads, a
// non-causal one of 2 heads with an MLP of 1.5 dim, a non-causal MultiheadAttention of 4 heads
// (with dropout, which inference removes), a layer norm, flatten and Linear(seq · dim, 5);
// randomized. Input tokens [N, seq, dim]; dim a multiple of 4.
inline nn::Sequential<double> token_transformer(Rng& rng, std::int64_t seq, std::int64_t dim = 16) {
  nn::Sequential<double> net{
      nn::TransformerBlock<double>({.dim = dim, .heads = 4, .seed = 1}),
      nn::TransformerBlock<double>({.dim = dim, .heads = 2, .hidden = dim * 3 / 2, .causal = false, .seed = 2}),
      nn::MultiheadAttention<double>({.dim = dim, .heads = 4, .causal = false, .dropout = 0.1, .seed = 3}),
      nn::LayerNorm<double>({.shape = {dim}}),
      nn::Flatten{},
      nn::Linear<double>({.in = seq * dim, .out = 5}, rng)};
  randomize(net, rng);
  return net;
}

}  // namespace cutrain::test
