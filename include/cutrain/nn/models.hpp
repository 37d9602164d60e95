// Ready-made models of the examples and benchmarks, so that they all train the same network.
#pragma once

#include <cstdint>

#include "cutrain/nn/batch_norm.hpp"
#include "cutrain/nn/conv2d.hpp"
#include "cutrain/nn/layers.hpp"
#include "cutrain/nn/linear.hpp"
#include "cutrain/nn/sequential.hpp"

namespace cutrain::nn {

// The reference CNN for 28x28 single-channel images (Fashion-MNIST): conv3x3 1->32, BN, ReLU,
// maxpool, conv3x3 32->64, BN, ReLU, maxpool, linear 3136->256, ReLU, linear 256->10. width
// scales the channel and hidden counts (width 2: 64, 128, 512). The convolutions keep their
// bias, as in the PyTorch model it is compared with.
template <class T>
Sequential<T> fashion_mnist_cnn(Rng& init, std::int64_t width = 1) {
  CUTRAIN_REQUIRE(width >= 1 && width <= 16, InvalidArgument, "nn::fashion_mnist_cnn", "width must be in [1, 16], got ",
                  width);
  const std::int64_t c1 = 32 * width, c2 = 64 * width, hidden = 256 * width;
  return Sequential<T>{Conv2d<T>({.in = 1, .out = c1, .kernel = 3, .padding = 1}, init),
                       BatchNorm2d<T>({.features = c1}),
                       ReLU{},
                       MaxPool2d({.kernel = 2}),
                       Conv2d<T>({.in = c1, .out = c2, .kernel = 3, .padding = 1}, init),
                       BatchNorm2d<T>({.features = c2}),
                       ReLU{},
                       MaxPool2d({.kernel = 2}),
                       Flatten{},
                       Linear<T>({.in = c2 * 7 * 7, .out = hidden}, init),
                       ReLU{},
                       Linear<T>({.in = hidden, .out = 10}, init)};
}

}  // namespace cutrain::nn
