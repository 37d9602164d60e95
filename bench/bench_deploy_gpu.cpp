// The counterpart of bench/torch_deploy.py: inference with deploy::compile's engine on the GPU.
// ResNet-18 for CIFAR-sized input (nn::resnet18_cifar, eval mode, random weights), bf16 NHWC,
// compiled for batches 1 to 256 (batch norms folded, residual adds and ReLUs fused into the
// convolutions; the autotuner's plans as CUTRAIN_AUTOTUNE says: scripts/gpu-check tunes them on a
// fresh cache, as a user's first run does). Per batch size: the engine eager (one dispatch per step) and
// with cuda_graph (one replay per call); CUDA events around one call (input copy-in and output
// copy-out included), median of 30 after 10 warm-up calls. Then the engine saved to an engine
// file and loaded from it, against compiling (wall clock, each before any call: neither builds a
// plan; a first, untimed compile takes the CUDA context's start). Then the same engine with its
// convolutions in e4m3 (deploy::quantize_e4m3, max calibration on 2 random batches: timing only,
// the values mean nothing): e4m3 where it was faster per convolution (QuantizeOptions' default),
// eager and with cuda_graph, and every convolution in e4m3 with w scales per channel and per
// tensor, with cuda_graph. Prints one JSON object; on stderr the reports (each convolution's
// time in both precisions) and cutrain's profile (profile::Session) of 20 eager batch-N calls of
// the bf16 and e4m3 engines, N the largest batch.
//
//   bench_deploy_gpu [--batches 1,32,256] [--model resnet|gpt]
//
// Exits 77 without a GPU.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cutrain/cutrain.hpp"
#include "cutrain/deploy/engine.hpp"
#include "cutrain/deploy/engine_file.hpp"
#include "cutrain/deploy/engine_fp8.hpp"
#include "cutrain/deploy/engine_gpt.hpp"
#include "cutrain/nn.hpp"

using namespace cutrain;

namespace {
template <class F>
double wall_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

template <class F>
double median_ms(F&& call) {
  for (int i = 0; i < 10; ++i) call();
  cuda::Event a, b;
  std::vector<double> ms;
  for (int i = 0; i < 30; ++i) {
    a.record();
    call();
    b.record();
    b.synchronize();
    ms.push_back(b.elapsed_ms(a));
  }
  std::nth_element(ms.begin(), ms.begin() + 15, ms.end());
  return ms[15];
}
}  // namespace

