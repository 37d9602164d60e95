// deploy::compile on the CPU in f64: the engine's output against the model's own eval-mode
// forward on random inputs (batch norms with random running statistics, so that folding is
// exercised), what was folded and fused, the batch range, the memory plan (no two values that
// live at once share a byte; the arena below the sum), and bad inputs.
#include "bad_input.hpp"
#include "gradcheck.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "cutrain/autograd/engine.hpp"
#include "cutrain/deploy/engine.hpp"
#include "cutrain/deploy/engine_gpt.hpp"
#include "cutrain/nn.hpp"
#include "random_model.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_deploy_engine {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

nn::Sequential<double> small_resnet(Rng& rng) {
  nn::Sequential<double> net{nn::Conv2d<double>({.in = 3, .out = 8, .kernel = 3, .padding = 1, .bias = false}, rng),
                             nn::BatchNorm2d<double>({.features = 8}),
                             nn::ReLU{},
                             nn::ResidualBlock<double>({.in = 8}),
                             nn::ResidualBlock<double>({.in = 8, .out = 16, .stride = 2}),
                             nn::AdaptiveAvgPool2d{},
                             nn::Flatten{},
                             nn::Dropout({.p = 0.3}),
                             nn::Linear<double>({.in = 16, .out = 5}, rng)};
  randomize(net, rng);
  return net;
}

Tensor<double> reference(nn::Sequential<double>& net, const Tensor<double>& x) {
  net.eval();
  autograd::NoGradGuard off;
  return net(x).value().contiguous(Layout::row_major);
}


struct Twice {  // a module the engine does not know
  template <class T>
  autograd::Var<T> operator()(const autograd::Var<T>& x) const { return x; }
};

}  // namespace

TEST_CASE("deploy engine: the reference CNN folds, fuses and matches the model (f64)", "[deploy]") {
  Rng rng(31);
  auto net = nn::fashion_mnist_cnn<double>(rng);
  randomize(net, rng);
  const auto engine = deploy::compile<double>(net, Shape{3, 1, 28, 28});
  const std::string r = engine.report();
  INFO(r);
  // conv+bn+relu twice, two pools, flatten, linear+relu, linear.
  REQUIRE(engine.plan().steps.size() == 7);
  CHECK(r.find("conv 0 + batch_norm 1 (folded) + relu 2") != std::string::npos);
  CHECK(r.find("conv 4 + batch_norm 5 (folded) + relu 6") != std::string::npos);
  CHECK(r.find("linear 9 + relu 10") != std::string::npos);
  auto x = Tensor<double>::uniform(Shape{3, 1, 28, 28}, rng, -1, 1);
  CHECK(max_diff(engine(x), reference(net, x)) < 1e-10);
  // A smaller batch within the range; the NHWC layout gives the same numbers.
  auto x1 = Tensor<double>::uniform(Shape{1, 1, 28, 28}, rng, -1, 1);
  CHECK(max_diff(engine(x1), reference(net, x1)) < 1e-10);
  const auto nhwc = deploy::compile<double>(net, Shape{3, 1, 28, 28}, {.layout = Layout::nhwc});
  CHECK(max_diff(nhwc(x), reference(net, x)) < 1e-10);
}

TEST_CASE("deploy engine: padding 'same' with stride 2 (conv, pools) matches the model (f64)", "[deploy]") {
  Rng rng(37);
  nn::Sequential<double> net{nn::Conv2d<double>({.in = 2, .out = 4, .kernel = 3, .stride = 2, .same_padding = true}, rng),
                             nn::ReLU{},
                             nn::MaxPool2d({.kernel = 2, .stride = 2, .same_padding = true, .same_mode = SamePadding::lower}),
                             nn::AvgPool2d({.kernel = 3, .stride = 2, .count_include_pad = false, .same_padding = true}),
                             nn::Flatten{},
                             nn::Linear<double>({.in = 4 * 2 * 2, .out = 3}, rng)};
  randomize(net, rng);
  const auto engine = deploy::compile<double>(net, Shape{2, 2, 13, 11});  // 13x11 -> 7x6 -> 4x3 -> 2x2
  auto x = Tensor<double>::uniform(Shape{2, 2, 13, 11}, rng, -1, 1);
  CHECK(max_diff(engine(x), reference(net, x)) < 1e-10);
}

