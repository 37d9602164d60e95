// optim::EMA: the average after known updates (with and without warm-up) against the formula in
// double, buffers tracked with parameters, swap() and its scope guard restoring the model, and
// the errors for bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "cutrain/nn.hpp"
#include "cutrain/optim/ema.hpp"

namespace cutrain_test_ema {  // one per file: the unity build compiles files together

using namespace cutrain;

namespace {

nn::Sequential<double> small_net(std::uint64_t seed) {
  return nn::Sequential<double>{nn::Conv2d<double>({.in = 1, .out = 3, .kernel = 3, .padding = 1, .seed = seed}),
                                nn::BatchNorm2d<double>({.features = 3}), nn::ReLU{}, nn::Flatten{},
                                nn::Linear<double>({.in = 3 * 4 * 4, .out = 2, .seed = seed + 1})};
}

// Every parameter and buffer of net, in visiting order, as host vectors.
std::vector<std::vector<double>> values(nn::Sequential<double>& net) {
  std::vector<std::vector<double>> out;
  net.visit_params("", [&](const std::string&, autograd::Var<double>& p) { out.push_back(p.value().to_vector()); });
  net.visit_buffers("", [&](const std::string&, Tensor<double>& b) { out.push_back(b.to_vector()); });
  return out;
}

// Moves every parameter and buffer to fresh random values (as a training step would).
void perturb(nn::Sequential<double>& net, Rng& rng) {
  auto move = [&](Tensor<double>& t) {
    auto v = t.to_vector();
    for (double& x : v) x += rng.normal();
    t.assign(v);
  };
  net.visit_params("", [&](const std::string&, autograd::Var<double>& p) { move(p.value()); });
  net.visit_buffers("", [&](const std::string&, Tensor<double>& b) { move(b); });
}

}  // namespace

TEST_CASE("optim::EMA averages parameters and buffers as the formula says", "[optim][ema]") {
  for (const bool warmup : {false, true}) {
    CAPTURE(warmup);
    auto net = small_net(3);
    optim::EMA<double> ema(net, {.decay = 0.9, .warmup = warmup});
    auto expect = values(net);
    Rng rng(11);
    for (int t = 0; t < 5; ++t) {
      perturb(net, rng);
      ema.update();
      const double d = warmup ? std::min(0.9, (1.0 + t) / (10.0 + t)) : 0.9;
      CHECK(ema.decay_at(t) == d);
      const auto now = values(net);
      for (std::size_t k = 0; k < now.size(); ++k)
        for (std::size_t i = 0; i < now[k].size(); ++i) expect[k][i] = d * expect[k][i] + (1 - d) * now[k][i];
    }
    CHECK(ema.updates() == 5);
    const auto trained = values(net);
    {
      const optim::EMA<double>::Swapped averaged(ema);
      CHECK(ema.swapped());
      const auto got = values(net);
      REQUIRE(got.size() == expect.size());
      for (std::size_t k = 0; k < got.size(); ++k)
        for (std::size_t i = 0; i < got[k].size(); ++i) CHECK(got[k][i] == Approx(expect[k][i]).epsilon(1e-12));
    }
    CHECK_FALSE(ema.swapped());
    CHECK(values(net) == trained);  // swapped back exactly
  }
}

TEST_CASE("optim::EMA: the average of named tensors, a model updated in place, bad input", "[optim][ema]") {
  auto net = small_net(5);
  optim::EMA<double> ema(net, {.decay = 0.5});
  const auto w0 = net.named_parameters().front().second.value().to_vector();
  Rng rng(2);
  perturb(net, rng);
  const auto w1 = net.named_parameters().front().second.value().to_vector();
  ema.update();
  const auto avg = ema.average("0.weight").to_vector();
  for (std::size_t i = 0; i < avg.size(); ++i) CHECK(avg[i] == Approx(0.5 * w0[i] + 0.5 * w1[i]));
  CHECK_THROWS_WITH(ema.average("nope"), Catch::Contains("no tracked tensor is named \"nope\""));
  CHECK_THROWS_WITH(optim::EMA<double>(net, {.decay = 1.0}), Catch::Contains("decay must be in [0, 1)"));
  CHECK_THROWS_WITH(optim::EMA<double>(net, {.decay = -0.1}), Catch::Contains("decay must be in [0, 1)"));
  ema.swap();
  CHECK_THROWS_WITH(ema.update(), Catch::Contains("swap() back first"));
  ema.swap();
  nn::Sequential<double> empty{nn::ReLU{}};
  CHECK_THROWS_WITH(optim::EMA<double>(empty), Catch::Contains("no parameters or buffers"));
}

}  // namespace cutrain_test_ema
