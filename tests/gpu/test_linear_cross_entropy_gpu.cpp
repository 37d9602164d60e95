// The fused classifier on the GPU against the CPU in f64 (loss, dx, dw) in f32, bf16 and f16, with
// GPT-2's unaligned vocabulary 50257, several chunkings, ignore_index and label smoothing; against
// the unfused linear + cross_entropy on the GPU; nn::GPT::loss under bf16 autocast against the f64
// CPU model; and a bf16 GPT step on the fused loss captured in a CUDA graph against eager steps.
#include "parity.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "cutrain/cuda/cuda_graph.hpp"
#include "cutrain/nn/transformer.hpp"
#include "cutrain/ops/cross_entropy.hpp"
#include "cutrain/ops/linear.hpp"
#include "cutrain/ops/linear_cross_entropy.hpp"
#include "cutrain/optim/adamw.hpp"
#include "cutrain/optim/clip.hpp"

namespace cutrain_test_linear_cross_entropy_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

std::vector<std::int32_t> random_labels(std::int64_t n, std::int64_t v, Rng& rng, bool with_ignored) {
  std::vector<std::int32_t> lab(static_cast<std::size_t>(n));
  for (auto& l : lab) l = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(v)));
  if (with_ignored)
    for (std::size_t i = 3; i < lab.size(); i += 7) lab[i] = -100;
  return lab;
}

template <class T>
void check_against_cpu(std::int64_t N, std::int64_t C, std::int64_t V, const LinearCrossEntropyParams& p, double tol) {
  INFO(dtype_of<T> << " N " << N << " C " << C << " V " << V << " " << p.reduction << " eps " << p.label_smoothing
                   << " chunk_rows " << p.chunk_rows << " pad_to " << p.pad_to);
  Rng rng(static_cast<std::uint64_t>(N * 31 + C * 7 + V + p.chunk_rows));
  auto [x, xr] = random_pair<T>({N, C}, rng, Layout::row_major);
  auto [w, wr] = random_pair<T>({V, C}, rng, Layout::row_major);
  const auto lab = random_labels(N, V, rng, true);
  const auto labels = Tensor<std::int32_t>::from_vector(lab, Shape{N});
  const auto want = ops::linear_cross_entropy(xr, wr, labels, p, true);
  const auto got = ops::linear_cross_entropy(x, w, labels.to(Device::cuda(0)), p, true);
  CHECK(got.loss.device() == Device::cuda(0));
  check_close("loss", got.loss, want.loss, tol);
  check_close("dx", got.dx, want.dx, tol);
  check_close("dw", got.dw, want.dw, tol);
  // Without gradients: the same loss.
  const auto loss_only = ops::linear_cross_entropy(x, w, labels.to(Device::cuda(0)), p, false);
  CHECK(!loss_only.dx.defined());
  check_close("loss without gradients", loss_only.loss, want.loss, tol);
}

}  // namespace

TEST_CASE("gpu linear_cross_entropy: against the CPU in f64, vocab 50257, chunks, ignore_index, smoothing",
          "[gpu][linear_cross_entropy]") {
  for (std::int64_t chunk : {0, 16}) {
    const LinearCrossEntropyParams sum{.reduction = Reduction::sum, .label_smoothing = 0.1, .chunk_rows = chunk};
    check_against_cpu<float>(37, 64, 50257, sum, 1e-4);
    check_against_cpu<bfloat16>(37, 64, 50257, sum, 2e-2);
    check_against_cpu<cutrain::half>(37, 64, 50257, sum, 2e-2);
  }
  const LinearCrossEntropyParams mean{.chunk_rows = 5};
  check_against_cpu<float>(19, 40, 1000, mean, 1e-4);
  check_against_cpu<bfloat16>(19, 40, 1000, mean, 2e-2);
  // Tiny vocabularies (one warp a row, the tail loop only), no padding, odd feature counts.
  check_against_cpu<float>(9, 3, 5, {.reduction = Reduction::sum, .pad_to = 1}, 1e-4);
  check_against_cpu<bfloat16>(9, 8, 7, {.reduction = Reduction::sum, .label_smoothing = 0.3}, 2e-2);
  check_against_cpu<float>(9, 8, 300, {.reduction = Reduction::sum, .pad_to = 0}, 1e-4);
}

TEST_CASE("gpu linear_cross_entropy: equal to linear then cross_entropy on the GPU", "[gpu][linear_cross_entropy]") {
  Rng rng(811);
  const std::int64_t N = 64, C = 96, V = 50257;
  auto [x, xr] = random_pair<bfloat16>({N, C}, rng, Layout::row_major);
  auto [w, wr] = random_pair<bfloat16>({V, C}, rng, Layout::row_major);
  const auto labels = Tensor<std::int32_t>::from_vector(random_labels(N, V, rng, false), Shape{N}).to(Device::cuda(0));
  const auto fused = ops::linear_cross_entropy(x, w, labels, {}, true);
  // The unfused path in f32 from the same bf16 logits.
  const auto logits = cast<float>(ops::linear_forward(x, w));
  const auto loss = ops::cross_entropy_forward(logits, labels);
  const auto dlogits = cast<bfloat16>(ops::cross_entropy_backward(logits, labels, 1.0f));
  const auto g = ops::linear_backward(x, w, dlogits, false);
  check_close("loss", fused.loss, cast<double>(loss.to(Device::cpu())), 1e-5);
  // Gradients scaled by N (the mean's 1/N) so that they compare at their own size.
  const auto up = [&](const auto& t) { return ops::scale(cast<float>(t), static_cast<double>(N)); };
  check_close("dx", up(fused.dx), cast<double>(up(g.dx)), 1e-2);
  check_close("dw", up(fused.dw), cast<double>(up(g.dw)), 1e-2);
}

