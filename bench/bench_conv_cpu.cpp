// CPU conv2d forward, backward data and backward filter on a few shapes, in GFLOP/s.
// A baseline for the CPU backend (the oracle and the no-GPU fallback), not a race.
//   build/bench/bench_conv_cpu --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cutrain/cpu.hpp>

namespace {

using namespace cutrain;

struct ConvCase {
  const char* name;
  std::int64_t n, c, h, w, k, r;
  int stride, pad;
};

// Fashion-MNIST CNN layers (batch 128) and a ResNet-style 3x3 layer.
const ConvCase cases[] = {
    {"fmnist_conv1_1x28x28_32", 128, 1, 28, 28, 32, 3, 1, 1},
    {"fmnist_conv2_32x14x14_64", 128, 32, 14, 14, 64, 3, 1, 1},
    {"resnet_64x32x32_64", 16, 64, 32, 32, 64, 3, 1, 1},
    {"resnet_64x32x32_128_s2", 16, 64, 32, 32, 128, 3, 2, 1},
};

enum class Dir { fwd, dgrad, wgrad };

void run(benchmark::State& state, const ConvCase& cc, Dir dir, Layout layout) {
  Rng rng(7);
  const auto p = Conv2dParams::make(cc.stride, cc.pad);
  auto x = Tensor<float>::uniform({cc.n, cc.c, cc.h, cc.w}, rng, -1, 1, {.layout = layout});
  auto w = Tensor<float>::uniform({cc.k, cc.c, cc.r, cc.r}, rng, -1, 1, {.layout = layout});
  const Shape ys = conv2d_output_shape(x.shape(), w.shape(), p);
  auto dy = Tensor<float>::uniform(ys, rng, -1, 1, {.layout = layout});
  for (auto _ : state) {
    switch (dir) {
      case Dir::fwd: benchmark::DoNotOptimize(ops::conv2d_forward(x, w, p).data()); break;
      case Dir::dgrad: benchmark::DoNotOptimize(ops::conv2d_backward_data(dy, w, x.shape(), p).data()); break;
      case Dir::wgrad: benchmark::DoNotOptimize(ops::conv2d_backward_filter(dy, x, w.shape(), p).data()); break;
    }
  }
  const double flops = 2.0 * static_cast<double>(ys.numel()) * static_cast<double>(cc.c * cc.r * cc.r);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

const int registered = [] {
  for (const auto& cc : cases)
    for (auto [dir, dname] : {std::pair{Dir::fwd, "fwd"}, {Dir::dgrad, "dgrad"}, {Dir::wgrad, "wgrad"}})
      for (auto [layout, lname] : {std::pair{Layout::nchw, "nchw"}, {Layout::nhwc, "nhwc"}})
        benchmark::RegisterBenchmark((std::string("conv2d_") + dname + "/" + lname + "/" + cc.name).c_str(),
                                     [&cc, dir = dir, layout = layout](benchmark::State& s) { run(s, cc, dir, layout); })
            ->Unit(benchmark::kMillisecond);
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
