// Fusion graphs' training-phase norms and norm backward nodes (core/fusion.hpp) on the CPU: the
// builder's text, shapes and f32 values; batch norm in training (+ relu) against a reference
// written out per channel, with its statistics and updated running statistics, the inputs left
// unwritten; layer and RMS norm in training and every norm's backward node against cutrain's
// norm ops (themselves gradient-checked in f64); every bad graph's error.
#include "bad_input.hpp"
#include "gradcheck.hpp"

#include <cmath>
#include <vector>

#include "cutrain/ops/batch_norm.hpp"
#include "cutrain/ops/fusion.hpp"
#include "cutrain/ops/layer_norm.hpp"
#include "cutrain/ops/rms_norm.hpp"

namespace cutrain_test_fusion_norms {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {
// g: relu(batch_norm(x)) with every statistic an output.
fusion::Graph bn_relu(double eps, double momentum) {
  fusion::Graph g;
  auto x = g.input("x"), gamma = g.input("gamma"), beta = g.input("beta");
  auto rm = g.input("running_mean"), rv = g.input("running_var");
  const auto r = g.batch_norm(x, gamma, beta, rm, rv, eps, momentum);
  g.output(g.relu(r.y), "y");
  g.output(r.mean, "mean");
  g.output(r.inv_std, "inv_std");
  g.output(r.running_mean, "next_mean");
  g.output(r.running_var, "next_var");
  return g;
}

// a reshaped to `s` (a copy): the norm ops' [C] and [N] against the graph's [C, 1, 1] and [N, 1, 1, 1].
Tensor<double> as(const Tensor<double>& a, const Shape& s) { return cutrain::reshape(a, s).clone(Layout::row_major); }
}  // namespace

TEST_CASE("fusion: batch norm in training with its statistics, + relu (f64)", "[fusion][norm]") {
  Rng rng(21);
  const double eps = 1e-3, momentum = 0.25;
  const ops::Fusion f(bn_relu(eps, momentum));
  const auto& g = f.graph();
  CHECK(g.describe() ==
        "%5 = batch_norm(x, gamma, beta, running_mean, running_var); y = relu(%5); mean = mean(%5); "
        "inv_std = inv_std(%5); next_mean = running_mean(%5); next_var = running_var(%5)");
  CHECK(g.key_text().find("%5=12(0,1,2,3,4,0.001,0.25)") != std::string::npos);
  CHECK(g.f32_inputs() == std::vector<bool>{false, true, true, true, true});
  CHECK(g.f32_outputs() == std::vector<bool>{false, true, true, true, true});
  CHECK(g.has_norm());
  CHECK_FALSE(g.differentiable());

  const std::int64_t N = 3, C = 4, H = 2, W = 3, per = N * H * W;
  auto x = random({N, C, H, W}, rng, Layout::nhwc), gamma = random({C, 1, 1}, rng), beta = random({C, 1, 1}, rng);
  auto rm = random({C, 1, 1}, rng), rv = random({C, 1, 1}, rng);
  for (std::int64_t c = 0; c < C; ++c) rv.flat(c) = 0.5 + rv.flat(c) * rv.flat(c);  // a variance is positive
  const auto rm0 = rm.to_vector(), rv0 = rv.to_vector();
  const auto shapes = fusion::infer_shapes(g, {x.shape(), gamma.shape(), beta.shape(), rm.shape(), rv.shape()}, "t");
  for (int k = 6; k <= 9; ++k) CHECK(shapes[static_cast<std::size_t>(k)] == Shape{C, 1, 1});

  const auto out = f(x, gamma, beta, rm, rv);
  REQUIRE(out.size() == 5);
  for (std::int64_t c = 0; c < C; ++c) {
    double mean = 0, var = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t w = 0; w < W; ++w) mean += x(n, c, h, w) / per;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t w = 0; w < W; ++w) var += (x(n, c, h, w) - mean) * (x(n, c, h, w) - mean) / per;
    const double inv = 1 / std::sqrt(var + eps);
    CHECK(out[1](c, 0, 0) == Approx(mean).margin(1e-12));
    CHECK(out[2](c, 0, 0) == Approx(inv).epsilon(1e-12));
    const auto ci = static_cast<std::size_t>(c);
    CHECK(out[3](c, 0, 0) == Approx((1 - momentum) * rm0[ci] + momentum * mean).margin(1e-12));
    CHECK(out[4](c, 0, 0) == Approx((1 - momentum) * rv0[ci] + momentum * var * per / (per - 1)).epsilon(1e-12));
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t w = 0; w < W; ++w)
          CHECK(out[0](n, c, h, w) ==
                Approx(std::max(0.0, (x(n, c, h, w) - mean) * inv * gamma(c, 0, 0) + beta(c, 0, 0))).margin(1e-12));
  }
  CHECK(rm.to_vector() == rm0);  // the graph's inputs are not written: its results are new tensors
  CHECK(rv.to_vector() == rv0);
}