TEST_CASE("deploy engine: residual blocks fuse their add and relu into the last conv (f64)", "[deploy]") {
  Rng rng(32);
  auto net = small_resnet(rng);
  const auto engine = deploy::compile<double>(net, Shape{2, 3, 8, 8});
  const std::string r = engine.report();
  INFO(r);
  CHECK(r.find("conv 3.conv2 + batch_norm 3.bn2 (folded) + add 3.add + relu 3.relu2") != std::string::npos);
  CHECK(r.find("conv 4.shortcut.conv + batch_norm 4.shortcut.bn (folded)") != std::string::npos);
  CHECK(r.find("removed: dropout 7") != std::string::npos);
  CHECK(r.find("scale_shift") == std::string::npos);  // every batch norm folded
  CHECK(r.find(": add ") == std::string::npos);        // every add fused
  // stem, block 3 (2 convs), block 4 (shortcut + 2 convs), pool, flatten, linear.
  CHECK(engine.plan().steps.size() == 9);
  auto x = Tensor<double>::uniform(Shape{2, 3, 8, 8}, rng, -1, 1);
  const auto want = reference(net, x);
  CHECK(max_diff(engine(x), want) < 1e-10);
  const auto plain = deploy::compile<double>(net, Shape{2, 3, 8, 8}, {.fuse = false});
  CHECK(plain.plan().steps.size() > 20);
  CHECK(max_diff(plain(x), want) < 1e-12);
  // The memory plan reuses: the arena is below the sum of all activations.
  CHECK(engine.memory().arena < engine.memory().total);
  CHECK(engine.memory().arena > 0);
}

TEST_CASE("deploy engine: layer norm, RMS norm and softmax run as engine steps (f64, f32)", "[deploy]") {
  Rng rng(35);
  auto mlp = norm_mlp(rng);
  const auto engine = deploy::compile<double>(mlp, Shape{5, 12});
  const std::string r = engine.report();
  INFO(r);
  CHECK(r.find("layer_norm [5,16] (layer_norm 1)") != std::string::npos);
  CHECK(r.find("rms_norm [5,8] (rms_norm 4)") != std::string::npos);
  CHECK(r.find("softmax [5,8] (softmax 5)") != std::string::npos);
  CHECK(engine.plan().steps[4].eps == 1e-6);
  CHECK(engine.plan().steps[5].axis == 1);  // -1 of a 2-d input
  const auto x = Tensor<double>::uniform(Shape{5, 12}, rng, -2, 2);
  CHECK(max_diff(engine(x), reference(mlp, x)) < 1e-12);
  const auto x2 = Tensor<double>::uniform(Shape{2, 12}, rng, -2, 2);
  CHECK(max_diff(engine(x2), reference(mlp, x2)) < 1e-12);
  auto cnn = norm_cnn(rng);
  const auto xc = Tensor<double>::uniform(Shape{3, 3, 6, 6}, rng, -1, 1);
  const auto want = reference(cnn, xc);
  for (const Layout l : {Layout::row_major, Layout::nhwc}) {
    const auto e = deploy::compile<double>(cnn, Shape{3, 3, 6, 6}, {.layout = l});
    CHECK(max_diff(e(xc.contiguous(l)), want) < 1e-12);
  }
  // f32 against the f64 model.
  const auto e32 = deploy::compile<float>(cnn, Shape{3, 3, 6, 6});
  CHECK(max_diff(cast<double>(e32(cast<float>(xc))), want) < 1e-4);
  // A norm whose shape is not the input's trailing dims, or a softmax axis outside it, is refused.
  run_cases({
      bad<InvalidArgument>("layer norm shape", "deploy::compile", {"module 1 (LayerNorm over [8])", "[1,16]"},
                           [&] {
                             nn::Sequential<double> n{nn::Linear<double>({.in = 4, .out = 16}, rng),
                                                      nn::LayerNorm<double>({.shape = {8}})};
                             deploy::compile<double>(n, Shape{1, 4});
                           }),
      bad<InvalidArgument>("RMS norm over the batch", "deploy::compile", {"module 0 (RMSNorm over [2,4])"},
                           [&] {
                             nn::Sequential<double> n{nn::RMSNorm<double>({.shape = {2, 4}})};
                             deploy::compile<double>(n, Shape{2, 4});
                           }),
      bad<InvalidArgument>("softmax axis", "deploy::compile", {"module 0 (Softmax) axis 2", "2-d"},
                           [&] {
                             nn::Sequential<double> n{nn::Softmax{.axis = 2}};
                             deploy::compile<double>(n, Shape{2, 4});
                           }),
  });
}

