// The fused classifier (ops/ and autograd::linear_cross_entropy, nn::GPT::loss): equal to the
// unfused linear + cross_entropy in every chunking, with ignore_index and label smoothing;
// gradients checked by finite differences in f64; gradient accumulation over micro-batches equal
// to the large batch; bad input.
#include "gradcheck.hpp"

#include <cmath>
#include <vector>

#include "cutrain/autograd.hpp"
#include "cutrain/nn/transformer.hpp"
#include "cutrain/ops/cross_entropy.hpp"
#include "cutrain/ops/linear.hpp"
#include "cutrain/ops/linear_cross_entropy.hpp"

namespace cutrain_test_linear_cross_entropy {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {
Tensor<std::int32_t> random_labels(std::int64_t n, std::int64_t v, Rng& rng) {
  std::vector<std::int32_t> lab(static_cast<std::size_t>(n));
  for (auto& l : lab) l = static_cast<std::int32_t>(rng.below(static_cast<std::uint64_t>(v)));
  return Tensor<std::int32_t>::from_vector(lab, Shape{n});
}

double max_abs_diff(const Tensor<double>& a, const Tensor<double>& b) {
  const auto va = a.to_vector(), vb = b.to_vector();
  REQUIRE(va.size() == vb.size());
  double m = 0;
  for (std::size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}
}  // namespace

TEST_CASE("linear_cross_entropy equals linear then cross_entropy, in every chunking") {
  Rng rng(71);
  const std::int64_t N = 7, C = 5, V = 11;
  auto x = Tensor<double>::randn({N, C}, rng);
  auto w = Tensor<double>::randn({V, C}, rng, 0.5);
  const auto labels = random_labels(N, V, rng);
  for (Reduction red : {Reduction::mean, Reduction::sum}) {
    for (double eps : {0.0, 0.1}) {
      const CrossEntropyParams cp{.reduction = red, .label_smoothing = eps};
      const auto logits = ops::linear_forward(x, w);
      const double want = ops::cross_entropy_forward(logits, labels, cp).flat(0);
      const auto dlogits = ops::cross_entropy_backward(logits, labels, 1.0, cp);
      const auto g = ops::linear_backward(x, w, dlogits, false);
      for (std::int64_t chunk : {0, 1, 3, 7, 100}) {
        INFO(red << " eps " << eps << " chunk_rows " << chunk);
        const auto r = ops::linear_cross_entropy(
            x, w, labels, {.reduction = red, .label_smoothing = eps, .chunk_rows = chunk}, /*grads=*/true);
        CHECK(std::abs(r.loss.flat(0) - want) < 1e-12);
        CHECK(max_abs_diff(r.dx, g.dx) < 1e-12);
        CHECK(max_abs_diff(r.dw, g.dw) < 1e-12);
      }
    }
  }
}

TEST_CASE("linear_cross_entropy: ignore_index rows add nothing; the mean is over the others") {
  Rng rng(72);
  const std::int64_t N = 6, C = 4, V = 9;
  auto x = Tensor<double>::randn({N, C}, rng);
  auto w = Tensor<double>::randn({V, C}, rng, 0.5);
  auto lab = random_labels(N, V, rng).to_vector();
  lab[1] = -100;
  lab[4] = -100;
  const auto labels = Tensor<std::int32_t>::from_vector(lab, Shape{N});
  // The same loss over the four kept rows alone.
  std::vector<double> kept_x;
  std::vector<std::int32_t> kept_lab;
  const auto xv = x.to_vector();
  for (std::int64_t i = 0; i < N; ++i) {
    if (lab[static_cast<std::size_t>(i)] == -100) continue;
    kept_x.insert(kept_x.end(), xv.begin() + i * C, xv.begin() + (i + 1) * C);
    kept_lab.push_back(lab[static_cast<std::size_t>(i)]);
  }
  const auto xk = Tensor<double>::from_vector(kept_x, Shape{4, C});
  const auto lk = Tensor<std::int32_t>::from_vector(kept_lab, Shape{4});
  for (Reduction red : {Reduction::mean, Reduction::sum}) {
    const auto full = ops::linear_cross_entropy(x, w, labels, {.reduction = red, .label_smoothing = 0.05}, true);
    const auto kept = ops::linear_cross_entropy(xk, w, lk, {.reduction = red, .label_smoothing = 0.05}, true);
    CHECK(std::abs(full.loss.flat(0) - kept.loss.flat(0)) < 1e-12);
    CHECK(max_abs_diff(full.dw, kept.dw) < 1e-12);
    for (std::int64_t c = 0; c < C; ++c) {
      CHECK(full.dx.flat(1 * C + c) == 0.0);
      CHECK(full.dx.flat(4 * C + c) == 0.0);
    }
  }
  // Another ignore_index value; a label equal to the default is then out of range.
  auto lab2 = lab;
  lab2[1] = lab2[4] = 3;
  const auto l2 = Tensor<std::int32_t>::from_vector(lab2, Shape{N});
  const double a = ops::linear_cross_entropy(x, w, l2, {.ignore_index = 3}).loss.flat(0);
  CHECK(std::isfinite(a));
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_cross_entropy(x, w, labels, {.ignore_index = 3}), InvalidArgument,
                            "linear_cross_entropy");
}

TEST_CASE("gradcheck: autograd::linear_cross_entropy, mean and sum, smoothing, ignore_index, chunks") {
  Rng rng(73);
  const std::int64_t N = 5, C = 4, V = 7;
  for (Reduction red : {Reduction::mean, Reduction::sum}) {
    for (double eps : {0.0, 0.2}) {
      auto x = Tensor<double>::randn({N, C}, rng);
      auto w = Tensor<double>::randn({V, C}, rng, 0.7);
      auto lab = random_labels(N, V, rng).to_vector();
      lab[2] = -100;
      const auto labels = Tensor<std::int32_t>::from_vector(lab, Shape{N});
      const LinearCrossEntropyParams p{.reduction = red, .label_smoothing = eps, .chunk_rows = 2};
      const auto r = Tensor<double>::from_vector({rng.uniform(-2.0, 2.0)}, Shape{});
      Var<double> xv(x.clone(), true), wv(w.clone(), true);
      autograd::linear_cross_entropy(xv, wv, labels, p).backward(r);
      const auto f = [&] { return ops::linear_cross_entropy(x, w, labels, p).loss; };
      gradcheck(detail::cat("linear_cross_entropy dx ", red, " eps ", eps), x, f, xv.grad(), r);
      gradcheck(detail::cat("linear_cross_entropy dw ", red, " eps ", eps), w, f, wv.grad(), r);
    }
  }
}

TEST_CASE("linear_cross_entropy: no gradient is kept under NoGradGuard or without inputs that want one") {
  Rng rng(74);
  Var<double> x(Tensor<double>::randn({3, 4}, rng), true), w(Tensor<double>::randn({5, 4}, rng), true);
  const auto labels = random_labels(3, 5, rng);
  {
    autograd::NoGradGuard no_grad;
    CHECK(!autograd::linear_cross_entropy(x, w, labels).requires_grad());
  }
  Var<double> xc(x.value().clone()), wc(w.value().clone());
  CHECK(!autograd::linear_cross_entropy(xc, wc, labels).requires_grad());
  // Only w wants one: x gets none.
  Var<double> wg(w.value().clone(), true);
  autograd::linear_cross_entropy(xc, wg, labels).backward();
  CHECK(wg.grad().defined());
  CHECK(!xc.grad().defined());
}

TEST_CASE("nn::GPT::loss equals cross_entropy of its logits, and its gradients") {
  const nn::GPTOptions o{.vocab = 13, .context = 6, .dim = 8, .heads = 2, .layers = 2, .seed = 5};
  nn::GPT<double> a(o), b(o);
  Rng rng(75);
  std::vector<std::int32_t> tok(2 * 6), tgt(2 * 6);
  for (auto& t : tok) t = static_cast<std::int32_t>(rng.below(13));
  for (auto& t : tgt) t = static_cast<std::int32_t>(rng.below(13));
  const auto tokens = Tensor<std::int32_t>::from_vector(tok, Shape{2, 6});
  const auto targets = Tensor<std::int32_t>::from_vector(tgt, Shape{2, 6});
  const Var<double> fused = a.loss(tokens, targets, {.chunk_rows = 5});
  const Var<double> plain = autograd::cross_entropy(b(tokens), targets.reshape({12}));
  CHECK(std::abs(fused.value().flat(0) - plain.value().flat(0)) < 1e-12);
  fused.backward();
  plain.backward();
  const auto pa = a.named_parameters(), pb = b.named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(max_abs_diff(pa[i].second.grad(), pb[i].second.grad()) < 1e-12);
  }
}