TEST_CASE("fusion: layer and RMS norm in training and every norm's backward match the norm ops (f64)",
          "[fusion][norm]") {
  Rng rng(22);
  const std::int64_t N = 3, C = 4, H = 2, W = 2;
  auto x = random({N, C, H, W}, rng), dy = random({N, C, H, W}, rng);
  {  // layer norm: forward with statistics, then its backward from them
    fusion::Graph fw;
    auto X = fw.input("x"), G = fw.input("gamma"), B = fw.input("beta");
    const auto r = fw.layer_norm_train(X, G, B, 1e-4);
    fw.output(r.y, "y");
    fw.output(r.mean, "mean");
    fw.output(r.inv_std, "inv_std");
    auto gamma = random({C, H, W}, rng), beta = random({C, H, W}, rng);
    const auto got = ops::Fusion(std::move(fw))(x, gamma, beta);
    const auto want = ops::layer_norm_forward(x, gamma, beta, 1e-4);
    require_close(got[0], want.y.to_vector(), 1e-12);
    CHECK(got[1].shape() == Shape{N, 1, 1, 1});
    require_close(got[1], want.mean.to_vector(), 1e-12);
    require_close(got[2], want.inv_std.to_vector(), 1e-12);

    fusion::Graph bw;
    auto DY = bw.input("dy"), X2 = bw.input("x"), G2 = bw.input("gamma"), M = bw.input("mean"), I = bw.input("inv_std");
    const auto d = bw.layer_norm_backward(DY, X2, G2, M, I);
    bw.output(d.dx, "dx");
    bw.output(d.dgamma, "dgamma");
    bw.output(d.dbeta, "dbeta");
    CHECK(bw.describe() == "%5 = layer_norm_backward(dy, x, gamma, mean, inv_std); dx = %5; dgamma = dgamma(%5); "
                           "dbeta = dbeta(%5)");
    const auto grads = ops::Fusion(std::move(bw))(dy, x, gamma, got[1], got[2]);
    const auto ref = ops::layer_norm_backward(x, dy, gamma, want.mean, want.inv_std);
    require_close(grads[0], ref.dx.to_vector(), 1e-12);
    CHECK(grads[1].shape() == gamma.shape());
    require_close(grads[1], ref.dgamma.to_vector(), 1e-12);
    require_close(grads[2], ref.dbeta.to_vector(), 1e-12);
  }
  {  // RMS norm likewise: inv_rms, dx and dgamma
    fusion::Graph fw;
    auto X = fw.input("x"), G = fw.input("gamma");
    const auto r = fw.rms_norm_train(X, G, 1e-5);
    CHECK(r.mean.id == -1);
    fw.output(r.y, "y");
    fw.output(r.inv_std, "inv_rms");
    auto gamma = random({C, H, W}, rng);
    const auto got = ops::Fusion(std::move(fw))(x, gamma);
    const auto want = ops::rms_norm_forward(x, gamma, 1e-5);
    require_close(got[0], want.y.to_vector(), 1e-12);
    require_close(got[1], want.inv_rms.to_vector(), 1e-12);

    fusion::Graph bw;
    auto DY = bw.input("dy"), X2 = bw.input("x"), G2 = bw.input("gamma"), I = bw.input("inv_rms");
    const auto d = bw.rms_norm_backward(DY, X2, G2, I);
    CHECK(d.dbeta.id == -1);
    bw.output(d.dx, "dx");
    bw.output(d.dgamma, "dgamma");
    const auto grads = ops::Fusion(std::move(bw))(dy, x, gamma, got[1]);
    const auto ref = ops::rms_norm_backward(x, dy, gamma, want.inv_rms);
    require_close(grads[0], ref.dx.to_vector(), 1e-12);
    require_close(grads[1], ref.dgamma.to_vector(), 1e-12);
  }
  {  // batch norm's backward from saved statistics
    auto gamma = random({C}, rng), beta = random({C}, rng), rm = random({C}, rng), rv = random({C}, rng);
    for (std::int64_t c = 0; c < C; ++c) rv.flat(c) = 1 + rv.flat(c) * rv.flat(c);
    const auto fwd = ops::batch_norm_forward_training(x, gamma, beta, rm, rv, {});
    fusion::Graph bw;
    auto DY = bw.input("dy"), X2 = bw.input("x"), G2 = bw.input("gamma"), M = bw.input("mean"), I = bw.input("inv_std");
    const auto d = bw.batch_norm_backward(DY, X2, G2, M, I);
    bw.output(d.dx, "dx");
    bw.output(d.dgamma, "dgamma");
    bw.output(d.dbeta, "dbeta");
    const Shape cs{C, 1, 1};
    const auto grads = ops::Fusion(std::move(bw))(tensors(dy.view(), x.view(), as(gamma, cs), as(fwd.save_mean, cs),
                                                          as(fwd.save_inv_std, cs)));
    const auto ref = ops::batch_norm_backward(x, dy, gamma, fwd.save_mean, fwd.save_inv_std);
    require_close(grads[0], ref.dx.to_vector(), 1e-12);
    CHECK(grads[1].shape() == cs);
    require_close(grads[1], ref.dgamma.to_vector(), 1e-12);
    require_close(grads[2], ref.dbeta.to_vector(), 1e-12);
  }
}