TEST_CASE("deploy memory plan: values alive at once never share bytes", "[deploy]") {
  Rng rng(33);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 2 + static_cast<int>(rng.next_u64() % 30), steps = 1 + static_cast<int>(rng.next_u64() % 20);
    std::vector<std::int64_t> bytes;
    std::vector<std::pair<int, int>> life;
    for (int v = 0; v < n; ++v) {
      const int a = static_cast<int>(rng.next_u64() % static_cast<std::uint64_t>(steps)) - 1;
      const int b = a + static_cast<int>(rng.next_u64() % 5);
      bytes.push_back(1 + static_cast<std::int64_t>(rng.next_u64() % 5000));
      life.emplace_back(a, b);
    }
    const auto m = deploy::plan_memory(bytes, life);
    std::int64_t total = 0, peak = 0;
    for (int v = 0; v < n; ++v) total += bytes[static_cast<std::size_t>(v)];
    CHECK(m.total == total);
    for (int s = -1; s < steps + 5; ++s) {  // the arena holds at least what is alive at each step
      std::int64_t live = 0;
      for (int v = 0; v < n; ++v)
        if (life[static_cast<std::size_t>(v)].first <= s && s <= life[static_cast<std::size_t>(v)].second)
          live += bytes[static_cast<std::size_t>(v)];
      peak = std::max(peak, live);
    }
    CHECK(m.arena >= peak);
    for (int u = 0; u < n; ++u)
      for (int v = u + 1; v < n; ++v) {
        const auto su = static_cast<std::size_t>(u), sv = static_cast<std::size_t>(v);
        const bool together = life[su].first <= life[sv].second && life[sv].first <= life[su].second;
        const bool apart = m.offset[su] + bytes[su] <= m.offset[sv] || m.offset[sv] + bytes[sv] <= m.offset[su];
        if (together) CHECK(apart);
      }
  }
}

TEST_CASE("deploy engine: transformer blocks and attention match the model (f64)", "[deploy]") {
  Rng rng(35);
  auto net = token_transformer(rng, 6);
  const auto engine = deploy::compile<double>(net, Shape{3, 6, 16});
  const std::string r = engine.report();
  INFO(r);
  // Per block: ln1, qkv, attention, proj + add, ln2, fc1 + gelu, fc2 + add; then qkv,
  // attention, proj, layer norm, flatten, linear.
  REQUIRE(engine.plan().steps.size() == 2 * 7 + 6);
  CHECK(r.find("attention [3,6,16] (attention 0.attn)") != std::string::npos);
  CHECK(r.find("linear 1.fc1 + gelu_tanh 1.gelu") != std::string::npos);
  CHECK(r.find("linear 0.attn.proj + add 0.add1") != std::string::npos);
  CHECK(r.find("linear 1.fc2 + add 1.add2") != std::string::npos);
  CHECK(r.find("removed: attention dropout 2") != std::string::npos);
  auto x = Tensor<double>::uniform(Shape{3, 6, 16}, rng, -1, 1);
  CHECK(max_diff(engine(x), reference(net, x)) < 1e-10);
  auto x1 = Tensor<double>::uniform(Shape{1, 6, 16}, rng, -1, 1);  // a smaller batch
  CHECK(max_diff(engine(x1), reference(net, x1)) < 1e-10);
  // In f32 (with cutrain::onednn its linear steps are oneDNN primitives, the residual added after).
  const auto f32 = deploy::compile<float>(net, Shape{3, 6, 16});
  CHECK(max_diff(cast<double>(f32(cast<float>(x))), reference(net, x)) < 1e-4);
  // A causal block: a token's output does not depend on later tokens.
  nn::Sequential<double> causal{nn::TransformerBlock<double>({.dim = 16, .heads = 4, .seed = 4})};
  randomize(causal, rng);
  const auto ce = deploy::compile<double>(causal, Shape{1, 6, 16});
  auto later = x1.contiguous(Layout::row_major).clone();
  for (std::int64_t c = 0; c < 16; ++c) later.flat(5 * 16 + c) += 1.0;
  const auto y0 = ce(x1).contiguous(Layout::row_major), y1 = ce(later).contiguous(Layout::row_major);
  double first = 0, last = 0;
  for (std::int64_t i = 0; i < 6 * 16; ++i)
    (i < 5 * 16 ? first : last) = std::max(i < 5 * 16 ? first : last, std::abs(y0.flat(i) - y1.flat(i)));
  CHECK(first == 0.0);
  CHECK(last > 1e-3);
  // Unfused (fuse = false) the gelus and the residual adds are steps of their own: same values.
  const auto plain = deploy::compile<double>(net, Shape{3, 6, 16}, {.fuse = false});
  CHECK(plain.plan().steps.size() == engine.plan().steps.size() + 2 + 4);
  CHECK(max_diff(plain(x), engine(x)) < 1e-12);
  // Tokens of the wrong width, and a block on a 2-d input, name the module.
  run_cases({
      bad<InvalidArgument>("tokens too narrow", "deploy::compile", {"module 0", "TransformerBlock", "[3,6,8]"},
                           [&] { deploy::compile<double>(net, Shape{3, 6, 8}); }),
      bad<InvalidArgument>("2-d into a block", "deploy::compile", {"module 0", "TransformerBlock", "3-d"},
                           [&] { deploy::compile<double>(net, Shape{3, 16}); }),
  });
}

