// Mixed precision on the CPU, where f64 parameters under an f32 model stand in for the GPU's f32
// parameters under bf16/f16 (same mechanism: autograd::cast, gradients sent across element
// types): the cast's gradients against the same computation done in one type, a whole model run
// in a narrower type against its narrow copy (bit for bit), clear errors for what is not offered,
// and the GradScaler's rules (scaled seed, unscale, skip on overflow, backoff, growth, state).
#include "gradcheck.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cutrain/nn.hpp"

namespace cutrain_test_mixed_precision {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

TEST_CASE("autograd::cast: gradients cross element types", "[mixed]") {
  Rng rng(71);
  // f64 leaves w (used twice) and a; f32 compute: y = sum(cast(w) * cast(a) + cast(w)).
  auto w = autograd::parameter(random(Shape{3, 4}, rng));
  auto a = autograd::parameter(random(Shape{3, 4}, rng));
  auto wf = autograd::cast<float>(w);
  auto af = autograd::cast<float>(a);
  REQUIRE(wf.value().to_vector() == cast<float>(w.value()).to_vector());
  auto z = autograd::add(autograd::multiply(wf, af), wf);
  // Back to f64 through a Var with history (a nested backward), then a scalar: the dot with r.
  auto zd = autograd::cast<double>(z);
  const auto r = random(Shape{3, 4}, rng);
  zd.backward(r);
  // dL/dw = r * (a + 1), dL/da = r * w, computed in f32 (the f32 graph's precision).
  const auto rv = r.to_vector(), av = a.value().to_vector(), wv = w.value().to_vector();
  std::vector<double> gw, ga;
  for (std::size_t i = 0; i < rv.size(); ++i) {
    const float rf = static_cast<float>(rv[i]);
    gw.push_back(static_cast<double>(rf * static_cast<float>(av[i]) + rf));
    ga.push_back(static_cast<double>(rf * static_cast<float>(wv[i])));
  }
  require_close(w.grad(), gw, 1e-6);
  require_close(a.grad(), ga, 1e-6);
  CHECK(w.grad().shape() == w.shape());

  // Same type: the Var itself; undefined stays undefined; a leaf needing no grad records nothing.
  CHECK(autograd::cast<double>(w) == w);
  CHECK_FALSE(autograd::cast<float>(Var<double>{}).defined());
  const auto c = autograd::cast<float>(Var<double>(random(Shape{2}, rng)));
  CHECK_FALSE(c.requires_grad());
}

TEST_CASE("autograd::cast: a Var with history is cast once per backward", "[mixed]") {
  Rng rng(72);
  auto w = autograd::parameter(random(Shape{4}, rng));
  auto h = autograd::scale(w, 3.0);  // f64 with history
  auto u = autograd::cast<float>(h);
  auto v = autograd::cast<float>(h);  // a second cast of the same history
  auto s = autograd::add(u, v);
  // The first cast's backward frees h's graph; the second then finds it freed.
  CUTRAIN_REQUIRE_THROWS_OP(s.backward(Tensor<float>::full(Shape{4}, 1.0f)), InvalidArgument, "freed");
  // With retain_graph both run, and the gradients add up: d(3w + 3w)/dw = 6.
  auto w2 = autograd::parameter(random(Shape{4}, rng));
  auto h2 = autograd::scale(w2, 3.0);
  auto s2 = autograd::add(autograd::cast<float>(h2), autograd::cast<float>(h2));
  s2.backward(Tensor<float>::full(Shape{4}, 1.0f), /*retain_graph=*/true);
  require_close(w2.grad(), std::vector<double>(4, 6.0), 1e-12);
}

TEST_CASE("autograd::cast: a parameter's bf16 cast is kept until the parameter or the cast is written", "[mixed]") {
  Rng rng(73);
  auto w = autograd::parameter(Tensor<float>::uniform(Shape{5, 7}, rng, -2, 2));
  const auto expect = [&] { return cast<bfloat16>(w.value()).to_vector(); };
  const auto same = [](const std::vector<bfloat16>& a, const std::vector<bfloat16>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i].bits != b[i].bits) return false;
    return true;
  };
  auto a = autograd::cast<bfloat16>(w);
  CHECK(same(a.value().to_vector(), expect()));
  // Unchanged parameter: the same copy again (no second conversion).
  auto b = autograd::cast<bfloat16>(w);
  CHECK(b.value().data() == a.value().data());
  // Each write that bumps the version is seen: copy_from, an optimizer step, fill.
  w.value().copy_from(Tensor<float>::uniform(Shape{5, 7}, rng, -2, 2));
  CHECK(same(autograd::cast<bfloat16>(w).value().to_vector(), expect()));
  w.grad() = Tensor<float>::uniform(Shape{5, 7}, rng, -1, 1);
  optim::SGD<float>({w}, {.lr = 0.5}).step();
  CHECK(same(autograd::cast<bfloat16>(w).value().to_vector(), expect()));
  w.value().fill(1.25f);
  CHECK(same(autograd::cast<bfloat16>(w).value().to_vector(), expect()));
  // A write into the kept copy itself is not trusted: the next cast converts again.
  auto c = autograd::cast<bfloat16>(w);
  c.value().fill(bfloat16(3.0f));
  CHECK(same(autograd::cast<bfloat16>(w).value().to_vector(), expect()));
  // bf16 and f16 copies are kept apart; a leaf that needs no gradient is converted every time.
  CHECK(autograd::cast<cutrain::half>(w).value().to_vector()[0].bits == cast<cutrain::half>(w.value()).to_vector()[0].bits);
  autograd::Var<float> frozen(Tensor<float>::uniform(Shape{3}, rng, -1, 1));
  CHECK(autograd::cast<bfloat16>(frozen).value().data() != autograd::cast<bfloat16>(frozen).value().data());
}

