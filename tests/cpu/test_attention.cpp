// scaled_dot_product_attention on the CPU: values against the composition of matmul, softmax and
// an additive mask (causal, padding lengths, grouped heads, a custom scale, [B, S, H, D] views),
// f64 gradient checks of q, k and v through autograd, f32 against f64, and bad input.
#include "bad_input.hpp"
#include "gradcheck.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cutrain/autograd/functions/attention.hpp"
#include "cutrain/autograd/functions/view.hpp"
#include "cutrain/core/cast.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/ops/attention.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/matmul.hpp"
#include "cutrain/ops/shape_ops.hpp"
#include "cutrain/ops/softmax.hpp"

namespace cutrain_test_attention {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

struct Case {
  std::string name;
  std::int64_t B, H, Hk, Sq, Skv, D, Dv;
  AttentionParams p;
  std::vector<std::int32_t> q_len{}, kv_len{};
};

std::vector<Case> cases() {
  return {
      {"plain", 2, 2, 2, 4, 4, 3, 3, {}},
      {"causal", 2, 2, 2, 5, 5, 4, 4, {.causal = true}},
      {"causal, more keys", 1, 2, 2, 3, 6, 4, 2, {.causal = true}},
      {"grouped heads", 2, 4, 2, 3, 5, 4, 3, {.scale = 0.7}},
      {"multi-query", 1, 3, 1, 4, 3, 2, 5, {}},
      {"padding", 2, 2, 1, 5, 6, 3, 3, {}, {5, 2}, {6, 3}},
      {"padding kv only, causal", 2, 2, 2, 4, 4, 3, 3, {.causal = true}, {}, {1, 3}},
      {"dropout", 2, 2, 2, 4, 5, 3, 3, {.dropout = 0.3, .seed = 7}},
      {"dropout, causal, grouped, padding", 2, 4, 2, 5, 6, 3, 2, {.causal = true, .dropout = 0.5, .seed = 11}, {5, 3}, {6, 2}},
  };
}

AttentionLengths lengths(const Case& c) {
  AttentionLengths l;
  if (!c.q_len.empty()) l.q = Tensor<std::int32_t>::from_vector(c.q_len, Shape{c.B});
  if (!c.kv_len.empty()) l.kv = Tensor<std::int32_t>::from_vector(c.kv_len, Shape{c.B});
  return l;
}

// o by composition: s = scale q kᵀ (k's heads repeated for the groups) + mask, softmax, times the
// dropout weights (0 where uniform_at(seed, index) < dropout, else 1 / (1 - dropout)), s v, with
// padded query rows set to zero.
Tensor<double> composed(const Case& c, const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v) {
  const std::int64_t g = c.H / c.Hk;
  std::vector<Tensor<double>> ks, vs;
  for (std::int64_t h = 0; h < c.H; ++h) {
    ks.push_back(slice(k, 1, h / g, h / g + 1));
    vs.push_back(slice(v, 1, h / g, h / g + 1));
  }
  const Tensor<double> kr = ops::concat(ks, 1), vr = ops::concat(vs, 1);
  const double scale = c.p.scale > 0 ? c.p.scale : 1 / std::sqrt(static_cast<double>(c.D));
  std::vector<double> mask(static_cast<std::size_t>(c.B * c.Sq * c.Skv), 0.0), rows(c.B * c.Sq, 1.0);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t i = 0; i < c.Sq; ++i) {
      const std::int64_t ql = c.q_len.empty() ? c.Sq : c.q_len[b], kl = c.kv_len.empty() ? c.Skv : c.kv_len[b];
      if (i >= ql) rows[b * c.Sq + i] = 0;
      for (std::int64_t j = 0; j < c.Skv; ++j)
        if (j >= kl || (c.p.causal && j > i)) mask[(b * c.Sq + i) * c.Skv + j] = -std::numeric_limits<double>::infinity();
    }
  const auto m = Tensor<double>::from_vector(mask, Shape{c.B, 1, c.Sq, c.Skv});
  const auto r = Tensor<double>::from_vector(rows, Shape{c.B, 1, c.Sq, 1});
  const auto s = ops::add(ops::scale(ops::matmul(q, transpose(kr, 2, 3)), scale), m);
  std::vector<double> drop(static_cast<std::size_t>(c.B * c.H * c.Sq * c.Skv), 1.0);
  for (std::size_t i = 0; i < drop.size() && c.p.dropout > 0; ++i)
    drop[i] = uniform_at(c.p.seed, i) < c.p.dropout ? 0.0 : 1.0 / (1.0 - c.p.dropout);
  const auto d = Tensor<double>::from_vector(drop, Shape{c.B, c.H, c.Sq, c.Skv});
  return ops::mul(ops::matmul(ops::mul(ops::softmax_forward(s, -1), d), vr), r);
}


}  // namespace

