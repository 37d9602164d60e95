// A trained model as an inference engine: compiles a fashion_mnist checkpoint (or a ready-made
// model with random weights) with deploy::compile, prints what was fused and the memory plan,
// saves the engine to a file and runs the engine loaded back from it (checked to give the same
// outputs), exports the model to ONNX, and measures: Fashion-MNIST test accuracy of the model
// and of the engine, batch-1 latency and batch-N throughput. On cuda:0 when cutrain was built
// with CUDA and a GPU is present, else on the CPU.
//
//   deploy [--checkpoint FILE | --model fashion_mnist_cnn|resnet18_cifar] [--device cpu|cuda]
//          [--precision f32|bf16|f16|fp8] [--calibrate N] [--calibrator max|percentile[:P]]
//          [--e4m3 faster|all] [--batch N] [--cuda-graph] [--engine FILE] [--export FILE.onnx]
//          [--data DIR] [--limit N] [--seed N]
//
// --checkpoint reads what `fashion_mnist --checkpoint FILE` writes. --engine FILE saves the
// engine there and loads it back (compile, save and load times are printed); without it the
// engine file goes to a temporary file. --precision fp8 is a bf16 engine whose convolutions
// deploy::quantize_e4m3 calibrates on N batches (--calibrate, default 4) of the training images
// (random inputs for a model without data) with the given calibrator (default max; percentile:
// 99.99 unless P is given), GPU only; each convolution stays in bf16 where e4m3 is not faster
// (--e4m3 faster, the default) or every convolution cuDNN has an e4m3 engine for is in e4m3
// (--e4m3 all). int8 is refused: on the H200 cuDNN 9.19's int8 convolutions are slower than bf16
// (docs/deploy.md). --limit N evaluates the first N test images only. The last line: "engine:
// test accuracy XX.XX% (model YY.YY%), batch 1 A ms, batch N B ms (C images/s)".
#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "cutrain/cutrain.hpp"
#include "cutrain/data/idx.hpp"
#include "cutrain/data/loader.hpp"
#include "cutrain/nn.hpp"

using namespace cutrain;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string checkpoint, model = "fashion_mnist_cnn", device, precision = "f32", engine, onnx;
  std::string data = data::fashion_mnist_dir();
  std::int64_t batch = 256, limit = 0, calibrate = 4;
  deploy::QuantizeOptions calibrator{};
  std::uint64_t seed = 0;
  bool cuda_graph = false, e4m3_all = false;
};

[[noreturn]] void usage(const std::string& msg) {
  std::cerr << "deploy: " << msg << "\n"
            << "usage: deploy [--checkpoint FILE | --model fashion_mnist_cnn|resnet18_cifar] [--device cpu|cuda]\n"
            << "              [--precision f32|bf16|f16|fp8] [--calibrate N] [--calibrator max|percentile[:P]]\n"
            << "              [--e4m3 faster|all] [--batch N] [--cuda-graph] [--engine FILE] [--export FILE.onnx]\n"
            << "              [--data DIR] [--limit N] [--seed N]\n";
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(f + " needs a value");
      return argv[++i];
    };
    try {
      if (f == "--checkpoint") a.checkpoint = value();
      else if (f == "--model") a.model = value();
      else if (f == "--device") a.device = value();
      else if (f == "--precision") a.precision = value();
      else if (f == "--batch") a.batch = std::stoll(value());
      else if (f == "--cuda-graph") a.cuda_graph = true;
      else if (f == "--engine") a.engine = value();
      else if (f == "--export") a.onnx = value();
      else if (f == "--data") a.data = value();
      else if (f == "--limit") a.limit = std::stoll(value());
      else if (f == "--seed") a.seed = std::stoull(value());
      else if (f == "--calibrate") a.calibrate = std::stoll(value());
      else if (f == "--calibrator") {
        const std::string c = value();
        if (c == "max") a.calibrator = {.calibrator = Calibrator::max};
        else if (c == "percentile") a.calibrator = {.calibrator = Calibrator::percentile};
        else if (c.rfind("percentile:", 0) == 0)
          a.calibrator = {.calibrator = Calibrator::percentile, .percentile = std::stod(c.substr(11))};
        else usage("--calibrator must be max, percentile or percentile:P");
      } else if (f == "--e4m3") {
        const std::string e = value();
        if (e != "faster" && e != "all") usage("--e4m3 must be faster or all");
        a.e4m3_all = e == "all";
      }
      else usage("unknown flag " + f);
    } catch (const std::logic_error&) {
      usage(f + " needs a number");
    }
  }
  if (a.precision == "int8")
    usage("--precision int8: cuDNN 9.19's int8 convolutions are slower than bf16 on the H200; fp8 is the 8-bit mode "
          "(docs/deploy.md)");
  if (a.precision != "f32" && a.precision != "bf16" && a.precision != "f16" && a.precision != "fp8")
    usage("--precision must be f32, bf16, f16 or fp8");
  if (a.calibrate < 1 || a.calibrate > 1000) usage("--calibrate must be in [1, 1000]");
  if (a.model != "fashion_mnist_cnn" && a.model != "resnet18_cifar") usage("--model must be fashion_mnist_cnn or resnet18_cifar");
  if (!a.checkpoint.empty()) a.model = "fashion_mnist_cnn";
  if (a.device != "" && a.device != "cpu" && a.device != "cuda") usage("--device must be cpu or cuda");
  if (a.batch < 1 || a.batch > 4096) usage("--batch must be in [1, 4096]");
  if (a.limit < 0) usage("--limit must be >= 0");
  return a;
}

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// The median of 30 calls after 10 warm-up calls, in ms (CUDA events on the GPU, the host clock on the CPU).
template <class F>
double median_ms(const Device& dev, F&& call) {
  (void)dev;  // the CPU build times on the host only
  for (int i = 0; i < 10; ++i) call();
  std::vector<double> ms;
  for (int i = 0; i < 30; ++i) {
#ifdef CUTRAIN_WITH_CUDA
    if (dev.is_cuda()) {
      cuda::Event a, b;
      a.record();
      call();
      b.record();
      b.synchronize();
      ms.push_back(b.elapsed_ms(a));
      continue;
    }
#endif
    const auto t0 = Clock::now();
    call();
    ms.push_back(ms_since(t0));
  }
  std::nth_element(ms.begin(), ms.begin() + 15, ms.end());
  return ms[15];
}