TEST_CASE("deploy engine: a GPT over tokens matches the model's logits (f64)", "[deploy]") {
  Rng rng(36);
  nn::GPT<double> gpt({.vocab = 11, .context = 8, .dim = 16, .heads = 2, .layers = 2, .attn_dropout = 0.1, .seed = 5});
  test::randomize(gpt, rng);
  gpt.eval();
  const auto engine = deploy::compile<double>(gpt, Shape{3, 6});
  const std::string r = engine.report();
  INFO(r);
  CHECK(r.find("token lookup: wte [11,16] (the head's weight)") != std::string::npos);
  CHECK(r.find("0: add_constant [3,6,16] (add_constant wpe)") != std::string::npos);
  CHECK(r.find("removed: attention dropout h.1.attn") != std::string::npos);
  CHECK(engine.body().plan().steps.size() == 1 + 2 * 7 + 2);  // positions, the blocks, ln_f, the head
  const auto tokens = [&](std::int64_t n) {
    std::vector<std::int32_t> t(static_cast<std::size_t>(n * 6));
    for (auto& v : t) v = static_cast<std::int32_t>(rng.uniform() * 11) % 11;
    return Tensor<std::int32_t>::from_vector(t, Shape{n, 6});
  };
  TempDir dir("deploy_gpt");
  deploy::save_engine(engine, dir / "gpt.engine");
  const auto loaded = deploy::load_gpt_engine<double>(dir / "gpt.engine");
  CHECK(loaded.report() == engine.report());
  for (const std::int64_t n : {3, 1}) {
    const auto t = tokens(n);
    autograd::NoGradGuard off;
    const auto y = engine(t);
    CHECK(max_diff(y, gpt(t).value().contiguous(Layout::row_major)) < 1e-10);
    CHECK(max_diff(loaded(t), y) == 0.0);
  }
  // A Sequential's engine file is not a GPT's.
  nn::Sequential<double> mlp{nn::Linear<double>({.in = 4, .out = 3}, rng)};
  deploy::save_engine(deploy::compile<double>(mlp, Shape{2, 4}), dir / "mlp.engine");
  run_cases({
      bad<InvalidArgument>("longer than the context", "deploy::compile", {"1 <= S <= context 8", "[2,9]"},
                           [&] { deploy::compile<double>(gpt, Shape{2, 9}); }),
      bad<InvalidArgument>("other length", "deploy::GptEngine", {"int32 [n, 6]", "from 1 to 3"},
                           [&] { engine(Tensor<std::int32_t>::zeros(Shape{2, 5})); }),
      bad<InvalidArgument>("batch too large", "deploy::GptEngine", {"from 1 to 3"},
                           [&] { engine(Tensor<std::int32_t>::zeros(Shape{4, 6})); }),
      bad<InvalidArgument>("token out of range", "index_select", {"11"},
                           [&] { engine(Tensor<std::int32_t>::full(Shape{1, 6}, 11)); }),
      bad<IoError>("not a GPT's file", "load_gpt_engine", {"mlp.engine", "not a GPT's", "input [2,4]"},
                   [&] { deploy::load_gpt_engine<double>(dir / "mlp.engine"); }),
  });
}