TEST_CASE("gradient accumulation over micro-batches equals the large batch") {
  const nn::GPTOptions o{.vocab = 11, .context = 5, .dim = 8, .heads = 2, .layers = 1, .seed = 9};
  nn::GPT<double> big(o), micro(o);
  Rng rng(76);
  std::vector<std::int32_t> tok(4 * 5), tgt(4 * 5);
  for (auto& t : tok) t = static_cast<std::int32_t>(rng.below(11));
  for (auto& t : tgt) t = static_cast<std::int32_t>(rng.below(11));
  const auto tokens = Tensor<std::int32_t>::from_vector(tok, Shape{4, 5});
  const auto targets = Tensor<std::int32_t>::from_vector(tgt, Shape{4, 5});
  big.loss(tokens, targets).backward();
  // Two micro-batches of two sequences, each loss scaled by 1/2: the mean over the whole batch.
  const auto half = Tensor<double>::from_vector({0.5}, Shape{});
  for (std::int64_t k = 0; k < 2; ++k)
    micro.loss(tokens.slice(0, 2 * k, 2 * k + 2), targets.slice(0, 2 * k, 2 * k + 2)).backward(half);
  const auto pa = big.named_parameters(), pb = micro.named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(max_abs_diff(pa[i].second.grad(), pb[i].second.grad()) < 1e-12);
  }
}