TEST_CASE("attention forward matches matmul + softmax", "[attention]") {
  Rng rng(2101);
  for (const Case& c : cases()) {
    INFO(c.name);
    const auto q = random({c.B, c.H, c.Sq, c.D}, rng), k = random({c.B, c.Hk, c.Skv, c.D}, rng),
               v = random({c.B, c.Hk, c.Skv, c.Dv}, rng);
    const auto r = ops::scaled_dot_product_attention_forward(q, k, v, c.p, lengths(c));
    CHECK(r.o.shape() == Shape{c.B, c.H, c.Sq, c.Dv});
    CHECK(r.stats.shape() == Shape{c.B, c.H, c.Sq});
    CHECK(max_diff(r.o, composed(c, q, k, v)) < 1e-12);
  }
}

TEST_CASE("attention: [B, S, H, D] views give the same results", "[attention]") {
  Rng rng(2102);
  const Case c{"bshd", 2, 4, 2, 5, 5, 4, 4, {.causal = true}};
  const auto qm = random({c.B, c.Sq, c.H, c.D}, rng), km = random({c.B, c.Skv, c.Hk, c.D}, rng),
             vm = random({c.B, c.Skv, c.Hk, c.Dv}, rng);
  const auto q = permute(qm, {0, 2, 1, 3}), k = permute(km, {0, 2, 1, 3}), v = permute(vm, {0, 2, 1, 3});
  const auto a = ops::scaled_dot_product_attention_forward(q, k, v, c.p);
  const auto b = ops::scaled_dot_product_attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), c.p);
  CHECK(max_diff(a.o, b.o) == 0);
  const auto dout = random({c.B, c.H, c.Sq, c.Dv}, rng);
  const auto ga = ops::scaled_dot_product_attention_backward(q, k, v, a.o, dout, a.stats, c.p);
  const auto gb = ops::scaled_dot_product_attention_backward(q.contiguous(), k.contiguous(), v.contiguous(), b.o, dout,
                                                            b.stats, c.p);
  CHECK(max_diff(ga.dq, gb.dq) == 0);
  CHECK(max_diff(ga.dk, gb.dk) == 0);
  CHECK(max_diff(ga.dv, gb.dv) == 0);
}

TEST_CASE("attention gradients (f64)", "[attention][gradcheck]") {
  Rng rng(2103);
  for (const Case& c : cases()) {
    INFO(c.name);
    auto q = random({c.B, c.H, c.Sq, c.D}, rng), k = random({c.B, c.Hk, c.Skv, c.D}, rng),
         v = random({c.B, c.Hk, c.Skv, c.Dv}, rng);
    const auto r = random({c.B, c.H, c.Sq, c.Dv}, rng);
    const AttentionLengths lens = lengths(c);
    Var<double> vq = autograd::parameter(q.view()), vk = autograd::parameter(k.view()), vv = autograd::parameter(v.view());
    Var<double> o = autograd::scaled_dot_product_attention(vq, vk, vv, c.p, lens);
    o.backward(r);
    const auto f = [&] { return ops::scaled_dot_product_attention_forward(q, k, v, c.p, lens).o; };
    gradcheck("attention dq " + c.name, q, f, vq.grad(), r);
    gradcheck("attention dk " + c.name, k, f, vk.grad(), r);
    gradcheck("attention dv " + c.name, v, f, vv.grad(), r);
  }
}

