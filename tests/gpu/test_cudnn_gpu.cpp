// The ops on cuDNN's graph API against the CPU backend in f64, in f32, bf16 and f16, NCHW and
// NHWC: conv2d forward with and without bias, backward data and backward filter (the bias
// gradient is not on the GPU yet); conv + bias + activation fused; activations forward and
// backward. One translation unit, since each one that includes cudnn-frontend costs a minute.
#include "parity.hpp"

#include "cutrain/cuda/cudnn/conv.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/conv2d.hpp"

using namespace cutrain;
using namespace cutrain::test;

namespace {

struct Case {
  const char* name;
  Shape x, w;
  Conv2dParams p;
};

// ResNet-style layers, odd sizes, stride 2, asymmetric padding, dilation, groups, depthwise,
// 1x1, batch 1.
const Case cases[] = {
    {"resnet_3x3_64", {8, 64, 16, 16}, {64, 64, 3, 3}, Conv2dParams::make(1, 1)},
    {"resnet_3x3_s2", {4, 32, 15, 15}, {64, 32, 3, 3}, Conv2dParams::make(2, 1)},
    {"resnet_1x1_s2", {4, 64, 16, 16}, {128, 64, 1, 1}, Conv2dParams::make(2, 0)},
    {"odd_asym_pad", {3, 6, 7, 9}, {10, 6, 3, 3},
     {.pad_top = 1, .pad_bottom = 0, .pad_left = 2, .pad_right = 1}},
    {"dilation_2", {2, 8, 12, 12}, {8, 8, 3, 3}, Conv2dParams::make(1, 2, 2)},
    {"groups_2", {2, 8, 10, 10}, {16, 4, 3, 3}, Conv2dParams::make(1, 1, 1, 2)},
    {"depthwise", {2, 16, 9, 9}, {16, 1, 3, 3}, Conv2dParams::make(1, 1, 1, 16)},
    {"batch_1_5x5", {1, 4, 11, 13}, {8, 4, 5, 5}, Conv2dParams::make(1, 2)},
    {"fmnist_conv1", {16, 1, 28, 28}, {32, 1, 3, 3}, Conv2dParams::make(1, 1)},
};

template <class T>
void run_case(const Case& c, Layout layout) {
  const std::string tag = cutrain::detail::cat(c.name, " ", dtype_of<T>, " ", layout);
  Rng rng(std::hash<std::string>{}(tag));
  auto [x, xr] = random_pair<T>(c.x, rng, layout);
  auto [w, wr] = random_pair<T>(c.w, rng, layout);
  auto [b, br] = random_pair<T>({c.w[0]}, rng, layout);
  const Shape ys = conv2d_output_shape(c.x, c.w, c.p);
  auto [dy, dyr] = random_pair<T>(ys, rng, layout);

  try {
    auto y = poisoned<T>(ys, layout);
    cuda::cudnn::conv2d_forward(x, w, Tensor<T>{}, c.p, y);
    check_close(tag + " fprop", y, ops::conv2d_forward(xr, wr, c.p));

    auto yb = poisoned<T>(ys, layout);
    cuda::cudnn::conv2d_forward(x, w, b, c.p, yb);
    check_close(tag + " fprop+bias", yb, ops::conv2d_forward(xr, wr, br, c.p));

    auto dx = poisoned<T>(c.x, layout);
    cuda::cudnn::conv2d_backward_data(dy, w, c.p, dx);
    check_close(tag + " dgrad", dx, ops::conv2d_backward_data(dyr, wr, c.x, c.p));

    auto dw = poisoned<T>(c.w, layout);
    cuda::cudnn::conv2d_backward_filter(dy, x, c.p, dw);
    check_close(tag + " wgrad", dw, ops::conv2d_backward_filter(dyr, xr, c.w, c.p));

    cuda::synchronize();
    std::printf("conv2d %-32s ok\n", tag.c_str());
  } catch (const CudnnError& e) {
    // cuDNN offers no engine for some combinations; the message must say which.
    std::printf("conv2d %-32s UNSUPPORTED by cuDNN: %s\n", tag.c_str(), e.what());
    CHECK(std::string(e.what()).find("no cuDNN engine") != std::string::npos);
    const bool exotic = c.p.groups > 1 || c.p.dilation_h > 1 || std::string(c.name) == "odd_asym_pad";
    CHECK(exotic);  // plain convolutions must always run
  }
}

}  // namespace

TEST_CASE("gpu conv2d f32 (TF32 off) matches the CPU backend") {
  for (const auto& c : cases)
    for (Layout l : {Layout::nchw, Layout::nhwc}) run_case<float>(c, l);
}