TEST_CASE("nn::GPT with recompute: the same loss and gradients, blocks recomputed in backward") {
  const nn::GPTOptions o{.vocab = 17, .context = 6, .dim = 8, .heads = 2, .layers = 3, .seed = 21};
  nn::GPTOptions r = o;
  r.recompute = true;
  nn::GPT<double> plain(o), recomputed(r);
  Rng rng(78);
  std::vector<std::int32_t> tok(2 * 6), tgt(2 * 6);
  for (auto& t : tok) t = static_cast<std::int32_t>(rng.below(17));
  for (auto& t : tgt) t = static_cast<std::int32_t>(rng.below(17));
  const auto tokens = Tensor<std::int32_t>::from_vector(tok, Shape{2, 6});
  const auto targets = Tensor<std::int32_t>::from_vector(tgt, Shape{2, 6});
  const Var<double> a = plain.loss(tokens, targets), b = recomputed.loss(tokens, targets);
  CHECK(a.value().flat(0) == b.value().flat(0));
  a.backward();
  b.backward();
  const auto pa = plain.named_parameters(), pb = recomputed.named_parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    REQUIRE(pb[i].second.grad().defined());
    CHECK(max_abs_diff(pa[i].second.grad(), pb[i].second.grad()) < 1e-12);
  }
  // Under NoGradGuard it is the plain forward.
  autograd::NoGradGuard no_grad;
  CHECK(recomputed.loss(tokens, targets).value().flat(0) == a.value().flat(0));
  nn::GPTOptions bad = r;
  bad.attn_dropout = 0.1;
  CUTRAIN_REQUIRE_THROWS_OP(nn::GPT<double>{bad}, InvalidArgument, "recompute needs attn_dropout 0");
}

TEST_CASE("linear_cross_entropy: bad input") {
  Rng rng(77);
  auto x = Tensor<double>::randn({3, 4}, rng);
  auto w = Tensor<double>::randn({6, 4}, rng);
  const auto labels = random_labels(3, 6, rng);
  const char* op = "linear_cross_entropy";
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_cross_entropy(Tensor<double>{}, w, labels), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_cross_entropy(x, Tensor<double>::randn({6, 5}, rng), labels), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_cross_entropy(x, Tensor<double>::randn({6}, rng), labels), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_cross_entropy(Tensor<double>::zeros({0, 4}), w, random_labels(0, 6, rng)),
                            InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_cross_entropy(x, w, random_labels(2, 6, rng)), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_cross_entropy(x, w, labels, {.label_smoothing = 1.0}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_cross_entropy(x, w, labels, {.chunk_rows = -1}), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(ops::linear_cross_entropy(x, w, labels, {.reduction = static_cast<Reduction>(5)}),
                            InvalidArgument, op);
  try {
    (void)ops::linear_cross_entropy(x, w, Tensor<std::int32_t>::from_vector({0, 6, 1}, Shape{3}));
    FAIL("label 6 with V = 6 was accepted");
  } catch (const InvalidArgument& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("label 6 at index 1") != std::string::npos);
  }
  nn::GPT<double> gpt({.vocab = 6, .context = 4, .dim = 4, .heads = 1, .layers = 1});
  const auto tokens = Tensor<std::int32_t>::zeros({1, 4});
  CUTRAIN_REQUIRE_THROWS_OP(gpt.loss(tokens, Tensor<std::int32_t>::zeros({1, 3})), InvalidArgument, "nn::GPT::loss");
}

}  // namespace cutrain_test_linear_cross_entropy
