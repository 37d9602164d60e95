// deploy::compile on the GPU: a small ResNet (residual blocks, random batch-norm statistics) and
// the reference CNN compiled in f32 (row-major) and bf16 (NHWC) against the same model's engine
// on the CPU in f64 from the same weights; the fused residual convolutions run as cuDNN graphs.
#include "parity.hpp"

#include <string>

#include "cutrain/autograd/engine.hpp"
#include "cutrain/deploy/engine.hpp"
#include "cutrain/nn.hpp"
#include "random_model.hpp"

namespace cutrain_test_deploy_engine_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

template <class E>
void check_engine(const std::string& what, const nn::Sequential<double>& net, const Shape& in, Layout layout, Rng& rng,
                  double tol) {
  const auto cpu = deploy::compile<double>(net, in);
  const auto gpu = deploy::compile<E>(net, in, {.device = Device::cuda(0), .layout = layout});
  INFO(gpu.report());
  auto [x, xr] = random_pair<E>(in, rng, Layout::row_major);
  const auto y = gpu(x);
  CHECK(y.device() == Device::cuda(0));
  check_close(what, y, cpu(xr), tol);
  // A second call reuses every built graph and gives the same values.
  check_close(what + " again", gpu(x), cpu(xr), tol);
}

}  // namespace

TEST_CASE("gpu deploy engine: compiled models match the CPU engine in f64", "[gpu][deploy]") {
  Rng rng(41);
  nn::Sequential<double> resnet{nn::Conv2d<double>({.in = 3, .out = 32, .kernel = 3, .padding = 1, .bias = false}, rng),
                                nn::BatchNorm2d<double>({.features = 32}),
                                nn::ReLU{},
                                nn::ResidualBlock<double>({.in = 32}),
                                nn::ResidualBlock<double>({.in = 32, .out = 64, .stride = 2}),
                                nn::AdaptiveAvgPool2d{},
                                nn::Flatten{},
                                nn::Linear<double>({.in = 64, .out = 10}, rng)};
  randomize(resnet, rng);
  check_engine<float>("resnet f32", resnet, Shape{8, 3, 16, 16}, Layout::row_major, rng, 1e-3);
  check_engine<bfloat16>("resnet bf16 nhwc", resnet, Shape{8, 3, 16, 16}, Layout::nhwc, rng, 5e-2);
  auto cnn = nn::fashion_mnist_cnn<double>(rng);
  randomize(cnn, rng);
  check_engine<float>("cnn f32", cnn, Shape{16, 1, 28, 28}, Layout::row_major, rng, 1e-3);
  check_engine<bfloat16>("cnn bf16 nhwc", cnn, Shape{16, 1, 28, 28}, Layout::nhwc, rng, 5e-2);
}

}  // namespace cutrain_test_deploy_engine_gpu