TEST_CASE("deploy engine: bad models, shapes and options name the reason", "[deploy][bad_input]") {
  Rng rng(34);
  auto net = small_resnet(rng);
  const auto engine = deploy::compile<double>(net, Shape{2, 3, 8, 8}, {.min_batch = 2});
  run_cases({
      bad<InvalidArgument>("empty model", "deploy::compile", {"no modules"},
                           [] { deploy::compile<double>(nn::Sequential<double>{}, Shape{1, 3, 8, 8}); }),
      bad<InvalidArgument>("5-d example", "deploy::compile", {"4-d [N, C, H, W], 3-d tokens", "[1,3,8,8,1]"},
                           [&] { deploy::compile<double>(net, Shape{1, 3, 8, 8, 1}); }),
      bad<InvalidArgument>("3-d example into a conv", "deploy::compile", {"module 0", "Conv2d", "4-d", "[1,3,8]"},
                           [&] { deploy::compile<double>(net, Shape{1, 3, 8}); }),
      bad<InvalidArgument>("bf16 on the CPU", "deploy::compile", {"bf16 cannot run on cpu"},
                           [&] { deploy::compile<bfloat16>(net, Shape{2, 3, 8, 8}); }),
      bad<InvalidArgument>("pool larger than its input", "deploy::compile", {"module 1", "MaxPool2d"},
                           [] {
                             nn::Sequential<double> n{nn::ReLU{}, nn::MaxPool2d({.kernel = 5})};
                             deploy::compile<double>(n, Shape{1, 1, 3, 3});
                           }),
      bad<InvalidArgument>("zero dim", "deploy::compile", {"zero or negative"},
                           [&] { deploy::compile<double>(net, Shape{0, 3, 8, 8}); }),
      bad<InvalidArgument>("min_batch above the batch", "deploy::compile", {"min_batch 3", "example batch 2"},
                           [&] { deploy::compile<double>(net, Shape{2, 3, 8, 8}, {.min_batch = 3}); }),
      bad<InvalidArgument>("cuda_graph on the CPU", "deploy::compile", {"cuda_graph needs a GPU device, got cpu"},
                           [&] { deploy::compile<double>(net, Shape{2, 3, 8, 8}, {.cuda_graph = true}); }),
      bad<InvalidArgument>("channels", "deploy::compile", {"module 0", "channels"},
                           [&] { deploy::compile<double>(net, Shape{2, 4, 8, 8}); }),
      bad<InvalidArgument>("linear features", "deploy::compile", {"module 0 (Linear 4 -> 2)", "[N, 4]", "[1,5]"},
                           [] {
                             nn::Sequential<double> n{nn::Linear<double>({.in = 4, .out = 2})};
                             deploy::compile<double>(n, Shape{1, 5});
                           }),
      bad<InvalidArgument>("batch above the range", "deploy::Engine", {"[3,3,8,8]", "batch of 2 to 2"},
                           [&] { engine(Tensor<double>(Shape{3, 3, 8, 8})); }),
      bad<InvalidArgument>("batch below the range", "deploy::Engine", {"[1,3,8,8]", "batch of 2 to 2"},
                           [&] { engine(Tensor<double>(Shape{1, 3, 8, 8})); }),
      bad<InvalidArgument>("wrong image size", "deploy::Engine", {"[2,3,9,8]", "[2,3,8,8]"},
                           [&] { engine(Tensor<double>(Shape{2, 3, 9, 8})); }),
      bad<InvalidArgument>("undefined input", "deploy::Engine", {"x"}, [&] { engine(Tensor<double>{}); }),
      bad<NotImplemented>("unknown module", "deploy::compile", {"module 1 is a", "Twice", "does not compile"},
                          [] {
                            nn::Sequential<double> n{nn::ReLU{}, Twice{}};
                            deploy::compile<double>(n, Shape{1, 4});
                          }),
  });
}

}  // namespace cutrain_test_deploy_engine