// --model gpt: nn::GPT as examples/char_gpt trains it (vocab 65, context 256, dim 384, 6 heads,
// 6 layers; random weights, f32 parameters), tokens [N, 256]: the model's own eval forward in bf16
// (autograd off), the bf16 engine (deploy::compile of the GPT, engine_gpt.hpp) eager and with
// cuda_graph, and compiled with fuse = false (no gelu or residual add in the matmuls) with
// cuda_graph; timed as above.
int run_gpt(const std::vector<std::int64_t>& batches) {
  const std::int64_t largest = *std::max_element(batches.begin(), batches.end()), s = 256;
  nn::GPT<float> gpt({.vocab = 65, .context = s, .dim = 384, .heads = 6, .layers = 6});
  gpt.to(Device::cuda(0));
  gpt.eval();
  const deploy::CompileOptions eager_o{.device = Device::cuda(0)};
  auto graph_o = eager_o;
  graph_o.cuda_graph = true;
  const auto eager = deploy::compile<bfloat16>(gpt, Shape{largest, s}, eager_o);
  const auto graphed = deploy::compile<bfloat16>(gpt, Shape{largest, s}, graph_o);
  auto plain_o = graph_o;
  plain_o.fuse = false;
  const auto plain = deploy::compile<bfloat16>(gpt, Shape{largest, s}, plain_o);
  Rng data(1);
  std::printf("{\"model\": \"gpt\", \"dtype\": \"bf16\", \"context\": %lld, \"rows\": [", static_cast<long long>(s));
  for (std::size_t k = 0; k < batches.size(); ++k) {
    const std::int64_t n = batches[k];
    std::vector<std::int32_t> t(static_cast<std::size_t>(n * s));
    for (auto& v : t) v = static_cast<std::int32_t>(data.uniform() * 65) % 65;
    const auto tokens = Tensor<std::int32_t>::from_vector(t, Shape{n, s}).to(Device::cuda(0));
    autograd::NoGradGuard off;
    const double m = median_ms([&] { (void)gpt.operator()<bfloat16>(tokens); });
    const double e = median_ms([&] { (void)eager(tokens); });
    const double g = median_ms([&] { (void)graphed(tokens); });
    const double u = median_ms([&] { (void)plain(tokens); });
    const auto h = cast<bfloat16>(Tensor<float>::randn(Shape{n, s, 384}, data, 1.0)).to(Device::cuda(0));
    const double bg = median_ms([&] { (void)graphed.body()(h); });
    std::printf("%s\n {\"batch\": %lld, \"model_ms\": %.4f, \"engine_ms\": %.4f, \"engine_graph_ms\": %.4f, "
                "\"unfused_graph_ms\": %.4f, \"body_graph_ms\": %.4f}",
                k ? "," : "", static_cast<long long>(n), m, e, g, u, bg);
  }
  std::printf("\n], \"activations\": {\"planned_bytes\": %lld, \"all_bytes\": %lld}}\n",
              static_cast<long long>(eager.body().memory().arena), static_cast<long long>(eager.body().memory().total));
  std::fputs(graphed.report().c_str(), stderr);
  for (const std::int64_t n : {batches.front(), largest}) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(n * s));
    for (auto& v : t) v = static_cast<std::int32_t>(data.uniform() * 65) % 65;
    const auto tokens = Tensor<std::int32_t>::from_vector(t, Shape{n, s}).to(Device::cuda(0));
    profile::Session prof;
    for (int i = 0; i < 20; ++i) (void)eager(tokens);
    prof.stop();
    std::fprintf(stderr, "\n-- profile: bf16 GPT engine, 20 eager calls at batch %lld\n%s", static_cast<long long>(n),
                 prof.table().c_str());
  }
  return 0;
}

