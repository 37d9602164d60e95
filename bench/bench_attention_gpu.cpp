// Scaled dot-product attention on the GPU (cuDNN's fused SDPA through ops::), bf16, for the
// shapes of issue 21 (B x H x S x D in {8x16x512x64, 4x16x2048x64, 2x16x4096x128,
// 1x32x8192x128}), full and causal: the forward alone and forward + backward, with q, k, v in
// [B, H, S, D] memory and in [B, S, H, D] memory seen through a permute (no copies). Each row
// reports its median ms and TFLOP/s (a forward is 4 B H S² D flops, half of it when causal; the
// backward counts 2.5 forwards). bench/torch_attention.py times PyTorch's SDPA backends on the
// same work and prints the ratios. Timing as bench_ops_gpu's: CUDA events around 10 back-to-back
// calls, median of 30 after warm-up, same buffers.
//   build/bench/bench_attention_gpu --benchmark_out=attention.json --benchmark_out_format=json
#include <benchmark/benchmark.h>

#include <cutrain/cutrain.hpp>
#include <cutrain/ops/attention.hpp>
#include <cutrain/cuda/cudnn/plan_store.hpp>  // kernel_fallbacks

#include <algorithm>
#include <string>
#include <vector>

namespace {

using namespace cutrain;

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

struct Shape4 {
  std::int64_t b, h, s, d;
};

void run(benchmark::State& state, Shape4 sh, bool causal, bool bshd, bool backward) {
  if (!cuda::available()) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Rng rng(21);
  const Device dev = Device::cuda(0);
  const auto rand = [&] {
    if (!bshd)
      return cast<bfloat16>(Tensor<float>::uniform({sh.b, sh.h, sh.s, sh.d}, rng, -1, 1)).to(dev);
    return permute(cast<bfloat16>(Tensor<float>::uniform({sh.b, sh.s, sh.h, sh.d}, rng, -1, 1)).to(dev), {0, 2, 1, 3});
  };
  const auto q = rand(), k = rand(), v = rand(), dout = rand();
  const AttentionParams p{.causal = causal};
  const auto fallbacks0 = cuda::cudnn::kernel_fallbacks().load();
  double ms = 0;
  for (auto _ : state) {
    ms = median_ms([&] {
      auto r = ops::scaled_dot_product_attention_forward(q, k, v, p);
      if (backward) benchmark::DoNotOptimize(ops::scaled_dot_product_attention_backward(q, k, v, r.o, dout, r.stats, p));
      benchmark::DoNotOptimize(r);
    });
    state.SetIterationTime(ms / 1e3);
  }
  cuda::synchronize("bench_attention_gpu");
  if (cuda::cudnn::kernel_fallbacks().load() != fallbacks0) state.SkipWithError("cuDNN's SDPA did not run (composed fallback)");
  const double fwd_flops = 4.0 * sh.b * sh.h * sh.s * sh.s * sh.d * (causal ? 0.5 : 1.0);
  state.counters["median_ms"] = ms;
  state.counters["tflops"] = fwd_flops * (backward ? 3.5 : 1.0) / (ms * 1e-3) / 1e12;
}

const int registered = [] {
  const std::vector<Shape4> shapes{{8, 16, 512, 64}, {4, 16, 2048, 64}, {2, 16, 4096, 128}, {1, 32, 8192, 128}};
  for (const bool causal : {false, true})
    for (const auto& s : shapes)
      for (const bool bshd : {false, true})
        for (const bool backward : {false, true}) {
          const std::string name = std::string("attention/") + (causal ? "causal/" : "full/") + std::to_string(s.b) +
                                   "x" + std::to_string(s.h) + "x" + std::to_string(s.s) + "x" + std::to_string(s.d) +
                                   (bshd ? "/bshd" : "/bhsd") + (backward ? "/fwd_bwd" : "/fwd");
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) { run(st, s, causal, bshd, backward); })
              ->UseManualTime()->Iterations(1)->Unit(benchmark::kMillisecond);
        }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