TEST_CASE("nn: a Sequential of f64 parameters runs in f32 like its f32 copy", "[mixed]") {
  Rng rng(73);
  nn::Sequential<double> wide{nn::Conv2d<double>({.in = 2, .out = 3, .kernel = 3, .padding = 1, .seed = 5}),
                              nn::ReLU{},
                              nn::MaxPool2d({.kernel = 2}),
                              nn::Conv2d<double>({.in = 3, .out = 4, .kernel = 3, .stride = 2, .seed = 6}),
                              nn::Flatten{},
                              nn::Linear<double>({.in = 4, .out = 5, .seed = 7}),
                              nn::ReLU{},
                              nn::Linear<double>({.in = 5, .out = 3, .seed = 8})};
  nn::Sequential<float> narrow{nn::Conv2d<float>({.in = 2, .out = 3, .kernel = 3, .padding = 1}),
                               nn::ReLU{},
                               nn::MaxPool2d({.kernel = 2}),
                               nn::Conv2d<float>({.in = 3, .out = 4, .kernel = 3, .stride = 2}),
                               nn::Flatten{},
                               nn::Linear<float>({.in = 4, .out = 5}),
                               nn::ReLU{},
                               nn::Linear<float>({.in = 5, .out = 3})};
  // narrow gets wide's parameters, converted.
  nn::StateDict<float> sd;
  for (const auto& [name, t] : wide.state_dict()) sd.emplace(name, cast<float>(t));
  narrow.load_state_dict(sd);

  const Tensor<double> x = random(Shape{4, 2, 6, 6}, rng);
  const Tensor<float> xf = cast<float>(x);
  const std::vector<std::int32_t> labels{0, 2, 1, 2};
  const auto y = Tensor<std::int32_t>::from_vector(labels, Shape{4});

  auto logits_mixed = nn::autocast<float>(wide, x);  // Var<double>, computed in f32
  auto logits_narrow = narrow(xf);
  REQUIRE(logits_mixed.value().to_vector() == cast<double>(logits_narrow.value()).to_vector());
  nn::cross_entropy(logits_mixed, y).backward();
  nn::cross_entropy(logits_narrow, y).backward();

  // The gradients that reached the f64 parameters are the f32 copy's, converted: the f32 loss
  // gradient of narrow vs the f64 loss gradient of the mixed model differ only by rounding of
  // the seed into f32, so compare to f32 precision.
  const auto pw = wide.named_parameters();
  const auto pn = narrow.named_parameters();
  REQUIRE(pw.size() == pn.size());
  for (std::size_t k = 0; k < pw.size(); ++k) {
    INFO("parameter " << pw[k].first);
    REQUIRE(pw[k].second.grad().defined());
    require_close(pw[k].second.grad(), cast<double>(pn[k].second.grad()).to_vector(), 1e-5);
  }
}

