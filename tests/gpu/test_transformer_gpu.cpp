// The transformer modules on the GPU against the same model on the CPU in f64: a small GPT with
// the same weights, in f32 and under bf16 autocast (f32 master weights), logits and the
// gradients of its parameters; and a few AdamW steps on the device lowering the loss.
#include "parity.hpp"

#include <string>
#include <vector>

#include "cutrain/nn/transformer.hpp"
#include "cutrain/optim/adamw.hpp"

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

constexpr nn::GPTOptions options{.vocab = 11, .context = 16, .dim = 64, .heads = 2, .layers = 2, .seed = 9};

// The f64 CPU model's weights, in f32 on the GPU model.
void copy_weights(nn::GPT<double>& from, nn::GPT<float>& to) {
  auto src = from.named_parameters();
  auto dst = to.named_parameters();
  REQUIRE(src.size() == dst.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    REQUIRE(src[i].first == dst[i].first);
    dst[i].second.value() = cast<float>(src[i].second.value()).to(Device::cuda(0));
  }
}

template <class X>
void check_gpt(const std::string& tag, double tol) {
  INFO(tag);
  Rng rng(2141);
  nn::GPT<double> ref(options);
  nn::GPT<float> gpu(options);
  // Weights larger than GPT-2's 0.02, so that every block matters to the logits.
  for (auto& [name, p] : ref.named_parameters())
    p.value() = Tensor<double>::uniform(p.value().shape(), rng, -0.3, 0.3);
  copy_weights(ref, gpu);
  std::vector<std::int32_t> tok(3 * 16);
  for (auto& t : tok) t = static_cast<std::int32_t>(rng.below(11));
  const auto idx = Tensor<std::int32_t>::from_vector(tok, Shape{3, 16});
  const auto seed = Tensor<double>::uniform(Shape{48, 11}, rng, -1, 1);

  Var<double> want = ref(idx);
  want.backward(seed);
  Var<X> got = gpu.template operator()<X>(idx.to(Device::cuda(0)));
  got.backward(cast<X>(cast<float>(seed)).to(Device::cuda(0)));
  check_close(tag + " logits", got.value(), want.value(), tol);
  auto rp = ref.named_parameters();
  auto gp = gpu.named_parameters();
  for (std::size_t i = 0; i < rp.size(); ++i) {
    const std::string& name = rp[i].first;
    REQUIRE(gp[i].second.grad().defined());
    // Gradients are compared scaled by their largest value (check_close's max(1, |ref|)).
    check_close(tag + " grad " + name, gp[i].second.grad(), rp[i].second.grad(), tol);
  }
}

}  // namespace

TEST_CASE("gpu transformer: GPT logits and gradients against the CPU, f32", "[gpu][transformer]") {
  check_gpt<float>("f32", 1e-4);
}

TEST_CASE("gpu transformer: GPT under bf16 autocast against the CPU", "[gpu][transformer]") {
  check_gpt<bfloat16>("bf16", 5e-2);
}

TEST_CASE("gpu transformer: AdamW steps on the device lower a GPT's loss", "[gpu][transformer]") {
  nn::GPT<float> gpt({.vocab = 7, .context = 32, .dim = 64, .heads = 2, .layers = 1, .seed = 4});
  gpt.to(Device::cuda(0));
  optim::AdamW<float> opt(gpt.parameters(), {.lr = 3e-3, .weight_decay = 0.1});
  std::vector<std::int32_t> xs, ys;
  for (int b = 0; b < 8; ++b)
    for (int t = 0; t < 32; ++t) {
      xs.push_back((b + t) % 7);
      ys.push_back((b + t + 1) % 7);
    }
  const auto x = Tensor<std::int32_t>::from_vector(xs, Shape{8, 32}).to(Device::cuda(0));
  const auto y = Tensor<std::int32_t>::from_vector(ys, Shape{256}).to(Device::cuda(0));
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    for (auto& p : gpt.parameters()) p.zero_grad();
    Var<float> loss = autograd::cross_entropy(autograd::cast<float>(gpt.operator()<bfloat16>(x)), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.value().to_vector()[0];
  }
  INFO("loss " << first << " -> " << last);
  CHECK(first > 1.0);
  CHECK(last < 0.1);
}
