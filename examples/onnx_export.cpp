// Exports the Fashion-MNIST reference CNN and resnet18_cifar (random weights, random batch-norm
// statistics so that the normalization matters) to ONNX, with an input batch and cutrain's own
// CPU forward of it in eval mode, for tests/onnx_check.py to compare against ONNX Runtime.
//
// Also a model of every activation and pool, and one of the norms (layer norm and RMS norm over
// the last dim and over [C, H, W]) and a softmax, a Sequential of transformer blocks and
// attention on tokens [B, S, C], and a small nn::GPT on int32 tokens.
//
//   onnx_export OUT_DIR      writes OUT_DIR/{fashion_mnist_cnn,resnet18_cifar,activations,norms,transformer,gpt}{.onnx,_input.npy,_expected.npy}
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include "cutrain/cpu.hpp"
#include "cutrain/deploy/onnx.hpp"
#include "cutrain/deploy/onnx_gpt.hpp"
#include "cutrain/nn.hpp"

using namespace cutrain;

namespace {

// Norms' scales, and every bias, away from their 1/0 defaults.
template <class Model>
void randomize_scales_and_biases(Model& net, Rng& rng) {
  net.visit_params("", [&](const std::string& name, autograd::Var<float>& p) {
    if (p.shape().rank() != 1 && p.shape().rank() != 3) return;  // conv and linear weights keep their init
    const bool gamma = name.ends_with("weight");
    p.value().assign(Tensor<float>::uniform(p.shape(), rng, gamma ? 0.5 : -0.2, gamma ? 1.5 : 0.2).to_vector());
  });
}

// ... and the batch norms' statistics.
void randomize_norms(nn::Sequential<float>& net, Rng& rng) {
  randomize_scales_and_biases(net, rng);
  net.visit_buffers("", [&](const std::string& name, Tensor<float>& t) {
    const bool var = name.ends_with("running_var");
    t.assign(Tensor<float>::uniform(t.shape(), rng, var ? 0.5 : -0.3, var ? 1.5 : 0.3).to_vector());
  });
}

void export_one(const std::string& name, nn::Sequential<float> net, const Shape& shape, const std::filesystem::path& dir,
                Rng& rng) {
  randomize_norms(net, rng);
  net.eval();
  const Tensor<float> x = Tensor<float>::randn(shape, rng);
  const auto out = net(x);
  const Tensor<float>& y = out.value();
  const auto info = deploy::export_onnx(net, dir / (name + ".onnx"), shape);
  save_npy(dir / (name + "_input.npy"), x);
  save_npy(dir / (name + "_expected.npy"), y);
  std::printf("%s: %zu nodes, %zu initializers, output %s\n", name.c_str(), info.op_types.size(), info.initializers,
              cutrain::detail::cat(info.output_shape).c_str());
}

// A small GPT (attention dropout on in training, so that eval mode must turn it off), on tokens
// shorter than its context.
void export_gpt(const std::filesystem::path& dir, Rng& rng) {
  nn::GPT<float> gpt({.vocab = 37, .context = 16, .dim = 32, .heads = 4, .layers = 2, .attn_dropout = 0.3, .seed = 11});
  randomize_scales_and_biases(gpt, rng);
  gpt.eval();
  const Shape shape{3, 12};
  std::vector<std::int32_t> ids;
  for (std::int64_t i = 0; i < shape.numel(); ++i) ids.push_back(static_cast<std::int32_t>(rng.below(37)));
  const auto tokens = Tensor<std::int32_t>::from_vector(ids, shape);
  const auto logits = gpt(tokens);
  const auto info = deploy::export_onnx(gpt, dir / "gpt.onnx", shape);
  save_npy(dir / "gpt_input.npy", tokens);
  save_npy(dir / "gpt_expected.npy", logits.value());
  std::printf("gpt: %zu nodes, %zu initializers, output %s\n", info.op_types.size(), info.initializers,
              cutrain::detail::cat(info.output_shape).c_str());
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: onnx_export OUT_DIR\n");
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  Rng rng(2026);
  export_one("fashion_mnist_cnn", nn::fashion_mnist_cnn<float>(rng), Shape{4, 1, 28, 28}, dir, rng);
  export_one("resnet18_cifar", nn::resnet18_cifar<float>(rng), Shape{2, 3, 32, 32}, dir, rng);
  // Every activation and pool that has an ONNX form, and a dropout that the export drops.
  using A = cutrain::Activation;
  export_one("activations",
             nn::Sequential<float>{nn::Conv2d<float>({.in = 3, .out = 8, .kernel = 3, .stride = 2, .dilation = 2}, rng),
                                   nn::AvgPool2d({.kernel = 3, .stride = 1, .padding = 1, .count_include_pad = false}),
                                   nn::Activation({.kind = A::gelu_tanh}),
                                   nn::MaxPool2d({.kernel = 3, .stride = 2, .padding = 1}),
                                   nn::Activation({.kind = A::gelu_erf}), nn::Activation({.kind = A::silu}),
                                   nn::Activation({.kind = A::elu, .alpha = 1.0}),
                                   nn::Activation({.kind = A::leaky_relu, .alpha = 0.1}),
                                   nn::Activation({.kind = A::sigmoid}), nn::Activation({.kind = A::tanh}),
                                   nn::BatchNorm2d<float>({.features = 8}), nn::AdaptiveAvgPool2d(1), nn::Flatten{},
                                   nn::Dropout({.p = 0.5}), nn::Linear<float>({.in = 8, .out = 5}, rng),
                                   nn::Activation({.kind = A::identity})},
             Shape{3, 3, 17, 15}, dir, rng);
  export_one("norms",
             nn::Sequential<float>{nn::Conv2d<float>({.in = 3, .out = 4, .kernel = 3, .padding = 1}, rng),
                                   nn::LayerNorm<float>({.shape = {4, 6, 5}}), nn::RMSNorm<float>({.shape = {5}, .eps = 1e-3}),
                                   nn::Flatten{}, nn::Linear<float>({.in = 120, .out = 16}, rng),
                                   nn::LayerNorm<float>({.shape = {16}}), nn::Activation({.kind = A::gelu_tanh}),
                                   nn::Linear<float>({.in = 16, .out = 12}, rng), nn::RMSNorm<float>({.shape = {12}}),
                                   nn::Activation({.kind = A::silu}), nn::Linear<float>({.in = 12, .out = 6}, rng),
                                   nn::Softmax{}},
             Shape{3, 3, 6, 5}, dir, rng);
  export_one("transformer",
             nn::Sequential<float>{nn::TransformerBlock<float>({.dim = 32, .heads = 4, .seed = 7}),
                                   nn::TransformerBlock<float>({.dim = 32, .heads = 2, .hidden = 48, .causal = false, .seed = 8}),
                                   nn::MultiheadAttention<float>({.dim = 32, .heads = 4, .causal = false, .dropout = 0.2, .seed = 9}),
                                   nn::LayerNorm<float>({.shape = {32}}), nn::Flatten{},
                                   nn::Linear<float>({.in = 6 * 32, .out = 7}, rng)},
             Shape{2, 6, 32}, dir, rng);
  export_gpt(dir, rng);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "onnx_export: %s\n", e.what());
  return 1;
}
