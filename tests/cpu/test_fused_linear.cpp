// The fused linear ops of a transformer block: autograd::gelu_mlp and autograd::linear_residual
// equal the composed ops (linear, gelu_tanh, linear, add) in values and gradients, pass f64
// gradient checks for every input, and refuse bad input naming the op; nn::TransformerBlock (which
// uses them) equals the block written out with the composed ops.
#include "bad_input.hpp"
#include "gradcheck.hpp"

#include <functional>
#include <string>
#include <vector>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/nn/transformer.hpp"
#include "cutrain/ops/mlp.hpp"

namespace cutrain_test_fused_linear {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

Var<double> leaf(const Tensor<double>& t) { return autograd::parameter(t.clone()); }

struct Mlp {
  Tensor<double> x, w1, b1, w2, b2, r;
};

Mlp random_mlp(Rng& rng, std::int64_t n, std::int64_t in, std::int64_t hidden, std::int64_t out, bool biases,
               bool residual) {
  return {random({n, in}, rng), random({hidden, in}, rng), biases ? random({hidden}, rng) : Tensor<double>{},
          random({out, hidden}, rng), biases ? random({out}, rng) : Tensor<double>{},
          residual ? random({n, out}, rng) : Tensor<double>{}};
}

}  // namespace

TEST_CASE("autograd::gelu_mlp equals linear, gelu_tanh, linear and add, values and gradients", "[fused_linear]") {
  Rng rng(8101);
  for (const bool biases : {true, false}) {
    for (const bool residual : {true, false}) {
      INFO("biases " << biases << ", residual " << residual);
      const Mlp m = random_mlp(rng, 6, 5, 12, 4, biases, residual);
      std::vector<Var<double>> fused_in, plain_in;
      for (const Tensor<double>* t : {&m.x, &m.w1, &m.b1, &m.w2, &m.b2, &m.r}) {
        fused_in.push_back(t->defined() ? leaf(*t) : Var<double>{});
        plain_in.push_back(t->defined() ? leaf(*t) : Var<double>{});
      }
      const Var<double> fused =
          autograd::gelu_mlp(fused_in[0], fused_in[1], fused_in[2], fused_in[3], fused_in[4], fused_in[5]);
      Var<double> plain = autograd::linear(
          autograd::gelu(autograd::linear(plain_in[0], plain_in[1], plain_in[2]), /*tanh_approximation=*/true),
          plain_in[3], plain_in[4]);
      if (residual) plain = autograd::add(plain, plain_in[5]);
      CHECK(max_diff(fused.value(), plain.value()) < 1e-12);
      const Tensor<double> dy = random(fused.value().shape(), rng);
      fused.backward(dy);
      plain.backward(dy);
      for (std::size_t i = 0; i < fused_in.size(); ++i) {
        if (!fused_in[i].defined()) continue;
        INFO("input " << i);
        CHECK(max_diff(fused_in[i].grad(), plain_in[i].grad()) < 1e-12);
      }
    }
  }
}

TEST_CASE("autograd::gelu_mlp and linear_residual gradients (f64)", "[fused_linear][gradcheck]") {
  Rng rng(8102);
  Mlp m = random_mlp(rng, 5, 4, 9, 3, true, true);
  Tensor<double>* inputs[] = {&m.x, &m.w1, &m.b1, &m.w2, &m.b2, &m.r};
  const char* names[] = {"x", "w1", "b1", "w2", "b2", "r"};
  const std::function<Tensor<double>()> mlp = [&] {
    autograd::NoGradGuard off;
    return autograd::gelu_mlp(Var<double>(m.x.view()), Var<double>(m.w1.view()), Var<double>(m.b1.view()),
                              Var<double>(m.w2.view()), Var<double>(m.b2.view()), Var<double>(m.r.view()))
        .value()
        .view();
  };
  const Tensor<double> dy = random({5, 3}, rng);
  for (std::size_t i = 0; i < 6; ++i) {
    std::vector<Var<double>> v;
    for (Tensor<double>* t : inputs) v.push_back(Var<double>(t->view()));
    v[i] = autograd::parameter(inputs[i]->view());
    autograd::gelu_mlp(v[0], v[1], v[2], v[3], v[4], v[5]).backward(dy);
    gradcheck(std::string("gelu_mlp ") + names[i], *inputs[i], mlp, v[i].grad(), dy, 1e-6);
  }

  Tensor<double> x = random({5, 4}, rng), w = random({3, 4}, rng), b = random({3}, rng), r = random({5, 3}, rng);
  Tensor<double>* lin[] = {&x, &w, &b, &r};
  const char* lin_names[] = {"x", "w", "b", "r"};
  const std::function<Tensor<double>()> fwd = [&] {
    autograd::NoGradGuard off;
    return autograd::linear_residual(Var<double>(x.view()), Var<double>(w.view()), Var<double>(b.view()), Var<double>(r.view())).value().view();
  };
  for (std::size_t i = 0; i < 4; ++i) {
    std::vector<Var<double>> v;
    for (Tensor<double>* t : lin) v.push_back(Var<double>(t->view()));
    v[i] = autograd::parameter(lin[i]->view());
    autograd::linear_residual(v[0], v[1], v[2], v[3]).backward(dy);
    gradcheck(std::string("linear_residual ") + lin_names[i], *lin[i], fwd, v[i].grad(), dy, 1e-6);
  }
}