int main(int argc, char** argv) {
  std::vector<std::int64_t> batches{1, 32, 256};
  bool gpt = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--batches" && i + 1 < argc) {
      batches.clear();
      std::stringstream ss(argv[++i]);
      for (std::string b; std::getline(ss, b, ',');) batches.push_back(std::atoll(b.c_str()));
    } else if (a == "--model" && i + 1 < argc && (std::string(argv[i + 1]) == "gpt" || std::string(argv[i + 1]) == "resnet")) {
      gpt = std::string(argv[++i]) == "gpt";
    } else {
      std::cerr << "usage: bench_deploy_gpu [--batches 1,32,256] [--model resnet|gpt]\n";
      return 2;
    }
  }
  try {
    if (!cuda::available()) {
      std::puts("bench_deploy_gpu: SKIPPED (no CUDA device)");
      return 77;
    }
    if (gpt) return run_gpt(batches);
    const std::int64_t largest = *std::max_element(batches.begin(), batches.end());
    Rng init(0), data(1);
    auto net = nn::resnet18_cifar<float>(init);
    net.eval();
    const Shape in{largest, 3, 32, 32};
    const deploy::CompileOptions eager_o{.device = Device::cuda(0), .layout = Layout::nhwc};
    auto graph_o = eager_o;
    graph_o.cuda_graph = true;
    (void)deploy::compile<bfloat16>(net, in, eager_o);  // the CUDA context and first-use costs: not timed
    std::optional<deploy::Engine<bfloat16>> compiled;
    const double compile_ms = wall_ms([&] { compiled.emplace(deploy::compile<bfloat16>(net, in, eager_o)); });
    const auto& eager = *compiled;
    const auto file = std::filesystem::temp_directory_path() / "cutrain_bench_deploy.engine";
    const double save_ms = wall_ms([&] { deploy::save_engine(eager, file); });
    std::optional<deploy::Engine<bfloat16>> loaded;
    const double load_ms = wall_ms([&] { loaded.emplace(deploy::load_engine<bfloat16>(file)); });
    const auto file_bytes = static_cast<long long>(std::filesystem::file_size(file));
    std::filesystem::remove(file);
    const auto graphed = deploy::compile<bfloat16>(net, in, graph_o);
    auto fp8 = deploy::compile<bfloat16>(net, in, eager_o), fp8_graphed = deploy::compile<bfloat16>(net, in, graph_o);
    auto fp8t = deploy::compile<bfloat16>(net, in, eager_o), fp8t_graphed = deploy::compile<bfloat16>(net, in, graph_o);
    std::vector<Tensor<bfloat16>> cal;
    for (int i = 0; i < 2; ++i) cal.push_back(cast<bfloat16>(Tensor<float>::randn(in, data, 1.0)).to(Device::cuda(0)));
    const double quantize_ms = wall_ms([&] { deploy::quantize_e4m3<bfloat16>(fp8, cal); });
    deploy::quantize_e4m3<bfloat16>(fp8_graphed, cal);
    auto fp8a = deploy::compile<bfloat16>(net, in, eager_o), fp8a_graphed = deploy::compile<bfloat16>(net, in, graph_o);
    const deploy::QuantizeOptions every{.keep_faster = false}, per_tensor{.per_channel = false, .keep_faster = false};
    deploy::quantize_e4m3<bfloat16>(fp8a, cal, every);
    deploy::quantize_e4m3<bfloat16>(fp8a_graphed, cal, every);
    deploy::quantize_e4m3<bfloat16>(fp8t, cal, per_tensor);
    deploy::quantize_e4m3<bfloat16>(fp8t_graphed, cal, per_tensor);
    std::printf("{\"model\": \"resnet18_cifar\", \"dtype\": \"bf16\", \"layout\": \"nhwc\", \"rows\": [");
    for (std::size_t k = 0; k < batches.size(); ++k) {
      const std::int64_t n = batches[k];
      const auto x = cast<bfloat16>(Tensor<float>::randn(Shape{n, 3, 32, 32}, data, 1.0)).to(Device::cuda(0));
      const double e = median_ms([&] { (void)eager(x); });
      const double g = median_ms([&] { (void)graphed(x); });
      const double f = median_ms([&] { (void)fp8(x); });
      const double fg = median_ms([&] { (void)fp8_graphed(x); });
      const double fag = median_ms([&] { (void)fp8a_graphed(x); });
      const double ftg = median_ms([&] { (void)fp8t_graphed(x); });
      std::printf("%s\n {\"batch\": %lld, \"engine_ms\": %.4f, \"engine_graph_ms\": %.4f, \"fp8_ms\": %.4f, "
                  "\"fp8_graph_ms\": %.4f, \"fp8_all_graph_ms\": %.4f, \"fp8_all_per_tensor_graph_ms\": %.4f}",
                  k ? "," : "", static_cast<long long>(n), e, g, f, fg, fag, ftg);
    }
    std::printf("\n], \"activations\": {\"planned_bytes\": %lld, \"all_bytes\": %lld},\n",
                static_cast<long long>(eager.memory().arena), static_cast<long long>(eager.memory().total));
    std::printf(" \"engine_file\": {\"compile_ms\": %.1f, \"save_ms\": %.1f, \"load_ms\": %.1f, \"bytes\": %lld},\n",
                compile_ms, save_ms, load_ms, file_bytes);
    std::printf(" \"fp8\": {\"quantize_ms\": %.1f, \"calibration_batches\": 2}}\n", quantize_ms);
    std::fputs(graphed.report().c_str(), stderr);
    std::fputs(fp8.report().c_str(), stderr);
    const auto x = cast<bfloat16>(Tensor<float>::randn(in, data, 1.0)).to(Device::cuda(0));
    using Named = std::pair<const char*, const deploy::Engine<bfloat16>*>;
    for (const auto& [name, engine] :
         std::initializer_list<Named>{{"bf16", &eager}, {"e4m3 where faster", &fp8}, {"e4m3 everywhere", &fp8a}}) {
      profile::Session prof;
      for (int i = 0; i < 20; ++i) (void)(*engine)(x);
      prof.stop();
      std::fprintf(stderr, "\n-- profile: %s engine, 20 calls at batch %lld\n%s", name, static_cast<long long>(largest),
                   prof.table().c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_deploy_gpu: " << e.what() << "\n";
    return 1;
  }
}
