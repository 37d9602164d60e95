// Whole training steps and host overhead on the GPU, against PyTorch (bench/torch_train.py runs
// the same work the same way and prints the ratios):
//  - one training step (forward, loss, zero_grad, backward, AdamW) of the reference Fashion-MNIST
//    CNN (nn::fashion_mnist_cnn), f32, batch 128 and 512, one fixed batch on the device, eager
//    and replayed from a CUDA graph (cuda::CudaGraph); and with mixed precision (nn::autocast:
//    f32 parameters, bf16 compute, eager and graphed; f16 with optim::GradScaler, eager);
//  - one training step of ResNet-18 for CIFAR (nn::resnet18_cifar), bf16 autocast, channels-last,
//    SGD momentum, tuned plans (autotune benchmark mode for these rows), batch 256 and 512, eager
//    and CUDA graph, with its batch norms fused with their ReLU and residual add (the default) and
//    apart (set_fusion(false)): CUDA events around 20 steps, median of 9;
//  - host time per call of a tiny cached op (relu and conv on 1x8x8x8), no synchronization
//    inside the loop: what the dispatch, the graph-cache lookup and the launch cost.
// Timing as in docs/performance.md (method): CUDA events around one step, median of 30 after warm-up.
//   build/bench/bench_train_gpu --benchmark_out=train.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <cutrain/cuda/cudnn/activation.hpp>
#include <cutrain/cutrain.hpp>
#include <cutrain/nn.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace {

using namespace cutrain;

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

