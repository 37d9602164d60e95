// The GPU ops against the card and against PyTorch (bench/torch_ops.py times the same work the
// same way and prints the ratios):
//  - conv2d fprop, dgrad and wgrad (cuDNN graph API, heuristic plans) for the shapes of
//    bench/conv_shapes.txt, in f32 NCHW (TF32 off), TF32 NCHW and bf16 NHWC;
//  - conv + bias + relu fused, against conv alone, bf16 NHWC;
//  - batch-norm training forward (alone and with relu after it), relu forward, on
//    256x128x32x32 bf16 NHWC and f32 NCHW, in GB/s;
//  - max pool 2x2 forward and backward (NVRTC kernels) on the same shapes, in GB/s;
//  - the general ops of a transformer, bf16, through ops:: (outputs allocated per call, as
//    PyTorch's are): batched matmuls Q K^T (K a transposed view) and P V, softmax along the last
//    axis and along axis 1, a broadcast add, layer norm, an embedding lookup (index_select);
//  - the fusions of docs/fusion.md (ops::Fusion, bf16) against the same graph as separate
//    cutrain ops (ops::fusion_unfused): conv + bias + residual + relu, matmul + bias + gelu,
//    scale + shift + relu, layer norm * modulation + silu.
// Timing as in docs/performance.md (method): CUDA events around 10 back-to-back calls, median of 30 after
// warm-up, same buffers.
//   build/bench/bench_ops_gpu --benchmark_out=ops.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <cutrain/cuda/cudnn/activation.hpp>
#include <cutrain/cutrain.hpp>
#include <cutrain/ops/activation.hpp>
#include <cutrain/ops/batch_norm.hpp>
#include <cutrain/cuda/kernels/pool2d.hpp>
#include <cutrain/ops/broadcast.hpp>
#include <cutrain/ops/fusion.hpp>
#include <cutrain/ops/index.hpp>
#include <cutrain/ops/layer_norm.hpp>
#include <cutrain/ops/matmul.hpp>
#include <cutrain/ops/softmax.hpp>

#include "conv_shapes.hpp"

#include <algorithm>
#include <string>
#include <vector>