// Top-1 accuracy (%) of logits_of(images) over the loader's batches.
template <class F>
double accuracy(data::Loader<float>& test, F&& logits_of) {
  std::int64_t correct = 0, n = 0;
  for (auto [x, y] : test) {
    const auto l = logits_of(x).to_vector();
    const auto t = y.to_vector();
    const std::int64_t b = y.numel(), classes = static_cast<std::int64_t>(l.size()) / b;
    for (std::int64_t i = 0; i < b; ++i) {
      const auto row = l.begin() + i * classes;
      correct += std::max_element(row, row + classes) - row == t[static_cast<std::size_t>(i)];
    }
    n += b;
  }
  return 100.0 * static_cast<double>(correct) / static_cast<double>(n);
}

template <class E>
int run(const Args& args, nn::Sequential<float>& net, const Shape& in, const Device& dev) {
  const Layout layout = dev.is_cuda() && !std::same_as<E, float> ? Layout::nhwc : Layout::row_major;
  const deploy::CompileOptions o{.device = dev, .layout = layout, .cuda_graph = args.cuda_graph};
  auto t0 = Clock::now();
  auto compiled = deploy::compile<E>(net, in, o);
  const double compile_ms = ms_since(t0);
  if (args.precision == "fp8") {
    if constexpr (std::same_as<E, bfloat16>) {
      std::vector<Tensor<E>> batches;
      const bool real = args.model == "fashion_mnist_cnn" && std::filesystem::exists(args.data + "/train-images-idx3-ubyte.gz");
      if (real) {
        auto train = data::fashion_mnist<float>("train", args.data);
        const std::int64_t n = std::min(train.size(), args.calibrate * in[0]);
        train = {train.images.slice(0, 0, n), train.labels.slice(0, 0, n)};
        data::Loader loader(train, {.batch = in[0], .normalize_mean = 0.2860, .normalize_std = 0.3530, .device = dev});
        for (auto [x, y] : loader) batches.push_back(cast<E>(x));
      } else {
        Rng cal(args.seed + 11);
        for (std::int64_t i = 0; i < args.calibrate; ++i) batches.push_back(cast<E>(Tensor<float>::randn(in, cal, 1.0)).to(dev));
      }
      t0 = Clock::now();
      deploy::QuantizeOptions q = args.calibrator;
      q.keep_faster = !args.e4m3_all;
      deploy::quantize_e4m3(compiled, std::span<const Tensor<E>>(batches), q);
      std::printf("calibrated on %zu batches of %s in %.1f ms\n", batches.size(),
                  real ? "Fashion-MNIST training images" : "random inputs", ms_since(t0));
    }
  }
  std::cout << compiled.report();

  // The engine file: saved, loaded, and the loaded engine checked against the compiled one.
  const std::filesystem::path file =
      args.engine.empty() ? std::filesystem::temp_directory_path() / ("cutrain_deploy_" + std::to_string(::getpid()) + ".engine")
                          : std::filesystem::path(args.engine);
  t0 = Clock::now();
  deploy::save_engine(compiled, file);
  const double save_ms = ms_since(t0);
  t0 = Clock::now();
  const auto engine = deploy::load_engine<E>(file, dev);
  const double load_ms = ms_since(t0);
  std::printf("engine file %s: %lld bytes; compile %.1f ms, save %.1f ms, load %.1f ms\n", file.string().c_str(),
              static_cast<long long>(std::filesystem::file_size(file)), compile_ms, save_ms, load_ms);
  if (args.engine.empty()) std::filesystem::remove(file);
  Rng rng(args.seed + 7);
  const auto probe = cast<E>(Tensor<float>::randn(in, rng, 1.0)).to(dev);
  const auto a = cast<float>(compiled(probe)).to_vector(), b = cast<float>(engine(probe)).to_vector();
  if (a != b) {
    std::cerr << "deploy: the loaded engine's outputs differ from the compiled engine's\n";
    return 1;
  }

  double model_acc = -1, engine_acc = -1;
  if (args.model == "fashion_mnist_cnn") {
    if (!std::filesystem::exists(args.data + "/t10k-images-idx3-ubyte.gz")) {
      std::cout << "deploy: no Fashion-MNIST in " << args.data << " (--data DIR): accuracy not measured\n";
    } else {
      auto test_set = data::fashion_mnist<float>("test", args.data);
      if (args.limit > 0 && args.limit < test_set.size())
        test_set = {test_set.images.slice(0, 0, args.limit), test_set.labels.slice(0, 0, args.limit)};
      data::Loader test(test_set, {.batch = args.batch, .normalize_mean = 0.2860, .normalize_std = 0.3530, .device = dev});
      autograd::NoGradGuard off;
      net.eval();
      model_acc = accuracy(test, [&](const Tensor<float>& x) { return net(x).value().view(); });
      engine_acc = accuracy(test, [&](const Tensor<float>& x) { return cast<float>(engine(cast<E>(x))); });
      std::printf("test accuracy on %lld images: model (f32) %.2f%%, engine (%s) %.2f%%\n",
                  static_cast<long long>(test_set.size()), model_acc, args.precision.c_str(), engine_acc);
    }
  }

  Shape one = in;
  one[0] = 1;
  const auto x1 = cast<E>(Tensor<float>::randn(one, rng, 1.0)).to(dev), xn = cast<E>(Tensor<float>::randn(in, rng, 1.0)).to(dev);
  const double l1 = median_ms(dev, [&] { (void)engine(x1); });
  const double ln = median_ms(dev, [&] { (void)engine(xn); });
  std::printf("engine: test accuracy %.2f%% (model %.2f%%), batch 1 %.3f ms, batch %lld %.3f ms (%.0f images/s)\n",
              engine_acc, model_acc, l1, static_cast<long long>(in[0]), ln, static_cast<double>(in[0]) / ln * 1e3);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  try {
#ifdef CUTRAIN_WITH_CUDA
    const bool present = cuda::available();
#else
    const bool present = false;
#endif
    const bool gpu = args.device == "cuda" || (args.device.empty() && present);
    CUTRAIN_REQUIRE(!gpu || present, DeviceError, "deploy", "--device cuda, but this build or machine has no GPU");
    const Device dev = gpu ? Device::cuda(0) : Device::cpu();
    Rng init(args.seed + 1);
    nn::Sequential<float> net;
    Shape in{args.batch, 1, 28, 28};
    if (!args.checkpoint.empty()) {
      const auto ck = Checkpoint::load(args.checkpoint);
      net = nn::fashion_mnist_cnn<float>(init, ck.get_int("width"));
      nn::load_module(ck, "model", net);
      std::cout << "deploy: " << args.checkpoint << " (fashion_mnist_cnn, width " << ck.get_int("width") << ")\n";
    } else if (args.model == "resnet18_cifar") {
      net = nn::resnet18_cifar<float>(init);
      in = Shape{args.batch, 3, 32, 32};
      std::cout << "deploy: resnet18_cifar, random weights\n";
    } else {
      net = nn::fashion_mnist_cnn<float>(init);
      std::cout << "deploy: fashion_mnist_cnn, random weights\n";
    }
    net.eval();
    if (!args.onnx.empty()) {
      Shape one = in;
      one[0] = 1;
      const auto info = deploy::export_onnx(net, args.onnx, one);
      std::cout << "deploy: wrote " << args.onnx << " (" << info.op_types.size() << " nodes, " << info.initializers
                << " initializers, input " << one << ")\n";
    }
    net.to(dev);
    std::cout << "deploy: " << dev << ", " << args.precision << ", batch 1 to " << args.batch
              << (args.cuda_graph ? ", CUDA graphs" : "") << "\n";
    if (args.precision == "f32") return run<float>(args, net, in, dev);
    CUTRAIN_REQUIRE(gpu, InvalidArgument, "deploy", "--precision ", args.precision, " runs on the GPU only");
    if (args.precision == "bf16" || args.precision == "fp8") return run<bfloat16>(args, net, in, dev);
    return run<cutrain::half>(args, net, in, dev);
  } catch (const std::exception& e) {
    std::cerr << "deploy: " << e.what() << "\n";
    return 1;
  }
}
