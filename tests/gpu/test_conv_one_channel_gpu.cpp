// A one-channel input (NCHW and NHWC are the same memory, and layout() says nchw) convolved with
// channels-last weights: the GPU output is channels-last, as the weights ask, and equals the CPU
// backend's; the filter gradient is laid out as the weights are; a channels-last Fashion-MNIST CNN
// trains one step on the GPU as on the CPU.
#include "parity.hpp"

#include "cutrain/cutrain.hpp"
#include "cutrain/nn.hpp"

namespace cutrain_test_conv_one_channel_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

TEST_CASE("gpu conv2d: a one-channel input follows channels-last weights") {
  Rng rng(21);
  const Conv2dParams p{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  auto [x, xr] = random_pair<float>(Shape{4, 1, 10, 10}, rng, Layout::nchw);
  auto [w, wr] = random_pair<float>(Shape{8, 1, 3, 3}, rng, Layout::nhwc);
  auto [b, br] = random_pair<float>(Shape{8}, rng, Layout::row_major);
  REQUIRE(is_channels_last(w.shape(), w.strides()));
  REQUIRE_FALSE(is_channels_last(x.shape(), x.strides()));

  auto y = ops::conv2d_forward(x, w, b, p);
  CHECK(y.layout() == Layout::nhwc);
  check_close("y", y, ops::conv2d_forward(xr, wr, br, p));

  const ActivationParams relu{.kind = Activation::relu};
  auto ya = ops::conv2d_bias_activation_forward(x, w, b, relu, p);
  CHECK(ya.layout() == Layout::nhwc);
  check_close("relu(y)", ya, ops::conv2d_bias_activation_forward(xr, wr, br, relu, p));

  auto [dy, dyr] = random_pair<float>(y.shape(), rng, Layout::nhwc);
  auto dw = ops::conv2d_backward_filter(dy, x, w.shape(), p);
  CHECK(dw.strides() == w.strides());
  check_close("dw", dw, ops::conv2d_backward_filter(dyr, xr, wr.shape(), p), 1e-4);

  // NCHW weights: the output stays NCHW, as before
  auto wc = w.contiguous(Layout::nchw);
  REQUIRE_FALSE(is_channels_last(wc.shape(), wc.strides()));
  CHECK(ops::conv2d_forward(x, wc, b, p).layout() == Layout::nchw);
}

TEST_CASE("gpu channels-last Fashion-MNIST CNN: one training step matches the CPU") {
  Rng init_gpu(3), init_cpu(3), data(4);
  auto gpu = nn::fashion_mnist_cnn<float>(init_gpu);
  auto cpu = nn::fashion_mnist_cnn<float>(init_cpu);
  gpu.to(Device::cuda(0)).to(Layout::nhwc);
  auto xt = Tensor<float>::uniform(Shape{16, 1, 28, 28}, data, -1, 1);
  Tensor<std::int32_t> yt(Shape{16});
  for (std::int64_t i = 0; i < 16; ++i) yt.data()[i] = static_cast<std::int32_t>(data.below(10));
  auto lg = nn::cross_entropy(gpu(autograd::Var<float>(xt.to(Device::cuda(0)))), yt.to(Device::cuda(0)));
  auto lc = nn::cross_entropy(cpu(autograd::Var<float>(xt.clone())), yt.clone());
  check_close("loss", lg.value(), cast<double>(lc.value()), 1e-4);
  lg.backward();
  lc.backward();
  auto pg = gpu.named_parameters(), pc = cpu.named_parameters();
  REQUIRE(pg.size() == pc.size());
  for (std::size_t i = 0; i < pg.size(); ++i)
    check_close("d" + pg[i].first, pg[i].second.grad(), cast<double>(pc[i].second.grad()), 1e-3);
  CHECK(is_channels_last(pg[0].second.grad().shape(), pg[0].second.grad().strides()));
}

}  // namespace cutrain_test_conv_one_channel_gpu