namespace {

using namespace cutrain;

std::vector<bench::ConvShape> load_shapes() {
  // From the repository root (where scripts/gpu-check runs it), else from the source tree.
  auto shapes = bench::read_conv_shapes("bench/conv_shapes.txt");
  return shapes.empty() ? bench::read_conv_shapes(CUTRAIN_BENCH_DIR "/conv_shapes.txt") : shapes;
}

enum class Dir { fprop, dgrad, wgrad };

// Median milliseconds per call of fn: 30 samples of 10 back-to-back calls between two events.
template <class F>
double median_ms(F&& fn) {
  cudaEvent_t a, b;
  cuda::check(cudaEventCreate(&a), "bench", "cudaEventCreate");
  cuda::check(cudaEventCreate(&b), "bench", "cudaEventCreate");
  for (int i = 0; i < 5; ++i) fn();
  std::vector<float> ms;
  for (int s = 0; s < 30; ++s) {
    cudaEventRecord(a, cuda::current_stream());
    for (int i = 0; i < 10; ++i) fn();
    cudaEventRecord(b, cuda::current_stream());
    cuda::check(cudaEventSynchronize(b), "bench", "cudaEventSynchronize");
    float t = 0;
    cudaEventElapsedTime(&t, a, b);
    ms.push_back(t / 10);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::nth_element(ms.begin(), ms.begin() + 15, ms.end());
  return ms[15];
}

template <class T>
void run(benchmark::State& state, const bench::ConvShape& s, Dir dir, Layout layout, bool tf32) {
  if (!cuda::available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  cuda::math_options().allow_tf32 = tf32;
  Rng rng(3);
  const Conv2dParams p = Conv2dParams::make(s.stride, s.pad);
  const Device dev = Device::cuda(0);
  auto x = cast<T>(Tensor<float>::uniform({s.n, s.c, s.h, s.w}, rng, -1, 1, {.layout = layout})).to(dev);
  auto w = cast<T>(Tensor<float>::uniform({s.k, s.c, s.r, s.r}, rng, -1, 1, {.layout = layout})).to(dev);
  const Shape ys = conv2d_output_shape(x.shape(), w.shape(), p);
  auto dy = cast<T>(Tensor<float>::uniform(ys, rng, -1, 1, {.layout = layout})).to(dev);
  Tensor<T> y(ys, {.layout = layout, .device = dev}), dx(x.shape(), {.layout = layout, .device = dev}),
      dw(w.shape(), {.layout = layout, .device = dev});
  double ms = 0;
  for (auto _ : state) {
    switch (dir) {
      case Dir::fprop: ms = median_ms([&] { cuda::cudnn::conv2d_forward(x, w, Tensor<T>{}, p, y); }); break;
      case Dir::dgrad: ms = median_ms([&] { cuda::cudnn::conv2d_backward_data(dy, w, p, dx); }); break;
      case Dir::wgrad: ms = median_ms([&] { cuda::cudnn::conv2d_backward_filter(dy, x, p, dw); }); break;
    }
    state.SetIterationTime(ms / 1e3);
  }
  cuda::synchronize("bench_ops_gpu");
  const double flops = 2.0 * static_cast<double>(ys.numel()) * static_cast<double>(s.c * s.r * s.r);
  state.counters["median_ms"] = ms;
  state.counters["TFLOP/s"] = flops / (ms * 1e-3) / 1e12;
  cuda::math_options().allow_tf32 = false;
}

// Fused conv + bias + relu (one graph) next to the same conv alone, bf16 NHWC.
void run_fused(benchmark::State& state, const bench::ConvShape& s, bool fused) {
  if (!cuda::available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Rng rng(4);
  const Conv2dParams p = Conv2dParams::make(s.stride, s.pad);
  const Device dev = Device::cuda(0);
  const TensorOptions o{.layout = Layout::nhwc, .device = dev};
  auto x = cast<bfloat16>(Tensor<float>::uniform({s.n, s.c, s.h, s.w}, rng, -1, 1, {.layout = Layout::nhwc})).to(dev);
  auto w = cast<bfloat16>(Tensor<float>::uniform({s.k, s.c, s.r, s.r}, rng, -1, 1, {.layout = Layout::nhwc})).to(dev);
  auto b = cast<bfloat16>(Tensor<float>::uniform({s.k}, rng, -1, 1)).to(dev);
  Tensor<bfloat16> y(conv2d_output_shape(x.shape(), w.shape(), p), o);
  const ActivationParams act{.kind = fused ? Activation::relu : Activation::identity};
  const Tensor<bfloat16> none;
  double ms = 0;
  for (auto _ : state) {
    ms = median_ms([&] { cuda::cudnn::conv2d_forward(x, w, fused ? b : none, p, y, act); });
    state.SetIterationTime(ms / 1e3);
  }
  cuda::synchronize("bench_ops_gpu");
  state.counters["median_ms"] = ms;
}

enum class Elementwise { bn_train, bn_relu_train, relu };

// Memory-bound ops on 256x128x32x32; GB/s counts one read of x and one write of y.
template <class T>
void run_elementwise(benchmark::State& state, Elementwise what, Layout layout) {
  if (!cuda::available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Rng rng(5);
  const Device dev = Device::cuda(0);
  const Shape shape{256, 128, 32, 32};
  auto x = cast<T>(Tensor<float>::uniform(shape, rng, -1, 1, {.layout = layout})).to(dev);
  Tensor<T> y(shape, {.layout = layout, .device = dev});
  auto gamma = Tensor<float>::uniform({128}, rng, 0.5, 1.5).to(dev);
  auto beta = Tensor<float>::uniform({128}, rng, -0.5, 0.5).to(dev);
  auto rm = Tensor<float>::zeros({128}, {.device = dev});
  auto rv = Tensor<float>::full({128}, 1.f, {.device = dev});
  Tensor<float> sm({128}, {.device = dev}), si({128}, {.device = dev}), nm({128}, {.device = dev}),
      nv({128}, {.device = dev});
  const BatchNormParams bp{};
  double ms = 0;
  for (auto _ : state) {
    switch (what) {
      case Elementwise::bn_train:
        ms = median_ms([&] { (void)cuda::cudnn::batch_norm_forward_training(x, gamma, beta, rm, rv, bp, y, sm, si, nm, nv); });
        break;
      case Elementwise::bn_relu_train:
        ms = median_ms([&] {
          (void)cuda::cudnn::batch_norm_forward_training(x, gamma, beta, rm, rv, bp, y, sm, si, nm, nv,
                                                         {.kind = Activation::relu});
        });
        break;
      case Elementwise::relu:
        ms = median_ms([&] { (void)cuda::cudnn::activation_forward(x, {.kind = Activation::relu}, y); });
        break;
    }
    state.SetIterationTime(ms / 1e3);
  }
  cuda::synchronize("bench_ops_gpu");
  state.counters["median_ms"] = ms;
  state.counters["GB/s"] = 2.0 * static_cast<double>(shape.numel() * sizeof(T)) / (ms * 1e-3) / 1e9;
}

// Max pool 2x2 on 256x128x32x32. GB/s counts the bytes each direction must move: forward reads x
// and writes y; backward reads x and dy and writes dx (it recomputes the argmax from x).
template <class T>
void run_maxpool(benchmark::State& state, Layout layout, bool backward) {
  if (!cuda::available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Rng rng(6);
  const Device dev = Device::cuda(0);
  const Shape shape{256, 128, 32, 32};
  const Pool2dParams p = Pool2dParams::max(2);
  const Shape ys = pool2d_output_shape(shape, p);
  auto x = cast<T>(Tensor<float>::uniform(shape, rng, -1, 1, {.layout = layout})).to(dev);
  auto dy = cast<T>(Tensor<float>::uniform(ys, rng, -1, 1, {.layout = layout})).to(dev);
  Tensor<T> y(ys, {.layout = layout, .device = dev}), dx(shape, {.layout = layout, .device = dev});
  double ms = 0;
  for (auto _ : state) {
    ms = backward ? median_ms([&] { cuda::kernels::pool2d_backward(x, dy, p, dx); })
                  : median_ms([&] { cuda::kernels::pool2d_forward(x, p, y); });
    state.SetIterationTime(ms / 1e3);
  }
  cuda::synchronize("bench_ops_gpu");
  const std::int64_t elements = backward ? 2 * shape.numel() + ys.numel() : shape.numel() + ys.numel();
  state.counters["median_ms"] = ms;
  state.counters["GB/s"] = static_cast<double>(elements) * sizeof(T) / (ms * 1e-3) / 1e9;
}

enum class General { bmm_qk, bmm_pv, softmax_last, softmax_axis1, add_bcast, layer_norm, index_select };

// One general op in bf16 (names and shapes as bench/torch_ops.py's run_general).
void run_general(benchmark::State& state, General what) {
  if (!cuda::available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Rng rng(7);
  const Device dev = Device::cuda(0);
  const auto rand = [&](const Shape& s) { return cast<bfloat16>(Tensor<float>::uniform(s, rng, -1, 1)).to(dev); };
  double ms = 0;
  const auto time = [&](auto&& fn) {
    for (auto _ : state) {
      ms = median_ms(fn);
      state.SetIterationTime(ms / 1e3);
    }
  };
  switch (what) {
    case General::bmm_qk: {
      auto q = rand({64, 512, 64}), k = rand({64, 512, 64});
      time([&] { benchmark::DoNotOptimize(ops::matmul(q, cutrain::transpose(k, -1, -2))); });
      break;
    }
    case General::bmm_pv: {
      auto pr = rand({64, 512, 512}), v = rand({64, 512, 64});
      time([&] { benchmark::DoNotOptimize(ops::matmul(pr, v)); });
      break;
    }
    case General::softmax_last:
    case General::softmax_axis1: {
      auto x = rand({64, 512, 512});
      const int axis = what == General::softmax_last ? -1 : 1;
      time([&] { benchmark::DoNotOptimize(ops::softmax_forward(x, axis)); });
      break;
    }
    case General::add_bcast: {
      auto x = rand({256, 128, 32, 32}), b = rand({128, 1, 1});
      time([&] { benchmark::DoNotOptimize(ops::add(x, b)); });
      break;
    }
    case General::layer_norm: {
      auto x = rand({8192, 768});
      auto g = Tensor<float>::uniform({768}, rng, 0.5, 1.5).to(dev), b = Tensor<float>::uniform({768}, rng, -0.5, 0.5).to(dev);
      time([&] { benchmark::DoNotOptimize(ops::layer_norm_forward(x, g, b)); });
      break;
    }
    case General::index_select: {
      auto table = rand({50000, 768});
      Tensor<std::int32_t> idx_host({4096});
      std::vector<std::int32_t> v(4096);
      for (auto& i : v) i = static_cast<std::int32_t>(rng.below(50000));
      idx_host.assign(v);
      auto idx = idx_host.to(dev);
      time([&] { benchmark::DoNotOptimize(ops::index_select(table, 0, idx)); });
      break;
    }
  }
  cuda::synchronize("bench_ops_gpu");
  state.counters["median_ms"] = ms;
}

enum class Fused { residual_block, matmul_bias_gelu, scale_shift_relu, layer_norm_mod_silu };

// One fusion of docs/fusion.md in bf16, one cuDNN graph (fused) or cutrain's separate ops.
void run_fusion(benchmark::State& state, Fused what, bool fused) {
  if (!cuda::available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Rng rng(9);
  const Device dev = Device::cuda(0);
  const auto rand = [&](const Shape& s, Layout l = Layout::row_major) {
    return cast<bfloat16>(Tensor<float>::uniform(s, rng, -1, 1, {.layout = l})).to(dev);
  };
  fusion::Graph g;
  std::vector<Tensor<bfloat16>> in;
  const auto set = [&](auto&&... t) { (in.push_back(std::move(t)), ...); };
  if (what == Fused::residual_block) {
    auto x = g.input("x"), w = g.input("w"), b = g.input("bias"), r = g.input("residual");
    g.output(g.relu(g.add(g.add(g.conv2d(x, w, {.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1}), b), r)), "y");
    set(rand({32, 64, 56, 56}, Layout::nhwc), rand({64, 64, 3, 3}, Layout::nhwc), rand({1, 64, 1, 1}),
        rand({32, 64, 56, 56}, Layout::nhwc));
  } else if (what == Fused::matmul_bias_gelu) {
    auto a = g.input("a"), w = g.input("w"), b = g.input("bias");
    g.output(g.gelu(g.add(g.matmul(a, w), b)), "y");
    set(rand({8, 1024, 768}), rand({768, 3072}), rand({3072}));
  } else if (what == Fused::scale_shift_relu) {
    auto x = g.input("x"), s = g.input("scale"), t = g.input("shift");
    g.output(g.relu(g.add(g.mul(x, s), t)), "y");
    set(rand({32, 64, 56, 56}, Layout::nhwc), rand({1, 64, 1, 1}), rand({1, 64, 1, 1}));
  } else {  // 8192 tokens of 768 as [rows, D, 1, 1]; s modulates each token (adaLN-style)
    auto x = g.input("x"), ga = g.input("gamma"), be = g.input("beta"), s = g.input("s");
    g.output(g.silu(g.mul(g.layer_norm(x, ga, be), s)), "y");
    set(rand({8192, 768, 1, 1}), rand({768, 1, 1}), rand({768, 1, 1}), rand({8192, 768, 1, 1}));
  }
  const ops::Fusion f(std::move(g));
  if (const std::string why = fused ? f.unsupported(in) : ""; !why.empty()) {
    state.SkipWithError(("no engine: " + why).c_str());
    return;
  }
  double ms = 0;
  for (auto _ : state) {
    ms = fused ? median_ms([&] { benchmark::DoNotOptimize(f(in)); })
               : median_ms([&] { benchmark::DoNotOptimize(ops::fusion_unfused(f.graph(), std::span<const Tensor<bfloat16>>(in))); });
    state.SetIterationTime(ms / 1e3);
  }
  cuda::synchronize("bench_ops_gpu");
  state.counters["median_ms"] = ms;
}

const int registered = [] {
  static const auto shapes = load_shapes();
  for (const auto& s : shapes)
    for (auto [dir, dname] : {std::pair{Dir::fprop, "fwd"}, {Dir::dgrad, "dgrad"}, {Dir::wgrad, "wgrad"}}) {
      auto reg = [&](const std::string& prefix, auto fn) {
        benchmark::RegisterBenchmark((prefix + "/" + s.name + "/" + dname).c_str(), fn)
            ->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
      };
      reg("fp32_nchw", [&s, dir = dir](benchmark::State& st) { run<float>(st, s, dir, Layout::nchw, false); });
      reg("fp32_tf32_nchw", [&s, dir = dir](benchmark::State& st) { run<float>(st, s, dir, Layout::nchw, true); });
      reg("bf16_nhwc", [&s, dir = dir](benchmark::State& st) { run<bfloat16>(st, s, dir, Layout::nhwc, false); });
    }
  for (const auto& s : shapes) {
    for (bool fused : {false, true})
      benchmark::RegisterBenchmark(("bf16_nhwc/" + s.name + (fused ? "/conv_bias_relu" : "/conv_alone")).c_str(),
                                   [&s, fused](benchmark::State& st) { run_fused(st, s, fused); })
          ->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
  }
  for (auto [what, name] : {std::pair{Elementwise::bn_train, "bn_train"}, {Elementwise::bn_relu_train, "bn_relu_train"},
                            {Elementwise::relu, "relu"}}) {
    benchmark::RegisterBenchmark((std::string("bf16_nhwc/") + name + "_256x128x32x32").c_str(),
                                 [what = what](benchmark::State& st) { run_elementwise<bfloat16>(st, what, Layout::nhwc); })
        ->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark((std::string("fp32_nchw/") + name + "_256x128x32x32").c_str(),
                                 [what = what](benchmark::State& st) { run_elementwise<float>(st, what, Layout::nchw); })
        ->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
  }
  for (bool bwd : {false, true}) {
    const std::string name = std::string(bwd ? "maxpool2_bwd" : "maxpool2_fwd") + "_256x128x32x32";
    benchmark::RegisterBenchmark(("bf16_nhwc/" + name).c_str(),
                                 [bwd](benchmark::State& st) { run_maxpool<bfloat16>(st, Layout::nhwc, bwd); })
        ->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("fp32_nchw/" + name).c_str(),
                                 [bwd](benchmark::State& st) { run_maxpool<float>(st, Layout::nchw, bwd); })
        ->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
  }
  for (auto [what, name] : {std::pair{General::bmm_qk, "bmm_qk_64x512x64"}, {General::bmm_pv, "bmm_pv_64x512x512x64"},
                            {General::softmax_last, "softmax_last_64x512x512"},
                            {General::softmax_axis1, "softmax_axis1_64x512x512"},
                            {General::add_bcast, "add_bcast_256x128x32x32_128x1x1"},
                            {General::layer_norm, "layer_norm_8192x768"},
                            {General::index_select, "index_select_50000x768_4096"}})
    benchmark::RegisterBenchmark((std::string("bf16_general/") + name).c_str(),
                                 [what = what](benchmark::State& st) { run_general(st, what); })
        ->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
  for (auto [what, name] : {std::pair{Fused::residual_block, "conv_bias_add_relu_32x64x56x56_k64_3x3"},
                            {Fused::matmul_bias_gelu, "matmul_bias_gelu_8x1024x768_3072"},
                            {Fused::scale_shift_relu, "scale_shift_relu_32x64x56x56"},
                            {Fused::layer_norm_mod_silu, "layer_norm_mul_silu_8192x768"}})
    for (bool fused : {true, false})
      benchmark::RegisterBenchmark((std::string("bf16_fusion/") + name + (fused ? "/fused" : "/unfused")).c_str(),
                                   [what = what, fused](benchmark::State& st) { run_fusion(st, what, fused); })
          ->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