TEST_CASE("gpu conv2d bf16 matches the CPU backend") {
  for (const auto& c : cases)
    for (Layout l : {Layout::nchw, Layout::nhwc}) run_case<cutrain::bfloat16>(c, l);
}

TEST_CASE("gpu conv2d f16 matches the CPU backend") {
  for (const auto& c : cases)
    for (Layout l : {Layout::nchw, Layout::nhwc}) run_case<cutrain::half>(c, l);
}

TEST_CASE("gpu conv2d through ops:: dispatches on the device") {
  Rng rng(5);
  auto [x, xr] = random_pair<float>({2, 3, 8, 8}, rng, Layout::nhwc);
  auto [w, wr] = random_pair<float>({4, 3, 3, 3}, rng, Layout::nhwc);
  const auto p = Conv2dParams::make(1, 1);
  auto y = ops::conv2d_forward(x, w, p);
  CHECK(y.device() == Device::cuda(0));
  CHECK(y.layout() == Layout::nhwc);
  check_close("ops::conv2d_forward", y, ops::conv2d_forward(xr, wr, p));
}

namespace {

const Activation all_kinds[] = {Activation::identity, Activation::relu,     Activation::leaky_relu,
                                Activation::elu,      Activation::sigmoid,  Activation::tanh,
                                Activation::gelu_erf, Activation::gelu_tanh, Activation::silu};

template <class T>
void run_activations(Layout layout) {
  for (Activation k : all_kinds) {
    const ActivationParams a{.kind = k, .alpha = k == Activation::elu ? 1.0 : 0.1};
    const std::string tag = cutrain::detail::cat("activation ", k, " ", dtype_of<T>, " ", layout);
    Rng rng(std::hash<std::string>{}(tag));
    auto [x, xr] = random_pair<T>({4, 24, 9, 11}, rng, layout);
    auto [dy, dyr] = random_pair<T>({4, 24, 9, 11}, rng, layout);
    auto y = poisoned<T>(x.shape(), layout);
    cuda::cudnn::activation_forward(x, a, y);
    check_close(tag + " fwd", y, ops::activation_forward(xr, a));
    auto dx = poisoned<T>(x.shape(), layout);
    cuda::cudnn::activation_backward(x, dy, a, dx);
    check_close(tag + " bwd", dx, ops::activation_backward(xr, dyr, a));
    std::printf("%-40s ok\n", tag.c_str());
  }
}

template <class T>
void run_fused(Layout layout) {
  for (Activation k : {Activation::relu, Activation::gelu_erf, Activation::silu}) {
    for (int ci : {0, 8}) {  // resnet_3x3_64 and fmnist_conv1
      const Case& c = cases[ci];
      const std::string tag = cutrain::detail::cat("conv+bias+", k, " ", c.name, " ", dtype_of<T>, " ", layout);
      Rng rng(std::hash<std::string>{}(tag));
      auto [x, xr] = random_pair<T>(c.x, rng, layout);
      auto [w, wr] = random_pair<T>(c.w, rng, layout);
      auto [b, br] = random_pair<T>({c.w[0]}, rng, layout);
      auto y = poisoned<T>(conv2d_output_shape(c.x, c.w, c.p), layout);
      cuda::cudnn::conv2d_forward(x, w, b, c.p, y, {.kind = k});
      check_close(tag, y, ops::conv2d_bias_activation_forward(xr, wr, br, {.kind = k}, c.p));
      std::printf("%-40s ok\n", tag.c_str());
    }
  }
}

}  // namespace

TEST_CASE("gpu activations forward and backward match the CPU backend") {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    run_activations<float>(l);
    run_activations<cutrain::bfloat16>(l);
    run_activations<cutrain::half>(l);
  }
}

TEST_CASE("gpu conv + bias + activation fused in one graph matches the CPU backend") {
  for (Layout l : {Layout::nchw, Layout::nhwc}) {
    run_fused<float>(l);
    run_fused<cutrain::bfloat16>(l);
    run_fused<cutrain::half>(l);
  }
  Rng rng(9);  // through ops::, on the device
  auto [x, xr] = random_pair<float>({2, 3, 8, 8}, rng, Layout::nhwc);
  auto [w, wr] = random_pair<float>({4, 3, 3, 3}, rng, Layout::nhwc);
  auto [b, br] = random_pair<float>({4}, rng, Layout::nhwc);
  const auto p = Conv2dParams::make(1, 1);
  auto y = ops::conv2d_bias_activation_forward(x, w, b, {.kind = Activation::relu}, p);
  CHECK(y.device() == Device::cuda(0));
  check_close("ops::conv2d_bias_activation_forward", y,
              ops::conv2d_bias_activation_forward(xr, wr, br, {.kind = Activation::relu}, p));
}