TEST_CASE("attention in f32 agrees with f64", "[attention]") {
  Rng rng(2104);
  const Case c{"f32", 2, 4, 2, 6, 7, 8, 8, {.causal = true}};
  const auto q = random({c.B, c.H, c.Sq, c.D}, rng), k = random({c.B, c.Hk, c.Skv, c.D}, rng),
             v = random({c.B, c.Hk, c.Skv, c.Dv}, rng), dout = random({c.B, c.H, c.Sq, c.Dv}, rng);
  const auto r64 = ops::scaled_dot_product_attention_forward(q, k, v, c.p);
  const auto g64 = ops::scaled_dot_product_attention_backward(q, k, v, r64.o, dout, r64.stats, c.p);
  const auto f = [](const Tensor<double>& t) { return cast<float>(t); };
  const auto r32 = ops::scaled_dot_product_attention_forward(f(q), f(k), f(v), c.p);
  const auto g32 = ops::scaled_dot_product_attention_backward(f(q), f(k), f(v), r32.o, f(dout), r32.stats, c.p);
  const auto d = [](const Tensor<float>& t) { return cast<double>(t); };
  CHECK(max_diff(d(r32.o), r64.o) < 1e-5);
  CHECK(max_diff(d(r32.stats), r64.stats) < 1e-5);
  CHECK(max_diff(d(g32.dq), g64.dq) < 1e-5);
  CHECK(max_diff(d(g32.dk), g64.dk) < 1e-5);
  CHECK(max_diff(d(g32.dv), g64.dv) < 1e-5);
}

TEST_CASE("bad input: attention", "[attention][bad_input]") {
  using D = Tensor<double>;
  const auto z = [](Shape s) { return D::zeros(s); };
  const auto len = [](std::vector<std::int32_t> v) {
    return Tensor<std::int32_t>::from_vector(v, Shape{static_cast<std::int64_t>(v.size())});
  };
  const auto q = z({2, 4, 3, 8}), k = z({2, 2, 5, 8}), v = z({2, 2, 5, 6});
  const auto fwd = [](const D& q, const D& k, const D& v, AttentionParams p = {}, AttentionLengths l = {}) {
    (void)ops::scaled_dot_product_attention_forward(q, k, v, p, l);
  };
  constexpr const char* op = "scaled_dot_product_attention";
  run_cases({
      bad<InvalidArgument>("q rank", op, {"q [B, H, Sq, D] must be 4-d", "[4,3,8]"}, [&] { fwd(z({4, 3, 8}), k, v); }),
      bad<InvalidArgument>("k rank", op, {"k [B, Hk, Skv, D] must be 4-d", "[5,8]"}, [&] { fwd(q, z({5, 8}), v); }),
      bad<InvalidArgument>("undefined v", op, {"v [B, Hk, Skv, Dv] is an empty"}, [&] { fwd(q, k, D{}); }),
      bad<InvalidArgument>("empty q", op, {"q has no elements", "[2,4,0,8]"}, [&] { fwd(z({2, 4, 0, 8}), k, v); }),
      bad<InvalidArgument>("head dims", op, {"q's B and D", "[2,2,5,4]", "[2,4,3,8]"},
                           [&] { fwd(q, z({2, 2, 5, 4}), v); }),
      bad<InvalidArgument>("batch", op, {"q's B and D", "[1,2,5,8]"}, [&] { fwd(q, z({1, 2, 5, 8}), v); }),
      bad<InvalidArgument>("v keys", op, {"k's B, Hk and Skv", "[2,2,4,6]", "[2,2,5,8]"},
                           [&] { fwd(q, k, z({2, 2, 4, 6})); }),
      bad<InvalidArgument>("heads not a multiple", op, {"4 heads must be a multiple", "3"},
                           [&] { fwd(q, z({2, 3, 5, 8}), z({2, 3, 5, 6})); }),
      bad<InvalidArgument>("negative scale", op, {"scale", "-1"}, [&] { fwd(q, k, v, {.scale = -1}); }),
      bad<InvalidArgument>("nan scale", op, {"scale", "nan"},
                           [&] { fwd(q, k, v, {.scale = std::numeric_limits<double>::quiet_NaN()}); }),
      bad<InvalidArgument>("dropout 1", op, {"dropout must be in [0, 1)", "1"}, [&] { fwd(q, k, v, {.dropout = 1}); }),
      bad<InvalidArgument>("negative dropout", op, {"dropout must be in [0, 1)", "-0.1"},
                           [&] { fwd(q, k, v, {.dropout = -0.1}); }),
      bad<InvalidArgument>("nan dropout", op, {"dropout must be in [0, 1)", "nan"},
                           [&] { fwd(q, k, v, {.dropout = std::numeric_limits<double>::quiet_NaN()}); }),
      bad<InvalidArgument>("q lengths shape", op, {"lengths.q must be int32 [2]", "[3]"},
                           [&] { fwd(q, k, v, {}, {.q = len({1, 2, 3})}); }),
      bad<InvalidArgument>("q length too long", op, {"lengths.q[1] = 4", "[1, 3]"},
                           [&] { fwd(q, k, v, {}, {.q = len({1, 4})}); }),
      bad<InvalidArgument>("kv length zero", op, {"lengths.kv[0] = 0", "[1, 5]"},
                           [&] { fwd(q, k, v, {}, {.kv = len({0, 5})}); }),
      bad<InvalidArgument>("backward o shape", "scaled_dot_product_attention_backward", {"o must have shape [2,4,3,6]", "[2,4,3,8]"},
                           [&] {
                             (void)ops::scaled_dot_product_attention_backward(q, k, v, z({2, 4, 3, 8}), z({2, 4, 3, 6}),
                                                                             z({2, 4, 3}));
                           }),
      bad<InvalidArgument>("backward stats shape", "scaled_dot_product_attention_backward", {"stats must have shape [2,4,3]", "[2,4,3,1]"},
                           [&] {
                             (void)ops::scaled_dot_product_attention_backward(q, k, v, z({2, 4, 3, 6}), z({2, 4, 3, 6}),
                                                                             z({2, 4, 3, 1}));
                           }),
      bad<InvalidArgument>("autograd undefined", "autograd::scaled_dot_product_attention", {"k is an undefined"},
                           [&] { (void)autograd::scaled_dot_product_attention(Var<double>(q.view()), Var<double>{}, Var<double>(v.view())); }),
  });
  CUTRAIN_REQUIRE_THROWS_OP(ops::scaled_dot_product_attention_forward(Tensor<bfloat16>::zeros({1, 1, 2, 8}),
                                                                      Tensor<bfloat16>::zeros({1, 1, 2, 8}),
                                                                      Tensor<bfloat16>::zeros({1, 1, 2, 8})),
                            NotImplemented, "scaled_dot_product_attention");
}