TEST_CASE("nn: mixed precision refuses what it does not offer, clearly", "[mixed]") {
  Rng rng(74);
  // The CPU's batch norm wants its parameters in x's type.
  nn::BatchNorm2d<double> bn({.features = 2});
  const Var<float> x(cast<float>(random(Shape{2, 2, 3, 3}, rng)));
  CUTRAIN_REQUIRE_THROWS_OP(bn(x), NotImplemented, "batch_norm");
  // So does its layer norm (the GPU takes f32 parameters under a bf16/f16 x).
  nn::Sequential<double> net{nn::Flatten{}, nn::LayerNorm<double>({.shape = {18}})};
  CUTRAIN_REQUIRE_THROWS_OP(net(x), NotImplemented, "layer_norm_forward");
  // The CPU backend has no bf16 compute.
  nn::Sequential<float> small{nn::Linear<float>({.in = 3, .out = 2})};
  CUTRAIN_REQUIRE_THROWS_OP(nn::autocast<bfloat16>(small, Tensor<float>::full(Shape{1, 3}, 0.5f)), NotImplemented,
                            "f32 and f64");
  CHECK(nn::parse_precision("bf16") == nn::Precision::bf16);
  CHECK_FALSE(nn::parse_precision("fp8").has_value());
}

TEST_CASE("optim::GradScaler: scaled seed, unscale, skip, backoff and growth", "[mixed]") {
  Rng rng(75);
  optim::GradScaler<double> scaler({.init_scale = 1024.0, .growth_interval = 2});
  // loss = w . c, a one-element root: dL/dw = c, whatever the scale.
  const auto w0 = random(Shape{1, 5}, rng).to_vector();
  const auto c = random(Shape{1, 5}, rng);
  auto w1 = autograd::parameter(Tensor<double>::from_vector(w0, Shape{1, 5}));
  optim::SGD<double> opt1({w1}, {.lr = 0.1});
  const Var<double> cv(c.view());
  auto loss1 = autograd::linear(w1, cv);  // [1,1]
  scaler.backward(loss1);
  std::vector<double> scaled;
  for (double v : c.to_vector()) scaled.push_back(1024.0 * v);
  require_close(w1.grad(), scaled, 1e-12);
  CHECK(scaler.unscale(opt1) == false);
  require_close(w1.grad(), c.to_vector(), 1e-12);
  CHECK(scaler.unscale(opt1) == false);  // once per step: a second call changes nothing
  require_close(w1.grad(), c.to_vector(), 1e-12);
  CHECK(scaler.step(opt1));
  std::vector<double> stepped;
  for (std::size_t i = 0; i < w0.size(); ++i) stepped.push_back(w0[i] - 0.1 * c.to_vector()[i]);
  require_close(w1.value(), stepped, 1e-12);
  CHECK(scaler.scale() == 1024.0);

  // An inf in a gradient: the step is skipped, the weights stay, the scale halves.
  opt1.zero_grad();
  auto loss2 = autograd::linear(w1, cv);
  scaler.backward(loss2);
  auto g = w1.grad().to_vector();
  g[2] = std::numeric_limits<double>::infinity();
  w1.grad() = Tensor<double>::from_vector(g, Shape{1, 5});
  CHECK_FALSE(scaler.step(opt1));
  require_close(w1.value(), stepped, 1e-12);
  CHECK(scaler.scale() == 512.0);
  CHECK(scaler.skipped_steps() == 1);

  // growth_interval (2) clean steps in a row double it.
  for (int i = 0; i < 2; ++i) {
    opt1.zero_grad();
    scaler.backward(autograd::linear(w1, cv));
    CHECK(scaler.step(opt1));
  }
  CHECK(scaler.scale() == 1024.0);

  // State round trip, and bad state or options refused.
  Checkpoint ck;
  scaler.save_state(ck, "scaler");
  optim::GradScaler<double> other({.init_scale = 8.0, .growth_interval = 2});
  other.load_state(ck, "scaler");
  CHECK(other.scale() == 1024.0);
  CHECK(other.skipped_steps() == 1);
  CUTRAIN_REQUIRE_THROWS_OP(other.load_state(ck, "nothing"), InvalidArgument, "GradScaler::load_state");
  CUTRAIN_REQUIRE_THROWS_OP(optim::GradScaler<double>({.init_scale = 0.0}), InvalidArgument, "GradScaler");
  CUTRAIN_REQUIRE_THROWS_OP(optim::GradScaler<double>({.backoff_factor = 1.5}), InvalidArgument, "GradScaler");
  CUTRAIN_REQUIRE_THROWS_OP(scaler.backward(Var<double>(random(Shape{3}, rng), true)), InvalidArgument,
                            "GradScaler::backward");
}

}  // namespace cutrain_test_mixed_precision