TEST_CASE("gpu nn::GPT::loss under bf16 autocast against the f64 CPU model", "[gpu][linear_cross_entropy]") {
  const nn::GPTOptions o{.vocab = 203, .context = 16, .dim = 64, .heads = 2, .layers = 2, .seed = 4};
  Rng rng(812);
  nn::GPT<double> ref(o);
  nn::GPT<float> gpu(o);
  for (auto& [name, p] : ref.named_parameters()) p.value() = Tensor<double>::uniform(p.value().shape(), rng, -0.3, 0.3);
  auto src = ref.named_parameters();
  auto dst = gpu.named_parameters();
  for (std::size_t i = 0; i < src.size(); ++i) dst[i].second.value() = cast<float>(src[i].second.value()).to(Device::cuda(0));
  std::vector<std::int32_t> tok(3 * 16);
  for (auto& t : tok) t = static_cast<std::int32_t>(rng.below(203));
  const auto tokens = Tensor<std::int32_t>::from_vector(tok, Shape{3, 16});
  const auto targets = Tensor<std::int32_t>::from_vector(random_labels(48, 203, rng, true), Shape{3, 16});
  const LinearCrossEntropyParams p{.reduction = Reduction::sum, .label_smoothing = 0.1};
  Var<double> want = ref.loss(tokens, targets, p);
  want.backward();
  Var<float> got = gpu.loss<bfloat16>(tokens.to(Device::cuda(0)), targets.to(Device::cuda(0)), p);
  got.backward();
  check_close("loss", got.value(), want.value(), 2e-2);
  auto rp = ref.named_parameters();
  auto gp = gpu.named_parameters();
  for (std::size_t i = 0; i < rp.size(); ++i) {
    REQUIRE(gp[i].second.grad().defined());
    CHECK(gp[i].second.grad().device() == Device::cuda(0));
    check_close("grad " + rp[i].first, gp[i].second.grad(), rp[i].second.grad(), 3e-2);
  }
}

TEST_CASE("gpu nn::GPT::loss: a bf16 step captured in a CUDA graph matches eager steps", "[gpu][linear_cross_entropy][graph]") {
  constexpr int steps = 4;
  const Device dev = Device::cuda(0);
  Rng rng(813);
  std::vector<Tensor<std::int32_t>> xs, ys;
  for (int s = 0; s < steps; ++s) {
    std::vector<std::int32_t> v(4 * 33);
    for (auto& t : v) t = static_cast<std::int32_t>(rng.below(1001));
    const auto all = Tensor<std::int32_t>::from_vector(v, Shape{4, 33});
    xs.push_back(all.slice(1, 0, 32).contiguous());
    ys.push_back(all.slice(1, 1, 33).contiguous());
  }
  cuda::Stream stream;
  cuda::StreamGuard on(stream.get());
  const nn::GPTOptions o{.vocab = 1001, .context = 32, .dim = 64, .heads = 2, .layers = 2, .seed = 8};
  struct Run {
    nn::GPT<float> gpt;
    optim::AdamW<float> opt;
    Tensor<std::int32_t> x, y;
    explicit Run(const nn::GPTOptions& o, Device dev)
        : gpt(o), opt((gpt.to(dev), gpt.parameters()), {.lr = 1e-3, .weight_decay = 0.1}),
          x(Shape{4, 32}, {.device = dev}), y(Shape{4, 32}, {.device = dev}) {}
    Var<float> step() {
      for (auto& p : gpt.parameters()) p.zero_grad();
      Var<float> loss = gpt.loss<bfloat16>(x, y);
      loss.backward();
      (void)optim::clip_grad_norm_device(gpt.parameters(), 1.0);
      opt.step();
      return loss;
    }
  };
  Run a(o, dev), b(o, dev);
  std::vector<double> la, lb;
  for (int s = 0; s < steps; ++s) {
    a.x.copy_from(xs[s]);
    a.y.copy_from(ys[s]);
    la.push_back(a.step().value().to_vector()[0]);
  }
  b.x.copy_from(xs[0]);
  b.y.copy_from(ys[0]);
  lb.push_back(b.step().value().to_vector()[0]);
  cuda::CudaGraph graph;
  Var<float> captured;
  graph.capture([&] { captured = b.step(); });
  for (int s = 1; s < steps; ++s) {
    b.x.copy_from(xs[s]);
    b.y.copy_from(ys[s]);
    graph.replay();
    lb.push_back(captured.value().to_vector()[0]);
  }
  for (int s = 0; s < steps; ++s) {
    INFO("step " << s << ": eager " << la[s] << ", captured " << lb[s]);
    CHECK(std::abs(la[s] - lb[s]) <= 2e-3 * std::max(1.0, std::abs(la[s])));
  }
}

}  // namespace cutrain_test_linear_cross_entropy_gpu
