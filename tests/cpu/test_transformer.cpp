// The transformer modules on the CPU: Embedding lookups and their gradient, MultiheadAttention
// against attention written out with ops (per head, causal), f64 gradient checks of a tiny GPT's
// logits with respect to its parameters (the tied embedding included), a tiny GPT learning a
// repeating sequence with AdamW, and bad input.
#include "bad_input.hpp"
#include "gradcheck.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "cutrain/core/view.hpp"
#include "cutrain/nn/transformer.hpp"
#include "cutrain/ops/matmul.hpp"
#include "cutrain/ops/softmax.hpp"
#include "cutrain/optim/adamw.hpp"

namespace cutrain_test_transformer {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {
Tensor<std::int32_t> tokens(const std::vector<std::int32_t>& v, Shape s) { return Tensor<std::int32_t>::from_vector(v, s); }

}  // namespace

TEST_CASE("nn::Embedding looks rows up and sums their gradients", "[transformer]") {
  nn::Embedding<double> emb({.num = 5, .dim = 3, .seed = 1});
  const auto idx = tokens({4, 0, 4, 2}, Shape{2, 2});
  Var<double> y = emb(idx);
  REQUIRE(y.value().shape() == Shape{2, 2, 3});
  const auto w = emb.weight.value().to_vector(), out = y.value().to_vector();
  for (int t = 0; t < 4; ++t)
    for (int d = 0; d < 3; ++d) CHECK(out[t * 3 + d] == w[idx.to_vector()[t] * 3 + d]);
  y.backward(Tensor<double>::full(Shape{2, 2, 3}, 1.0));
  const auto g = emb.weight.grad().to_vector();
  for (int d = 0; d < 3; ++d) {
    CHECK(g[4 * 3 + d] == 2.0);  // row 4 was looked up twice
    CHECK(g[0 * 3 + d] == 1.0);
    CHECK(g[1 * 3 + d] == 0.0);
  }
}

TEST_CASE("nn::MultiheadAttention matches attention written out per head", "[transformer]") {
  Rng rng(2131);
  const std::int64_t B = 2, S = 5, C = 8, H = 2, D = C / H;
  nn::MultiheadAttention<double> mha({.dim = C, .heads = H, .causal = true, .seed = 3});
  const auto x = random({B, S, C}, rng);
  const Tensor<double> y = mha(Var<double>(x.view())).value().view();
  // By hand: qkv = x Wᵀ + b, split into heads, softmax(q kᵀ / sqrt(D) + causal) v, merge, project.
  const auto x2 = x.reshape({B * S, C});
  const auto qkv = ops::add(ops::matmul(x2, transpose(mha.qkv.weight.value(), 0, 1)), mha.qkv.bias.value())
                       .reshape({B, S, 3, H, D});
  std::vector<double> mask(S * S, 0.0);
  for (int i = 0; i < S; ++i)
    for (int j = i + 1; j < S; ++j) mask[i * S + j] = -INFINITY;
  const auto m = Tensor<double>::from_vector(mask, Shape{S, S});
  const auto part = [&](int i) { return permute(squeeze(slice(qkv, 2, i, i + 1), 2), {0, 2, 1, 3}).contiguous(); };
  const auto s = ops::add(ops::scale(ops::matmul(part(0), transpose(part(1), 2, 3)), 1 / std::sqrt(double(D))), m);
  const auto o = ops::matmul(ops::softmax_forward(s, -1), part(2));
  const auto merged = permute(o, {0, 2, 1, 3}).contiguous().reshape({B * S, C});
  const auto want = ops::add(ops::matmul(merged, transpose(mha.proj.weight.value(), 0, 1)), mha.proj.bias.value());
  CHECK(max_diff(y, want.reshape({B, S, C})) < 1e-12);
}

TEST_CASE("nn::GPT gradients (f64)", "[transformer][gradcheck]") {
  Rng rng(2132);
  nn::GPT<double> gpt({.vocab = 7, .context = 6, .dim = 8, .heads = 2, .layers = 2, .seed = 5});
  // Larger weights than GPT-2's 0.02 so that every path carries a gradient worth checking.
  for (auto& [name, p] : gpt.named_parameters()) p.value() = random(p.value().shape(), rng);
  const auto idx = tokens({1, 6, 2, 2, 0, 3, 5, 4}, Shape{2, 4});
  const auto r = random({8, 7}, rng);
  for (auto& p : gpt.parameters()) p.zero_grad();
  gpt(idx).backward(r);
  int checked = 0;
  for (auto& [name, p] : gpt.named_parameters()) {
    if (name != "wte.weight" && name != "wpe.weight" && name != "h.1.attn.qkv.weight" && name != "h.0.fc1.weight" &&
        name != "h.0.ln1.weight" && name != "ln_f.bias" && name != "h.1.fc2.bias")
      continue;
    Tensor<double>& w = p.value();
    gradcheck("gpt " + name, w, [&] { return gpt(idx).value().view(); }, p.grad(), r, 1e-6, 60);
    ++checked;
  }
  CHECK(checked == 7);
}

TEST_CASE("nn::GPT learns a repeating sequence with AdamW (f32)", "[transformer]") {
  nn::GPT<float> gpt({.vocab = 5, .context = 8, .dim = 16, .heads = 2, .layers = 1, .seed = 7});
  optim::AdamW<float> opt(gpt.parameters(), {.lr = 3e-3, .weight_decay = 0});
  // 0 1 2 3 4 0 1 2 ...: each token determines the next.
  std::vector<std::int32_t> xs, ys;
  for (int b = 0; b < 4; ++b)
    for (int t = 0; t < 8; ++t) {
      xs.push_back((b + t) % 5);
      ys.push_back((b + t + 1) % 5);
    }
  const auto x = tokens(xs, Shape{4, 8}), y = tokens(ys, Shape{32});
  double first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    for (auto& p : gpt.parameters()) p.zero_grad();
    Var<float> loss = autograd::cross_entropy(gpt(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.value().to_vector()[0];
  }
  INFO("loss " << first << " -> " << last);
  CHECK(first > 1.0);
  CHECK(last < 0.05);
}

// Attention dropout in the modules: a fresh mask per training call, none in eval mode (where the
// output is the dropout-free module's), and GPT's train()/eval() reach every block.
TEST_CASE("nn::MultiheadAttention and nn::GPT attention dropout", "[transformer]") {
  Rng rng(2133);
  nn::MultiheadAttention<double> plain({.dim = 8, .heads = 2, .seed = 3});
  nn::MultiheadAttention<double> drop({.dim = 8, .heads = 2, .dropout = 0.3, .seed = 3});
  const Var<double> x(random({2, 6, 8}, rng));
  const auto a = drop(x).value().view(), b = drop(x).value().view();
  CHECK(max_diff(a, b) > 1e-6);  // two training calls, two masks
  CHECK(max_diff(a, plain(x).value()) > 1e-6);
  drop.eval();
  CHECK(max_diff(drop(x).value(), plain(x).value()) == 0);

  nn::GPT<double> g0({.vocab = 7, .context = 6, .dim = 8, .heads = 2, .layers = 2, .seed = 5});
  nn::GPT<double> g1({.vocab = 7, .context = 6, .dim = 8, .heads = 2, .layers = 2, .attn_dropout = 0.2, .seed = 5});
  const auto t = tokens({1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5}, Shape{2, 6});
  CHECK(max_diff(g1(t).value(), g0(t).value()) > 1e-6);
  g1.eval();
  for (const auto& blk : g1.blocks) CHECK(!blk.attn.is_training());
  CHECK(max_diff(g1(t).value(), g0(t).value()) == 0);
  g1.train();
  CHECK(g1.blocks[1].attn.is_training());
}

TEST_CASE("bad input: transformer modules", "[transformer][bad_input]") {
  nn::GPT<double> gpt({.vocab = 7, .context = 4, .dim = 8, .heads = 2, .layers = 1});
  nn::MultiheadAttention<double> mha({.dim = 8, .heads = 2});
  run_cases({
      bad<InvalidArgument>("embedding size", "nn::Embedding", {"num and dim > 0", "num 0"},
                           [] { nn::Embedding<double>({.num = 0, .dim = 3}); }),
      bad<InvalidArgument>("heads", "nn::MultiheadAttention", {"multiple of heads", "dim 10, heads 4"},
                           [] { nn::MultiheadAttention<double>({.dim = 10, .heads = 4}); }),
      bad<InvalidArgument>("mha input", "nn::MultiheadAttention", {"x must be [B, S, 8]", "[2,3,6]"},
                           [&] { (void)mha(Var<double>(Tensor<double>::zeros(Shape{2, 3, 6}))); }),
      bad<InvalidArgument>("gpt context", "nn::GPT", {"S <= context 4", "[1,5]"},
                           [&] { (void)gpt(Tensor<std::int32_t>::zeros(Shape{1, 5})); }),
      bad<InvalidArgument>("gpt rank", "nn::GPT", {"int32 or int64 [B, S]", "[5]"},
                           [&] { (void)gpt(Tensor<std::int32_t>::zeros(Shape{5})); }),
      bad<InvalidArgument>("gpt token range", "index_select", {"index value 9", "size 7"},
                           [&] { (void)gpt(tokens({1, 9}, Shape{1, 2})); }),
      bad<InvalidArgument>("gpt options", "nn::GPT", {"vocab 0"}, [] { nn::GPT<double>({.vocab = 0, .context = 4}); }),
      bad<InvalidArgument>("mha dropout", "nn::MultiheadAttention", {"dropout must be in [0, 1)", "1"},
                           [] { nn::MultiheadAttention<double>({.dim = 8, .heads = 2, .dropout = 1}); }),
  });
}

}  // namespace cutrain_test_transformer