// The GPU's fallback (cuDNN has no engine: f32, odd head dims) composes matmuls; it runs on any
// device, so it is checked here against the reference too.
TEST_CASE("attention composed from matmuls matches the reference", "[attention]") {
  Rng rng(2105);
  for (const Case& c : cases()) {
    INFO(c.name);
    const auto f = [](const Tensor<double>& t) { return cast<float>(t); };
    const auto d = [](const Tensor<float>& t) { return cast<double>(t); };
    const auto q = f(random({c.B, c.H, c.Sq, c.D}, rng)), k = f(random({c.B, c.Hk, c.Skv, c.D}, rng)),
               v = f(random({c.B, c.Hk, c.Skv, c.Dv}, rng)), dout = f(random({c.B, c.H, c.Sq, c.Dv}, rng));
    const auto g = ops::detail::attention_geometry("test", q, k, v, c.p, lengths(c));
    const auto ref = ops::scaled_dot_product_attention_forward(q, k, v, c.p, lengths(c));
    CHECK(ref.mask == (c.p.dropout > 0 ? DropoutMask::cutrain : DropoutMask::none));
    const auto gref =
        ops::scaled_dot_product_attention_backward(q, k, v, ref.o, dout, ref.stats, c.p, lengths(c), ref.mask);
    const auto com = ops::detail::attention_forward_composed(q, k, v, g);
    CHECK(max_diff(d(com.o), d(ref.o)) < 1e-5);
    // Padded rows' statistics are unspecified: compare the others.
    const auto sc = com.stats.to_vector(), sr = ref.stats.to_vector();
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t i = 0; i < g.rows(b); ++i)
        for (std::int64_t h = 0; h < c.H; ++h) {
          const std::size_t at = static_cast<std::size_t>((b * c.H + h) * c.Sq + i);
          CHECK(std::abs(sc[at] - sr[at]) < 1e-5);
        }
    const auto gcom = ops::detail::attention_backward_composed(q, k, v, ref.o, dout, ref.stats, g);
    CHECK(max_diff(d(gcom.dq), d(gref.dq)) < 1e-5);
    CHECK(max_diff(d(gcom.dk), d(gref.dk)) < 1e-5);
    CHECK(max_diff(d(gcom.dv), d(gref.dv)) < 1e-5);
  }
}

