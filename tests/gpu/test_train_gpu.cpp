// Whole training steps on the GPU against the same steps on the CPU: the reference CNN of the
// Fashion-MNIST example (scaled down), the same initial weights and the same random batches,
// AdamW and SGD-momentum. Losses and final weights must agree to f32 tolerance (looser than one
// op: a few steps compound the rounding differences of cuDNN's and Eigen's summation orders).
// The conv before batch norm has no bias: its gradient would be rounding noise around zero, and
// Adam turns noise of either sign into a full step of +-lr, on the CPU and the GPU alike.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/cutrain.hpp"
#include "cutrain/nn.hpp"

using namespace cutrain;

namespace {

nn::Sequential<float> small_cnn(std::uint64_t seed) {
  Rng init(seed);
  return nn::Sequential<float>{nn::Conv2d<float>({.in = 1, .out = 8, .kernel = 3, .padding = 1, .bias = false}, init),
                               nn::BatchNorm2d<float>({.features = 8}),
                               nn::ReLU{},
                               nn::MaxPool2d({.kernel = 2}),
                               nn::Conv2d<float>({.in = 8, .out = 16, .kernel = 3, .padding = 1}, init),
                               nn::ReLU{},  // conv + bias + relu: the fused op on the GPU
                               nn::MaxPool2d({.kernel = 2}),
                               nn::Flatten{},
                               nn::Linear<float>({.in = 16 * 3 * 3, .out = 32}, init),
                               nn::ReLU{},  // linear + relu: cuBLASLt's epilogue
                               nn::Linear<float>({.in = 32, .out = 10}, init)};
}

struct Run {
  std::vector<double> losses;
  nn::StateDict<float> state;
};

// steps training steps on dev, on batches drawn from a fixed seed.
template <class MakeOpt>
Run train(Device dev, int steps, MakeOpt make_opt) {
  auto net = small_cnn(7);
  net.to(dev);
  auto opt = make_opt(net.parameters());
  Rng data(11);
  Run r;
  for (int s = 0; s < steps; ++s) {
    auto x = Tensor<float>::uniform(Shape{16, 1, 12, 12}, data, -1.0, 1.0, {.layout = Layout::nchw});
    Tensor<std::int32_t> y(Shape{16});
    for (std::int64_t i = 0; i < 16; ++i) y.data()[i] = static_cast<std::int32_t>(data.below(10));
    auto loss = nn::cross_entropy(net(x.to(dev)), y.to(dev));
    opt.zero_grad();
    loss.backward();
    opt.step();
    r.losses.push_back(loss.item());
  }
  r.state = net.state_dict();
  return r;
}

template <class MakeOpt>
void compare(const std::string& what, MakeOpt make_opt) {
  const Run cpu = train(Device::cpu(), 5, make_opt);
  const Run gpu = train(Device::cuda(0), 5, make_opt);
  for (std::size_t s = 0; s < cpu.losses.size(); ++s) {
    INFO(what << " step " << s << ": cpu loss " << cpu.losses[s] << ", gpu loss " << gpu.losses[s]);
    CHECK(std::isfinite(gpu.losses[s]));
    CHECK(std::abs(gpu.losses[s] - cpu.losses[s]) <= 1e-3 * std::max(1.0, std::abs(cpu.losses[s])));
  }
  REQUIRE(cpu.state.size() == gpu.state.size());
  for (const auto& [name, c] : cpu.state) {
    const auto g = gpu.state.at(name).contiguous(c.layout()).to_vector();
    const auto cv = c.to_vector();
    double max_err = 0, max_ref = 1;
    for (std::size_t i = 0; i < cv.size(); ++i) {
      max_err = std::max(max_err, std::abs(static_cast<double>(g[i]) - cv[i]));
      max_ref = std::max(max_ref, static_cast<double>(std::abs(cv[i])));
    }
    INFO(what << ": " << name << " max abs err " << max_err);
    CHECK(max_err / max_ref <= 2e-3);
  }
}

}  // namespace

TEST_CASE("training steps on the GPU match the CPU: AdamW", "[gpu][train]") {
  compare("adamw", [](std::vector<autograd::Var<float>> p) {
    return optim::AdamW<float>(std::move(p), {.lr = 1e-3, .weight_decay = 1e-2});
  });
}

TEST_CASE("training steps on the GPU match the CPU: SGD with Nesterov momentum", "[gpu][train]") {
  compare("sgd", [](std::vector<autograd::Var<float>> p) {
    return optim::SGD<float>(std::move(p), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true});
  });
}
