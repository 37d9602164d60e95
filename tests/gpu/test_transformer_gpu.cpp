// The transformer modules on the GPU against the same model on the CPU in f64: a small GPT with
// the same weights, in f32 and under bf16 autocast (f32 master weights), logits and the
// gradients of its parameters; a few AdamW steps on the device lowering the loss; gradient
// clipping on the device; a whole bf16 GPT step captured in a CUDA graph against eager steps;
// index_select's out-of-range policy under capture.
#include "parity.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "cutrain/cuda/cuda_graph.hpp"
#include "cutrain/nn/transformer.hpp"
#include "cutrain/ops/index.hpp"
#include "cutrain/optim/adamw.hpp"
#include "cutrain/optim/clip.hpp"

namespace cutrain_test_transformer_gpu {  // one per file: the unity build compiles files together

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
  for (int step = 0; step < 100; ++step) {
    for (auto& p : gpt.parameters()) p.zero_grad();
    Var<float> loss = autograd::cross_entropy(autograd::cast<float>(gpt.operator()<bfloat16>(x)), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.value().to_vector()[0];
  }
  INFO("loss " << first << " -> " << last);
  CHECK(first > 1.0);
  CHECK(last < 0.3);
}

TEST_CASE("gpu optim: clip_grad_norm on the device matches the CPU", "[gpu][transformer]") {
  Rng rng(2142);
  std::vector<Var<float>> cpu, gpu;
  for (const Shape& s : {Shape{7, 5}, Shape{300}, Shape{2, 3, 4}}) {
    const auto g = Tensor<float>::uniform(s, rng, -1, 1);
    cpu.push_back(autograd::parameter(Tensor<float>::zeros(s)));
    cpu.back().grad() = g.clone();
    gpu.push_back(autograd::parameter(Tensor<float>::zeros(s, {.device = Device::cuda(0)})));
    gpu.back().grad() = g.to(Device::cuda(0));
  }
  for (const double max_norm : {0.5, 100.0}) {  // clipped, and left alone
    const double want = optim::clip_grad_norm(cpu, max_norm);
    const double got = optim::clip_grad_norm(gpu, max_norm);
    CHECK(std::abs(got - want) <= 1e-5 * want);
    for (std::size_t i = 0; i < cpu.size(); ++i) check_close("clipped grad", gpu[i].grad(), cast<double>(cpu[i].grad()));
  }
}

// The multi-tensor kernels (cuda/kernels/optim.hpp): 70 gradients, more than one list of 64,
// sizes around the 8192-element chunk, an NHWC gradient and a transposed (strided) one.
template <class T>
void check_clip_many(Rng& rng) {
  // The CPU reference in f32 (its backend computes in f32 and f64) on the same values.
  std::vector<Var<float>> cpu;
  std::vector<Var<T>> gpu;
  const Device dev = Device::cuda(0);
  const auto add = [&](const Tensor<T>& g, Tensor<T> on_gpu) {
    cpu.push_back(autograd::parameter(Tensor<float>::zeros(g.shape())));
    cpu.back().grad() = cast<float>(g);
    gpu.push_back(autograd::parameter(Tensor<T>::zeros(g.shape(), {.device = dev})));
    gpu.back().grad() = std::move(on_gpu);
  };
  for (int i = 0; i < 70; ++i) {
    const std::int64_t n = i % 7 == 0 ? 8192 * (i / 7) + 3 : 1 + static_cast<std::int64_t>(rng.below(9000));
    const auto g = Tensor<T>::uniform(Shape{n}, rng, -1, 1);
    add(g, g.to(dev));
  }
  const auto g4 = Tensor<T>::uniform(Shape{2, 8, 5, 3}, rng, -1, 1);
  add(g4, g4.to(dev).contiguous(Layout::nhwc));
  const auto gt = Tensor<T>::uniform(Shape{6, 11}, rng, -1, 1);
  add(transpose(gt, 0, 1).contiguous(), transpose(gt.to(dev), 0, 1));
  REQUIRE(!gpu.back().grad().is_contiguous());
  for (const double max_norm : {2.0, 1e6}) {  // clipped, and left alone
    const double want = optim::clip_grad_norm(cpu, max_norm);
    const Tensor<T> norm = optim::clip_grad_norm_device(gpu, max_norm);
    const double got = static_cast<double>(norm.to_vector()[0]);
    CHECK(std::abs(got - want) <= (std::same_as<T, float> ? 1e-5 : 1e-2) * want);
    for (std::size_t i = 0; i < cpu.size(); ++i) check_close("clipped grad", gpu[i].grad(), cast<double>(cpu[i].grad()));
  }
}

TEST_CASE("gpu optim: clip_grad_norm over 72 gradients of many sizes and layouts", "[gpu][transformer]") {
  Rng rng(2144);
  check_clip_many<float>(rng);
  check_clip_many<bfloat16>(rng);
}

TEST_CASE("gpu transformer: a bf16 GPT step captured in a CUDA graph matches eager steps", "[gpu][transformer][graph]") {
  constexpr int steps = 5;
  const Device dev = Device::cuda(0);
  Rng rng(2143);
  std::vector<Tensor<std::int32_t>> xs, ys;
  for (int s = 0; s < steps; ++s) {
    std::vector<std::int32_t> v(4 * 33);
    for (auto& t : v) t = static_cast<std::int32_t>(rng.below(13));
    const auto all = Tensor<std::int32_t>::from_vector(v, Shape{4, 33});
    xs.push_back(all.slice(1, 0, 32).contiguous());
    ys.push_back(all.slice(1, 1, 33).contiguous().reshape({128}));
  }
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  const nn::GPTOptions o{.vocab = 13, .context = 32, .dim = 64, .heads = 2, .layers = 2, .seed = 8};
  const auto lr_at = [](int s) { return 1e-3 * (1 + 0.5 * std::sin(0.7 * s)); };
  struct Run {
    nn::GPT<float> gpt;
    optim::AdamW<float> opt;
    Tensor<std::int32_t> x, y;
    explicit Run(const nn::GPTOptions& o, Device dev)
        : gpt(o), opt((gpt.to(dev), gpt.parameters()), {.weight_decay = 0.1}),
          x(Shape{4, 32}, {.device = dev}), y(Shape{128}, {.device = dev}) {}
    Var<float> step() {
      for (auto& p : gpt.parameters()) p.zero_grad();
      Var<float> loss = autograd::cross_entropy(autograd::cast<float>(gpt.operator()<bfloat16>(x)), y);
      loss.backward();
      (void)optim::clip_grad_norm_device(gpt.parameters(), 0.5);
      opt.step();
      return loss;
    }
  };
  Run a(o, dev), b(o, dev);
  std::vector<double> la, lb;
  for (int s = 0; s < steps; ++s) {
    a.x.copy_from(xs[s]);
    a.y.copy_from(ys[s]);
    a.opt.set_lr(lr_at(s));
    la.push_back(a.step().value().to_vector()[0]);
  }
  b.x.copy_from(xs[0]);
  b.y.copy_from(ys[0]);
  b.opt.set_lr(lr_at(0));
  lb.push_back(b.step().value().to_vector()[0]);
  cuda::CudaGraph graph;
  Var<float> captured;
  graph.capture([&] { captured = b.step(); });
  for (int s = 1; s < steps; ++s) {
    b.x.copy_from(xs[s]);
    b.y.copy_from(ys[s]);
    b.opt.set_lr(lr_at(s));
    graph.replay();
    lb.push_back(captured.value().to_vector()[0]);
  }
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s << ": eager " << la[s] << ", captured " << lb[s]);
    CHECK(std::abs(la[s] - lb[s]) <= 2e-3 * std::max(1.0, std::abs(la[s])));
  }
  // The weights after the last step agree too (bf16 compute; atomics in cuDNN's SDPA backward).
  auto pa = a.gpt.named_parameters(), pb = b.gpt.named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    check_close("weights " + pa[i].first, pb[i].second.value(), cast<double>(pa[i].second.value().to(Device::cpu())), 1e-3);
}

TEST_CASE("gpu index_select under CUDA graph capture: an out-of-range index gives NaN, not a stray read", "[gpu][graph]") {
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  const Device dev = Device::cuda(0);
  const auto table = Tensor<float>::full(Shape{4, 3}, 2.0f, {.device = dev});
  auto idx = Tensor<std::int32_t>::from_vector({1, 3}, Shape{2}).to(dev);
  (void)ops::index_select(table, 0, idx);  // warm-up: loads the kernel
  Tensor<float> y;
  cuda::CudaGraph graph;
  graph.capture([&] { y = ops::index_select(table, 0, idx); });
  idx.copy_from(Tensor<std::int32_t>::from_vector({1, 7}, Shape{2}));
  graph.replay();
  const auto v = y.to_vector();
  for (int i = 0; i < 3; ++i) {
    CHECK(v[i] == 2.0f);
    CHECK(std::isnan(v[3 + i]));
  }
  // Eagerly the same index is an error naming it.
  CHECK_THROWS_WITH(ops::index_select(table, 0, idx), Catch::Contains("index value 7"));
}

}  // namespace cutrain_test_transformer_gpu
