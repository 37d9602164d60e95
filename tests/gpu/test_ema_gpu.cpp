// optim::EMA on the GPU against the CPU: the same model, moved to the same random values before
// each update, must average alike (f32 kernel against the host's double arithmetic), eagerly and
// with the update replayed from a CUDA graph; warm-up refuses capture.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "cutrain/cutrain.hpp"
#include "cutrain/nn.hpp"
#include "cutrain/optim/ema.hpp"

namespace cutrain_test_ema_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;

namespace {

nn::Sequential<float> net_for_ema() {
  Rng init(5);
  return nn::Sequential<float>{nn::Conv2d<float>({.in = 3, .out = 16, .kernel = 3, .padding = 1}, init),
                               nn::BatchNorm2d<float>({.features = 16}), nn::ReLU{}, nn::Flatten{},
                               nn::Linear<float>({.in = 16 * 5 * 5, .out = 7}, init)};
}

// Sets every parameter and buffer of net to values drawn from rng (the same draws for the same
// seed, whatever the device).
void draw(nn::Sequential<float>& net, Rng& rng) {
  auto set = [&](Tensor<float>& t) {
    t.copy_from(Tensor<float>::uniform(t.shape(), rng, -1.0, 1.0, {.layout = t.layout()}).to(t.device()));
  };
  net.visit_params("", [&](const std::string&, autograd::Var<float>& p) { set(p.value()); });
  net.visit_buffers("", [&](const std::string&, Tensor<float>& b) { set(b); });
}

void compare(nn::Sequential<float>& cpu, nn::Sequential<float>& gpu, const std::string& what) {
  const auto c = cpu.state_dict(), g = gpu.state_dict();
  for (const auto& [name, t] : c) {
    const auto a = t.to_vector(), b = g.at(name).to_vector();
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    INFO(what << ": " << name << " largest difference " << worst);
    CHECK(worst <= 1e-5);
  }
}

}  // namespace

TEST_CASE("optim::EMA on the GPU matches the CPU, eagerly and replayed from a CUDA graph", "[gpu][train][ema]") {
  for (const bool graphed : {false, true}) {
    CAPTURE(graphed);
    auto cpu = net_for_ema(), gpu = net_for_ema();
    gpu.to(Device::cuda(0));
    optim::EMA<float> ema_cpu(cpu, {.decay = 0.8}), ema_gpu(gpu, {.decay = 0.8});
    cuda::Stream stream(0);
    const cuda::StreamGuard on(stream.get());
    cuda::CudaGraph graph;
    Rng rc(21), rg(21);
    for (int t = 0; t < 4; ++t) {
      draw(cpu, rc);
      draw(gpu, rg);
      ema_cpu.update();
      if (!graphed || t == 0) ema_gpu.update();  // (the first update eagerly, then the captured one)
      else graph.replay();
      if (graphed && t == 0) graph.capture([&] { ema_gpu.update(); });
    }
    stream.synchronize();
    const optim::EMA<float>::Swapped a(ema_cpu), b(ema_gpu);
    compare(cpu, gpu, graphed ? "graphed" : "eager");
  }
  auto gpu = net_for_ema();
  gpu.to(Device::cuda(0));
  optim::EMA<float> warm(gpu, {.decay = 0.99, .warmup = true});
  cuda::Stream stream(0);
  const cuda::StreamGuard on(stream.get());
  cuda::CudaGraph graph;
  CHECK_THROWS_WITH(graph.capture([&] { warm.update(); }), Catch::Contains("warm-up's decay"));
}

}  // namespace cutrain_test_ema_gpu