TEST_CASE("fusion: bad norm graphs name the pattern and the reason", "[fusion][norm][bad_input]") {
  Rng rng(23);
  const ops::Fusion bn(bn_relu(1e-5, 0.1));
  auto x = random({2, 3, 2, 2}, rng), c = random({3, 1, 1}, rng);
  run_cases({
      bad<InvalidArgument>("a statistic that reaches no output", "ops::Fusion", {"(mean(%5)) reaches no output"},
                           [] {
                             fusion::Graph g;
                             auto X = g.input("x"), G = g.input("g"), B = g.input("b");
                             auto M = g.input("m"), V = g.input("v");
                             const auto r = g.batch_norm(X, G, B, M, V);
                             g.output(r.y, "y");
                             g.output(r.inv_std, "inv_std");
                             g.output(r.running_mean, "rm");
                             g.output(r.running_var, "rv");
                             ops::Fusion{std::move(g)};
                           }),
      bad<InvalidArgument>("a statistic fed to a pointwise node", "ops::Fusion",
                           {"node 4 takes inv_rms(%2)", "may feed norms' parameters only"},
                           [] {
                             fusion::Graph g;
                             auto X = g.input("x"), G = g.input("g");
                             const auto r = g.rms_norm_train(X, G);
                             g.output(r.y, "y");
                             g.output(g.relu(r.inv_std), "z");
                             ops::Fusion{std::move(g)};
                           }),
      bad<InvalidArgument>("momentum", "fusion::Graph", {"batch_norm", "momentum must be in [0, 1], got 1.5"},
                           [] {
                             fusion::Graph g;
                             auto X = g.input("x"), G = g.input("g"), B = g.input("b");
                             auto M = g.input("m"), V = g.input("v");
                             g.batch_norm(X, G, B, M, V, 1e-5, 1.5);
                           }),
      bad<InvalidArgument>("batch norm gamma of [C]", "fusion", {"batch_norm", "gamma [3] must be [3,1,1]"},
                           [&] { bn(x, random({3}, rng), c, c, c); }),
      bad<InvalidArgument>("batch norm of a 2-d x", "fusion", {"batch_norm", "x [4,3] must be 4-d"},
                           [&] { bn(random({4, 3}, rng), c, c, c, c); }),
      bad<InvalidArgument>("backward dy shape", "fusion", {"layer_norm_backward", "dy [2,3,2,1] and x [2,3,2,2] differ"},
                           [&] {
                             fusion::Graph g;
                             auto DY = g.input("dy"), X = g.input("x"), G = g.input("g"), M = g.input("m");
                             auto I = g.input("i");
                             const auto d = g.layer_norm_backward(DY, X, G, M, I);
                             g.output(d.dx, "dx");
                             g.output(d.dgamma, "dg");
                             g.output(d.dbeta, "db");
                             auto s = random({2, 1, 1, 1}, rng);
                             ops::Fusion(std::move(g))(random({2, 3, 2, 1}, rng), x, random({3, 2, 2}, rng), s, s);
                           }),
      bad<InvalidArgument>("backward statistic shape", "fusion", {"rms_norm_backward", "inv_rms [2] must be [2,1,1,1]"},
                           [&] {
                             fusion::Graph g;
                             auto DY = g.input("dy"), X = g.input("x"), G = g.input("g"), I = g.input("i");
                             const auto d = g.rms_norm_backward(DY, X, G, I);
                             g.output(d.dx, "dx");
                             g.output(d.dgamma, "dg");
                             ops::Fusion(std::move(g))(x, x, random({3, 2, 2}, rng), random({2}, rng));
                           }),
  });
}

}  // namespace cutrain_test_fusion_norms
