// cutrain's CPU inference engine against ONNX Runtime's CPU provider (bench/ort_deploy.py) on the
// same models and weights: the Fashion-MNIST reference CNN and ResNet-18 for CIFAR (random
// weights, eval mode), f32, compiled by deploy::compile in NHWC (batch norms folded, activations
// and residual adds fused; built with cutrain::onednn, its convolutions, linear layers and pools
// run as oneDNN primitives, each convolution's tactic tuned at compile). Writes each model as ONNX
// (deploy::export_onnx) into DIR
// (one per batch size: the files are static) for ort_deploy.py, and prints one JSON object: per model and batch size, the engine's median
// ms per call (host clock; 3 warm-up calls, then as many calls as fit in ~2 s, at least 5).
// The engine runs on --threads threads (cpu::set_num_threads: oneDNN's and OpenBLAS's pools; the
// rest of the engine on one): ort_deploy.py gives ONNX Runtime the same count.
//
//   bench_deploy_cpu DIR [--quick] [--threads N]   --quick: fewer batch sizes (for CI-sized runs)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "cutrain/cpu.hpp"
#include "cutrain/cpu/threads.hpp"
#include "cutrain/nn.hpp"

using namespace cutrain;
using Clock = std::chrono::steady_clock;

namespace {

template <class F>
double median_ms(F&& call) {
  for (int i = 0; i < 3; ++i) call();
  std::vector<double> ms;
  const auto start = Clock::now();
  while (ms.size() < 5 || (std::chrono::duration<double>(Clock::now() - start).count() < 2.0 && ms.size() < 200)) {
    const auto t0 = Clock::now();
    call();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::nth_element(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(ms.size() / 2), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) try {
  bool quick = false;
  int threads = 1;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else {
      argc = 0;  // usage
    }
  }
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_deploy_cpu DIR [--quick] [--threads N]\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  cpu::set_num_threads(threads);
  std::filesystem::create_directories(dir);
  struct Model {
    std::string name;
    nn::Sequential<float> net;
    Shape item;  // one input, batch 1
    std::vector<std::int64_t> batches;
  };
  Rng init(0), data(1);
  std::vector<Model> models;
  models.push_back({"fashion_mnist_cnn", nn::fashion_mnist_cnn<float>(init), Shape{1, 1, 28, 28},
                    quick ? std::vector<std::int64_t>{1, 16} : std::vector<std::int64_t>{1, 64, 256}});
  models.push_back({"resnet18_cifar", nn::resnet18_cifar<float>(init), Shape{1, 3, 32, 32},
                    quick ? std::vector<std::int64_t>{1} : std::vector<std::int64_t>{1, 16}});
  std::printf("{\"threads\": %d, \"gemm\": \"%.*s\", \"models\": [", cpu::num_threads(),
              static_cast<int>(cpu::gemm_library().size()), cpu::gemm_library().data());
  for (std::size_t m = 0; m < models.size(); ++m) {
    auto& md = models[m];
    md.net.eval();
    std::printf("%s\n {\"model\": \"%s\", \"rows\": [", m ? "," : "", md.name.c_str());
    for (std::size_t k = 0; k < md.batches.size(); ++k) {
      Shape in = md.item;
      in[0] = md.batches[k];
      // The ONNX file has a static shape: one per batch size.
      const auto onnx = dir / (md.name + "_b" + std::to_string(in[0]) + ".onnx");
      deploy::export_onnx(md.net, onnx, in);
      const auto engine = deploy::compile<float>(md.net, in, {.layout = Layout::nhwc});
      const auto x = Tensor<float>::randn(in, data, 1.0);
      const double ms = median_ms([&] { (void)engine(x); });
      std::printf("%s{\"batch\": %lld, \"engine_ms\": %.4f, \"onnx\": \"%s\"}", k ? ", " : "",
                  static_cast<long long>(in[0]), ms, onnx.string().c_str());
      std::fflush(stdout);
    }
    std::printf("]}");
  }
  std::printf("\n]}\n");
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_deploy_cpu: %s\n", e.what());
  return 1;
}