TEST_CASE("nn::TransformerBlock equals the block written out with the composed ops", "[fused_linear][transformer]") {
  Rng rng(8103);
  nn::TransformerBlock<double> block({.dim = 8, .heads = 2, .seed = 4});
  for (auto& [name, p] : block.named_parameters()) p.value() = random(p.value().shape(), rng);
  const Tensor<double> xt = random({2, 5, 8}, rng);
  const Var<double> x1 = autograd::parameter(xt.clone()), x2 = autograd::parameter(xt.clone());
  const Var<double> fused = block(x1);
  // x + attn(ln1(x)), then h + fc2(gelu_tanh(fc1(ln2(h)))), op by op.
  const Var<double> h = autograd::add(x2, block.attn(block.ln1(x2)));
  const Var<double> flat = autograd::reshape(block.ln2(h), Shape{10, 8});
  const Var<double> mlp = block.fc2(autograd::gelu(block.fc1(flat), true));
  const Var<double> plain = autograd::add(h, autograd::reshape(mlp, Shape{2, 5, 8}));
  CHECK(max_diff(fused.value(), plain.value()) < 1e-12);
  const Tensor<double> dy = random({2, 5, 8}, rng);
  std::vector<Tensor<double>> fused_grads, plain_grads;
  fused.backward(dy);
  for (auto& p : block.parameters()) fused_grads.push_back(p.grad().clone());
  for (auto& p : block.parameters()) p.zero_grad();
  plain.backward(dy);
  for (auto& p : block.parameters()) plain_grads.push_back(p.grad().clone());
  REQUIRE(fused_grads.size() == plain_grads.size());
  for (std::size_t i = 0; i < fused_grads.size(); ++i) CHECK(max_diff(fused_grads[i], plain_grads[i]) < 1e-12);
  CHECK(max_diff(x1.grad(), x2.grad()) < 1e-12);
}

TEST_CASE("bad input: gelu_mlp and linear_residual", "[fused_linear][bad_input]") {
  Rng rng(8104);
  const Mlp m = random_mlp(rng, 3, 4, 6, 2, true, true);
  const auto fwd = [&](const Tensor<double>& x, const Tensor<double>& w1, const Tensor<double>& b1,
                       const Tensor<double>& w2, const Tensor<double>& b2, const Tensor<double>& r) {
    return ops::gelu_mlp_forward(x, w1, b1, w2, b2, r);
  };
  const char* op = "gelu_mlp_forward";
  CUTRAIN_REQUIRE_THROWS_OP(fwd(random({3, 5}, rng), m.w1, m.b1, m.w2, m.b2, m.r), InvalidArgument, op);  // in
  CUTRAIN_REQUIRE_THROWS_OP(fwd(m.x, m.w1, m.b1, random({2, 5}, rng), m.b2, m.r), InvalidArgument, op);   // hidden
  CUTRAIN_REQUIRE_THROWS_OP(fwd(m.x, m.w1, random({5}, rng), m.w2, m.b2, m.r), InvalidArgument, op);      // b1
  CUTRAIN_REQUIRE_THROWS_OP(fwd(m.x, m.w1, m.b1, m.w2, random({3}, rng), m.r), InvalidArgument, op);      // b2
  CUTRAIN_REQUIRE_THROWS_OP(fwd(m.x, m.w1, m.b1, m.w2, m.b2, random({3, 3}, rng)), InvalidArgument, op);  // r
  CUTRAIN_REQUIRE_THROWS_OP(fwd(random({3, 4, 1}, rng), m.w1, m.b1, m.w2, m.b2, m.r), InvalidArgument, op);
  CUTRAIN_REQUIRE_THROWS_OP(fwd(Tensor<double>{}, m.w1, m.b1, m.w2, m.b2, m.r), InvalidArgument, op);
  const GeluMlpForward<double> f = ops::gelu_mlp_forward(m.x, m.w1, m.b1, m.w2, m.b2, m.r);
  CUTRAIN_REQUIRE_THROWS_OP(ops::gelu_mlp_backward(m.x, m.w1, m.w2, f.z, f.g, random({3, 3}, rng), true, true),
                            InvalidArgument, "gelu_mlp_backward");
  CUTRAIN_REQUIRE_THROWS_OP(ops::gelu_mlp_backward(m.x, m.w1, m.w2, f.g.reshape({6, 3}), f.g, random({3, 2}, rng), true,
                                                   true),
                            InvalidArgument, "gelu_mlp_backward");
  CUTRAIN_REQUIRE_THROWS_OP(autograd::gelu_mlp(Var<double>(m.x.view()), Var<double>{}, Var<double>(m.b1.view()), Var<double>(m.w2.view()),
                                               Var<double>(m.b2.view())),
                            InvalidArgument, "autograd::gelu_mlp");
  CUTRAIN_REQUIRE_THROWS_OP(autograd::linear_residual(Var<double>(m.x.view()), Var<double>(random({2, 4}, rng)), Var<double>{},
                                                      Var<double>{}),
                            InvalidArgument, "autograd::linear_residual");
  CUTRAIN_REQUIRE_THROWS_OP(autograd::linear_residual(Var<double>(m.x.view()), Var<double>(random({2, 4}, rng)), Var<double>{},
                                                      Var<double>(random({2, 3}, rng))),
                            InvalidArgument, "linear_residual_forward");
  nn::MultiheadAttention<double> attn({.dim = 4, .heads = 2});
  CUTRAIN_REQUIRE_THROWS_OP(attn(Var<double>(random({1, 3, 4}, rng)), Var<double>(random({1, 2, 4}, rng))),
                            InvalidArgument, "nn::MultiheadAttention");
}

}  // namespace cutrain_test_fused_linear