// Dropout's mask is a function of the seed: the same seed gives the same output, another seed
// another one, and an explicit keep mask equal to the seed's gives the same results (the GPU
// tests hand cuDNN's mask to the CPU that way). Roughly `dropout` of the weights are zero.
TEST_CASE("attention dropout: seeds and explicit masks", "[attention]") {
  Rng rng(2106);
  const Case c{"dropout", 2, 2, 2, 16, 16, 4, 4, {.dropout = 0.25, .seed = 99}};
  const auto q = random({c.B, c.H, c.Sq, c.D}, rng), k = random({c.B, c.Hk, c.Skv, c.D}, rng),
             v = random({c.B, c.Hk, c.Skv, c.Dv}, rng), dout = random({c.B, c.H, c.Sq, c.Dv}, rng);
  const auto a = ops::scaled_dot_product_attention_forward(q, k, v, c.p);
  CHECK(max_diff(a.o, ops::scaled_dot_product_attention_forward(q, k, v, c.p).o) == 0);
  AttentionParams other = c.p;
  other.seed = 100;
  CHECK(max_diff(a.o, ops::scaled_dot_product_attention_forward(q, k, v, other).o) > 1e-3);
  CHECK(max_diff(a.o, ops::scaled_dot_product_attention_forward(q, k, v, {}).o) > 1e-3);
  // Statistics are the undropped softmax's.
  CHECK(max_diff(a.stats, ops::scaled_dot_product_attention_forward(q, k, v, {}).stats) < 1e-12);
  auto g = ops::detail::attention_geometry("test", q, k, v, c.p, {});
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(c.B * c.H * c.Sq * c.Skv); ++i) {
    const bool keep = uniform_at(c.p.seed, i) >= c.p.dropout;
    g.keep.push_back(keep ? 1.0f : 0.0f);
    dropped += keep ? 0 : 1;
  }
  const double frac = static_cast<double>(dropped) / static_cast<double>(g.keep.size());
  CHECK(frac > 0.2);
  CHECK(frac < 0.3);
  const auto e = cpu::attention_forward(q, k, v, g);
  CHECK(max_diff(a.o, e.o) == 0);
  const auto ga = ops::scaled_dot_product_attention_backward(q, k, v, a.o, dout, a.stats, c.p, {}, a.mask);
  const auto ge = cpu::attention_backward(q, k, v, e.o, dout, e.stats, g);
  // With dropout the backward needs to know which generator drew the mask.
  CUTRAIN_REQUIRE_THROWS_OP(ops::scaled_dot_product_attention_backward(q, k, v, a.o, dout, a.stats, c.p),
                            InvalidArgument, "AttentionForward::mask");
  CUTRAIN_REQUIRE_THROWS_OP(
      ops::scaled_dot_product_attention_backward(q, k, v, a.o, dout, a.stats, c.p, {}, DropoutMask::cudnn),
      InvalidArgument, "drawn by cuDNN");
  CHECK(max_diff(ga.dq, ge.dq) == 0);
  CHECK(max_diff(ga.dk, ge.dk) == 0);
  CHECK(max_diff(ga.dv, ge.dv) == 0);
  for (float& x : g.keep) x = 1.0f - x;  // the complement: another output
  CHECK(max_diff(a.o, cpu::attention_forward(q, k, v, g).o) > 1e-3);
}

// qkv_attention over a fused [B, S, 3, H, D] tensor: the same output and gradient as attention
// of its three slices through autograd (which sums three zero-filled slice gradients), with
// dropout and causal masks; and its bad input.
TEST_CASE("qkv_attention equals attention of the three slices", "[attention]") {
  Rng rng(2107);
  const std::int64_t B = 2, S = 5, H = 3, D = 4;
  const auto x = random({B, S, 3, H, D}, rng), dout = random({B, H, S, D}, rng);
  for (const AttentionParams p : {AttentionParams{}, AttentionParams{.causal = true, .dropout = 0.3, .seed = 4}}) {
    Var<double> a = autograd::parameter(x.clone()), b = autograd::parameter(x.clone());
    Var<double> oa = autograd::qkv_attention(a, p);
    const auto part = [&](int i) {
      return autograd::permute(autograd::squeeze(autograd::slice(b, 2, i, i + 1), 2), {0, 2, 1, 3});
    };
    Var<double> ob = autograd::scaled_dot_product_attention(part(0), part(1), part(2), p);
    CHECK(max_diff(oa.value(), ob.value()) == 0);
    oa.backward(dout);
    ob.backward(dout);
    CHECK(max_diff(a.grad(), b.grad()) < 1e-14);
  }
  CUTRAIN_REQUIRE_THROWS_OP(autograd::qkv_attention(Var<double>(Tensor<double>::zeros({2, 5, 2, 3, 4}))),
                            InvalidArgument, "autograd::qkv_attention");
}

}  // namespace cutrain_test_attention
