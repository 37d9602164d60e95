// Ready-made models of the examples and benchmarks, so that they all train the same network.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string>

#include "cutrain/nn/batch_norm.hpp"
#include "cutrain/nn/conv2d.hpp"
#include "cutrain/nn/layers.hpp"
#include "cutrain/nn/linear.hpp"
#include "cutrain/nn/name_map.hpp"
#include "cutrain/nn/residual.hpp"
#include "cutrain/nn/sequential.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

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

// ResNet-18 for 32x32 images (CIFAR): a 3x3 stem conv in->64 (no bias), BN, ReLU, no max pool;
// four stages of two basic blocks (64, 128, 256, 512 channels; stride 2 into stages 2-4, with a
// 1x1 conv + BN shortcut there); global average pool, flatten, linear 512->classes. The model of
// bench/torch_resnet_first_step.py.
template <class T>
Sequential<T> resnet18_cifar(Rng& init, std::int64_t classes = 10, std::int64_t in_channels = 3) {
  CUTRAIN_REQUIRE(classes >= 1 && in_channels >= 1, InvalidArgument, "nn::resnet18_cifar",
                  "classes and in_channels must be >= 1, got ", classes, " and ", in_channels);
  Sequential<T> net{Conv2d<T>({.in = in_channels, .out = 64, .kernel = 3, .padding = 1, .bias = false}, init),
                    BatchNorm2d<T>({.features = 64}), ReLU{}};
  std::int64_t in = 64;
  std::uint64_t seed = init.next_u64();
  for (const std::int64_t out : {64, 128, 256, 512}) {
    net.push_back(ResidualBlock<T>({.in = in, .out = out, .stride = out == 64 ? 1 : 2, .seed = seed += 3}));
    net.push_back(ResidualBlock<T>({.in = out, .out = out, .seed = seed += 3}));
    in = out;
  }
  net.push_back(AdaptiveAvgPool2d(1));
  net.push_back(Flatten{});
  net.push_back(Linear<T>({.in = 512, .out = classes}, init));
  return net;
}

// resnet18_cifar's state_dict names against PyTorch's for the same network built torchvision's
// way (torchvision.models.resnet18 with conv1 a 3x3 stride-1 conv and maxpool nn.Identity(), or
// bench/torch_resnet18_weights.py): conv1, bn1, layer{1-4}.{0,1}.{conv1,bn1,conv2,bn2},
// layer{2-4}.0.downsample.{0,1}, fc. Tensors need no reordering: cutrain's conv weights are
// logically [out, in, kh, kw] and Linear's [out, in], as PyTorch's are (an NHWC module is
// written in C order and loaded into whatever layout it has). BatchNorm's num_batches_tracked is
// skipped: cutrain's momentum is fixed, so the count is never used.
inline NameMap resnet18_cifar_torch_names() {
  NameMap m;
  m.skip_suffix(".num_batches_tracked");
  const auto conv = [&](const std::string& torch, const std::string& ours) { m.add(torch + ".weight", ours + ".weight"); };
  const auto bn = [&](const std::string& torch, const std::string& ours) {
    for (const char* p : {".weight", ".bias", ".running_mean", ".running_var"}) m.add(torch + p, ours + p);
  };
  conv("conv1", "0");
  bn("bn1", "1");
  int index = 3;  // after the stem's conv, bn and relu
  for (int stage = 1; stage <= 4; ++stage)
    for (int block = 0; block < 2; ++block, ++index) {
      const std::string t = "layer" + std::to_string(stage) + "." + std::to_string(block), o = std::to_string(index);
      conv(t + ".conv1", o + ".conv1");
      bn(t + ".bn1", o + ".bn1");
      conv(t + ".conv2", o + ".conv2");
      bn(t + ".bn2", o + ".bn2");
      if (stage > 1 && block == 0) {
        conv(t + ".downsample.0", o + ".shortcut.conv");
        bn(t + ".downsample.1", o + ".shortcut.bn");
      }
    }
  const std::string fc = std::to_string(index + 2);  // after the pool and the flatten
  m.add("fc.weight", fc + ".weight");
  m.add("fc.bias", fc + ".bias");
  return m;
}

}  // namespace cutrain::inline CUTRAIN_ABI::nn