void train_step(benchmark::State& state, std::int64_t batch, bool graphed,
                nn::Precision precision = nn::Precision::f32) {
  if (!cuda::available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const Device dev = Device::cuda(0);
  cuda::Stream stream;  // a CUDA graph cannot be captured on the default stream; both modes use this one
  cuda::StreamGuard on(stream.get());
  Rng init(1), data(2);
  auto net = nn::fashion_mnist_cnn<float>(init);
  net.to(dev);
  optim::AdamW<float> opt(net.parameters(), {.lr = 1e-3, .weight_decay = 5e-4});
  auto x = Tensor<float>::uniform(Shape{batch, 1, 28, 28}, data, -1.0, 1.0, {.layout = Layout::nchw}).to(dev);
  Tensor<std::int32_t> y_host(Shape{batch});
  for (std::int64_t i = 0; i < batch; ++i) y_host.data()[i] = static_cast<std::int32_t>(data.below(10));
  auto y = y_host.to(dev);
  optim::GradScaler<float> scaler;
  auto step = [&] {
    auto loss = nn::cross_entropy(nn::autocast(precision, net, x), y);
    opt.zero_grad();
    if (precision == nn::Precision::f16) {
      scaler.backward(loss);
      scaler.step(opt);
    } else {
      loss.backward();
      opt.step();
    }
  };
  for (int i = 0; i < 10; ++i) step();  // builds the graphs, compiles the kernels, fills the caches
  cuda::CudaGraph graph;
  if (graphed) {
    graph.capture(step);
    for (int i = 0; i < 5; ++i) graph.replay();
  }
  cuda::synchronize();
  cuda::Event a, b;
  std::vector<double> ms;
  for (auto _ : state) {
    a.record();
    if (graphed) graph.replay();
    else step();
    b.record();
    b.synchronize();
    const double t = b.elapsed_ms(a);
    ms.push_back(t);
    state.SetIterationTime(t / 1e3);
  }
  state.counters["ms_per_step"] = median(ms);
  state.counters["samples_per_s"] = static_cast<double>(batch) / (median(ms) / 1e3);
}

void resnet_step(benchmark::State& state, std::int64_t batch, bool graphed, bool fused) {
  if (!cuda::available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  const cuda::autotune::ModeGuard tuned(cuda::autotune::Mode::benchmark);  // gpu-check runs the rest heuristic
  const Device dev = Device::cuda(0);
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  Rng init(0), data(1);
  auto net = nn::resnet18_cifar<float>(init);
  net.to(dev).to(Layout::nhwc);
  net.set_fusion(fused);
  optim::SGD<float> opt(net.parameters(), {.lr = 0.1, .momentum = 0.9});
  const auto x = Tensor<float>::randn(Shape{batch, 3, 32, 32}, data, 1.0, {.layout = Layout::nhwc}).to(dev);
  Tensor<std::int32_t> y_host(Shape{batch});
  for (std::int64_t i = 0; i < batch; ++i) y_host.data()[i] = static_cast<std::int32_t>(data.below(10));
  const auto y = y_host.to(dev);
  auto step = [&] {
    auto loss = nn::cross_entropy(nn::autocast(nn::Precision::bf16, net, x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  };
  for (int i = 0; i < 10; ++i) step();  // tunes the plans, compiles the kernels
  cuda::CudaGraph graph;
  if (graphed) {
    graph.capture(step);
    for (int i = 0; i < 5; ++i) graph.replay();
  }
  cuda::synchronize();
  cuda::Event a, b;
  std::vector<double> ms;
  constexpr int steps = 20;
  for (auto _ : state) {
    a.record();
    for (int i = 0; i < steps; ++i) {
      if (graphed) graph.replay();
      else step();
    }
    b.record();
    b.synchronize();
    const double t = b.elapsed_ms(a) / steps;
    ms.push_back(t);
    state.SetIterationTime(t / 1e3);
  }
  state.counters["ms_per_step"] = median(ms);
  state.counters["samples_per_s"] = static_cast<double>(batch) / (median(ms) / 1e3);
}

// Host microseconds per call of op, launched back to back (the GPU runs behind).
template <class F>
void host_overhead(benchmark::State& state, F op) {
  if (!cuda::available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  for (int i = 0; i < 20; ++i) op();
  cuda::synchronize();
  std::vector<double> us;
  constexpr int calls = 200;
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) op();
    const auto t1 = std::chrono::steady_clock::now();
    cuda::synchronize();
    const double per = std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
    us.push_back(per);
    state.SetIterationTime(per / 1e6);
  }
  state.counters["host_us_per_op"] = median(us);
}

void tiny_relu(benchmark::State& state) {
  Rng rng(3);
  auto x = Tensor<float>::uniform(Shape{1, 8, 8, 8}, rng, -1, 1, {.layout = Layout::nchw}).to(Device::cuda(0));
  host_overhead(state, [&] { benchmark::DoNotOptimize(ops::activation_forward(x, {.kind = Activation::relu})); });
}

void tiny_conv(benchmark::State& state) {
  Rng rng(4);
  const Device dev = Device::cuda(0);
  auto x = Tensor<float>::uniform(Shape{1, 8, 8, 8}, rng, -1, 1, {.layout = Layout::nchw}).to(dev);
  auto w = Tensor<float>::uniform(Shape{8, 8, 3, 3}, rng, -1, 1, {.layout = Layout::nchw}).to(dev);
  const Conv2dParams p = Conv2dParams::make(1, 1);
  host_overhead(state, [&] { benchmark::DoNotOptimize(ops::conv2d_forward(x, w, Tensor<float>{}, p)); });
}

// Where the host time of a cuDNN op goes, for cuDNN's relu graph: building its graph key, the plan
// store's lookup, and cuDNN's execute of the built graph (variant pack and launch), each alone.
// tiny_relu (ops::activation_forward) and tiny_scale are ops on NVRTC kernels (no cuDNN).
struct TinyRelu {
  Tensor<float> x, y;
  ActivationParams a{.kind = Activation::relu};
  TinyRelu() {
    Rng rng(3);
    x = Tensor<float>::uniform(Shape{1, 8, 8, 8}, rng, -1, 1, {.layout = Layout::nchw}).to(Device::cuda(0));
    y = Tensor<float>(x.shape(), {.layout = Layout::nchw, .device = Device::cuda(0)});
    // builds and caches cuDNN's graph (ops::activation_forward runs cutrain's kernel instead)
    if (!cuda::cudnn::activation_forward(x, a, y)) throw Error("bench", "cuDNN has no relu engine here");
  }
  cuda::cudnn::GraphKey key() const {
    const auto [vs, vst] = cuda::cudnn::elementwise_view(x);
    return cuda::cudnn::detail::activation_graph_key<float>(cuda::cudnn::GraphOp::activation_forward, 0, a, vs, vst);
  }
};

void tiny_relu_key(benchmark::State& state) {
  TinyRelu t;
  host_overhead(state, [&] { benchmark::DoNotOptimize(t.key()); });
}

void tiny_relu_lookup(benchmark::State& state) {
  TinyRelu t;
  const auto key = t.key();
  auto& store = cuda::cudnn::plan_store();
  if (!store.find(key)) throw Error("bench", "the graph should be built");
  host_overhead(state, [&] { benchmark::DoNotOptimize(store.find(key)); });
}

void tiny_relu_execute(benchmark::State& state) {
  TinyRelu t;
  cuda::cudnn::BuiltGraph* bg = cuda::cudnn::plan_store().find(t.key());
  if (!bg) throw Error("bench", "the graph should be built");
  host_overhead(state, [&] { cuda::cudnn::execute(*bg, 0, {t.x.data(), t.y.data()}, "bench"); });
}

void tiny_scale(benchmark::State& state) {
  TinyRelu t;
  host_overhead(state, [&] { benchmark::DoNotOptimize(ops::scale(t.x, 0.5)); });
}

// The floor under any op that launches a kernel: the driver's cuLaunchKernel alone, of the NVRTC
// scale kernel looked up beforehand, with the same tiny tensors.
void launch_floor(benchmark::State& state) {
  TinyRelu t;
  namespace k = cuda::kernels;
  k::DeviceScope scope(0);
  const CUfunction f = k::function(0, k::detail::elementwise_program<float>(), "cutrain_scale");
  const long long n = t.x.numel();
  const float alpha = 0.5f;
  const void* xp = t.x.data();
  void* yp = t.y.data();
  host_overhead(state, [&] { k::launch(f, k::grid_for(n), 256, "bench", xp, alpha, yp, n); });
}

}  // namespace

BENCHMARK_CAPTURE(train_step, fmnet_b128_fp32_eager, 128, false)->Name("train/fmnet_b128_fp32_eager")
    ->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(train_step, fmnet_b128_fp32_cudagraph, 128, true)->Name("train/fmnet_b128_fp32_cudagraph")
    ->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(train_step, fmnet_b512_fp32_eager, 512, false)->Name("train/fmnet_b512_fp32_eager")
    ->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(train_step, fmnet_b512_fp32_cudagraph, 512, true)->Name("train/fmnet_b512_fp32_cudagraph")
    ->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(resnet_step, r25601, 256, false, true)->Name("train/resnet18_b256_bf16_eager")
    ->Iterations(9)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(resnet_step, r25600, 256, false, false)->Name("train/resnet18_b256_bf16_eager_unfused")
    ->Iterations(9)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(resnet_step, r25611, 256, true, true)->Name("train/resnet18_b256_bf16_cudagraph")
    ->Iterations(9)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(resnet_step, r25610, 256, true, false)->Name("train/resnet18_b256_bf16_cudagraph_unfused")
    ->Iterations(9)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(resnet_step, r51201, 512, false, true)->Name("train/resnet18_b512_bf16_eager")
    ->Iterations(9)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(resnet_step, r51200, 512, false, false)->Name("train/resnet18_b512_bf16_eager_unfused")
    ->Iterations(9)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(resnet_step, r51211, 512, true, true)->Name("train/resnet18_b512_bf16_cudagraph")
    ->Iterations(9)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(resnet_step, r51210, 512, true, false)->Name("train/resnet18_b512_bf16_cudagraph_unfused")
    ->Iterations(9)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(tiny_relu)->Name("host/tiny_relu")->Iterations(30)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(tiny_conv)->Name("host/tiny_conv")->Iterations(30)->UseManualTime()->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
BENCHMARK_CAPTURE(train_step, fmnet_b128_bf16_eager, 128, false, nn::Precision::bf16)
    ->Name("train/fmnet_b128_bf16_eager")->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(train_step, fmnet_b128_bf16_cudagraph, 128, true, nn::Precision::bf16)
    ->Name("train/fmnet_b128_bf16_cudagraph")->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(train_step, fmnet_b512_bf16_eager, 512, false, nn::Precision::bf16)
    ->Name("train/fmnet_b512_bf16_eager")->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(train_step, fmnet_b512_bf16_cudagraph, 512, true, nn::Precision::bf16)
    ->Name("train/fmnet_b512_bf16_cudagraph")->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(train_step, fmnet_b512_f16_eager, 512, false, nn::Precision::f16)
    ->Name("train/fmnet_b512_f16_eager")->Iterations(30)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(tiny_relu_key)->Name("host/tiny_relu_key")->Iterations(30)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(tiny_relu_lookup)->Name("host/tiny_relu_lookup")->Iterations(30)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(tiny_relu_execute)->Name("host/tiny_relu_execute")->Iterations(30)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(tiny_scale)->Name("host/tiny_scale")->Iterations(30)->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(launch_floor)->Name("host/launch_floor")->Iterations(30)->UseManualTime()->Unit(benchmark::kMicrosecond);
