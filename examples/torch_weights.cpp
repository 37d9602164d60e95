// Loads a PyTorch ResNet-18 (CIFAR) state_dict into nn::resnet18_cifar and compares logits with
// PyTorch's, on the CPU and (built with CUTRAIN_WITH_CUDA, on a machine with a GPU) on the GPU.
//
//   python bench/torch_resnet18_weights.py DIR     weights.safetensors, input.npy, logits.npy
//   torch_weights [DIR]                            DIR defaults to $CUTRAIN_TORCH_WEIGHTS_DIR
//
// Prints the largest absolute and relative error per device and "PASS"/"FAIL"; exits 0 when
// every device is within tolerance, 1 when one is not, 77 (SKIPPED) without a directory.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "cutrain/cutrain.hpp"
#include "cutrain/nn.hpp"

using namespace cutrain;
namespace fs = std::filesystem;

namespace {

struct Diff {
  double abs = 0, rel = 0;
};

Diff compare(const std::vector<float>& got, const std::vector<float>& want) {
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  Diff d;
  for (std::size_t i = 0; i < want.size(); ++i) d.abs = std::max(d.abs, std::abs(static_cast<double>(got[i]) - want[i]));
  d.rel = d.abs / std::max(scale, 1e-30);
  return d;
}

// Eval-mode logits of the loaded model on dev.
std::vector<float> run(nn::Sequential<float>& net, const Tensor<float>& x, Device dev) {
  net.to(dev);
  net.eval();
  autograd::NoGradGuard no_grad;
  return net(x.to(dev)).value().to_vector();
}

}  // namespace

int main(int argc, char** argv) try {
  const char* env = std::getenv("CUTRAIN_TORCH_WEIGHTS_DIR");
  const fs::path dir = argc > 1 ? fs::path(argv[1]) : env ? fs::path(env) : fs::path();
  if (dir.empty() || !fs::exists(dir / "weights.safetensors")) {
    std::printf("SKIPPED: no PyTorch weights (give a directory made by bench/torch_resnet18_weights.py, as the "
                "argument or CUTRAIN_TORCH_WEIGHTS_DIR)\n");
    return 77;
  }
  const Safetensors file = read_safetensors(dir / "weights.safetensors");
  const Tensor<float> x = load_npy(dir / "input.npy").as<float>();
  const std::vector<float> want = load_npy(dir / "logits.npy").as<float>().to_vector();
  const auto source = file.metadata.count("source") ? file.metadata.at("source") : std::string("?");
  std::printf("%s: %zu entries, input %s, logits of %zu values\n", source.c_str(), file.tensors.size(),
              x.shape().str().c_str(), want.size());

  Rng init(0);  // overwritten by the file: the init only has to build the model
  auto net = nn::resnet18_cifar<float>(init);
  net.load_state_dict(nn::state_dict_from<float>(file.tensors, nn::resnet18_cifar_torch_names()));

  // f32 everywhere; the reference is PyTorch f32 (TF32 off) or numpy f64, so the gap is
  // reduction order: a few 1e-6 relative to the largest logit on the CPU, more on the GPU.
  struct Run {
    const char* name;
    Device dev;
    double tol;
  };
  std::vector<Run> runs{{"cpu", Device::cpu(), 1e-4}};
#ifdef CUTRAIN_WITH_CUDA
  if (cuda::available()) runs.push_back({"cuda", Device::cuda(0), 2e-3});
  else std::printf("cuda: SKIPPED (no GPU)\n");
#endif
  bool ok = true;
  for (const auto& r : runs) {
    const auto got = run(net, x, r.dev);
    const Diff d = compare(got, want);
    const bool pass = d.rel <= r.tol;
    ok = ok && pass;
    std::printf("%-5s max |diff| %.3g, relative to max |logit| %.3g (tolerance %.0e): %s\n", r.name, d.abs, d.rel, r.tol,
                pass ? "PASS" : "FAIL");
  }
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "torch_weights: %s\n", e.what());
  return 1;
}
