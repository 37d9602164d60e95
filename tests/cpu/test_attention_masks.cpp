// scaled_dot_product_attention's masks on the CPU: an additive bias (full and broadcast), a
// boolean mask, bottom-right causal alignment (Sq < Skv and Sq > Skv), sliding windows and logit
// soft-capping, alone and with padding lengths, grouped heads and dropout: values against a
// naive loop, f64 gradient checks of q, k, v and the bias (dbias summed over broadcast dims)
// through autograd, rows left with no key (zero output and gradients), the composed GPU fallback
// run on the CPU in f32, identities (a window wider than the keys, a zero bias), and bad input.
#include "bad_input.hpp"
#include "gradcheck.hpp"

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cutrain/autograd/functions/attention.hpp"
#include "cutrain/core/cast.hpp"
#include "cutrain/ops/attention.hpp"

namespace cutrain_test_attention_masks {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

struct Case {
  std::string name;
  std::int64_t B, H, Hk, Sq, Skv, D, Dv;
  AttentionParams p;
  Shape bias{};     // empty: no bias
  Shape allowed{};  // empty: no boolean mask
  std::vector<std::int32_t> q_len{}, kv_len{};
  bool empty_row = false;  // the boolean mask drops every key of row 1 (batch 0, head 0)
};

constexpr auto br = CausalAlign::bottom_right;

std::vector<Case> cases() {
  return {
      {"bias", 2, 2, 2, 4, 5, 3, 3, {}, {2, 2, 4, 5}},
      {"bias [1, H], gqa, causal", 2, 4, 2, 5, 5, 3, 2, {.causal = true}, {1, 4, 5, 5}},
      {"bias [B, 1], mask [1, 1]", 2, 2, 1, 4, 6, 3, 3, {.scale = 0.8}, {2, 1, 4, 6}, {1, 1, 4, 6}},
      {"mask [B, H], a row with no key", 2, 2, 2, 4, 5, 3, 3, {}, {}, {2, 2, 4, 5}, {}, {}, true},
      {"bottom-right, decoding (Sq < Skv)", 2, 2, 2, 3, 7, 4, 3, {.causal = true, .align = br}},
      {"bottom-right, Sq > Skv (rows with no key)", 1, 2, 1, 6, 4, 3, 3, {.causal = true, .align = br}},
      {"bottom-right, padding", 2, 2, 2, 5, 6, 3, 3, {.causal = true, .align = br}, {}, {}, {3, 5}, {6, 2}},
      {"window", 1, 2, 2, 6, 6, 3, 3, {.causal = true, .window = 2}},
      {"window, bottom-right, gqa, bias", 2, 4, 2, 3, 8, 3, 3, {.causal = true, .align = br, .window = 3},
       {1, 1, 3, 8}},
      {"window past the keys (top-left, Sq > Skv)", 1, 1, 1, 7, 4, 3, 3, {.causal = true, .window = 2}},
      {"softcap", 2, 2, 2, 4, 5, 3, 3, {.scale = 2.0, .softcap = 1.5}},
      {"softcap, causal, window, bias, mask", 2, 2, 1, 5, 5, 3, 3,
       {.causal = true, .window = 3, .scale = 1.5, .softcap = 2.0}, {2, 2, 5, 5}, {1, 2, 5, 5}},
      {"everything: padding, gqa, dropout", 2, 4, 2, 5, 6, 3, 2,
       {.causal = true, .align = br, .window = 4, .dropout = 0.3, .seed = 9, .softcap = 3.0}, {2, 1, 5, 6},
       {1, 4, 5, 6}, {4, 5}, {6, 3}},
  };
}

AttentionLengths lengths(const Case& c) {
  AttentionLengths l;
  if (!c.q_len.empty()) l.q = Tensor<std::int32_t>::from_vector(c.q_len, Shape{c.B});
  if (!c.kv_len.empty()) l.kv = Tensor<std::int32_t>::from_vector(c.kv_len, Shape{c.B});
  return l;
}

// Element (b, h, i, j) of a [B or 1, H or 1, S, E] tensor, broadcast over its dims of size 1.
template <class U>
U& at(const Tensor<U>& t, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
  const Shape& s = t.shape();
  return t.flat((((s[0] == 1 ? 0 : b) * s[1] + (s[1] == 1 ? 0 : h)) * s[2] + i) * s[3] + j);
}

// A boolean mask of the case's shape: about 1 in 4 keys dropped, at random.
Tensor<std::uint8_t> random_allowed(const Case& c, Rng& rng) {
  if (c.allowed.rank() == 0) return {};
  std::vector<std::uint8_t> v(static_cast<std::size_t>(c.allowed.numel()));
  for (auto& x : v) x = rng.uniform() < 0.25 ? 0 : 1;
  if (c.empty_row)
    for (std::int64_t j = 0; j < c.Skv; ++j) v[static_cast<std::size_t>(1 * c.Skv + j)] = 0;
  return Tensor<std::uint8_t>::from_vector(v, c.allowed);
}

template <class T>
AttentionMask<T> view_of(const Tensor<T>& bias, const Tensor<std::uint8_t>& allowed) {
  return {bias.defined() ? bias.view() : Tensor<T>{}, allowed.defined() ? allowed.view() : Tensor<std::uint8_t>{}};
}

// o by the definition, one (b, h, i) at a time, written apart from cpu/attention.hpp: the key j
// takes part when it is inside kv_len, not past the aligned diagonal (causal), inside the window,
// and allowed; the score is scale q.k, soft-capped, plus the bias; rows with no key are zero.
Tensor<double> naive(const Case& c, const Tensor<double>& q, const Tensor<double>& k, const Tensor<double>& v,
                     const Tensor<double>& bias, const Tensor<std::uint8_t>& allowed) {
  std::vector<double> o(static_cast<std::size_t>(c.B * c.H * c.Sq * c.Dv), 0.0);
  const double scale = c.p.scale > 0 ? c.p.scale : 1 / std::sqrt(static_cast<double>(c.D));
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.H; ++h)
      for (std::int64_t i = 0; i < c.Sq; ++i) {
        const std::int64_t ql = c.q_len.empty() ? c.Sq : c.q_len[b], kl = c.kv_len.empty() ? c.Skv : c.kv_len[b];
        if (i >= ql) continue;
        const std::int64_t diag = c.p.align == br ? i + (kl - ql) : i;
        std::vector<double> s(static_cast<std::size_t>(c.Skv), -inf);
        for (std::int64_t j = 0; j < kl; ++j) {
          if (c.p.causal && j > diag) continue;
          if (c.p.window > 0 && j <= diag - c.p.window) continue;
          if (allowed.defined() && at(allowed, b, h, i, j) == 0) continue;
          double x = 0;
          for (std::int64_t d = 0; d < c.D; ++d) x += at(q, b, h, i, d) * at(k, b, h / (c.H / c.Hk), j, d);
          x *= scale;
          if (c.p.softcap > 0) x = c.p.softcap * std::tanh(x / c.p.softcap);
          if (bias.defined()) x += at(bias, b, h, i, j);
          s[static_cast<std::size_t>(j)] = x;
        }
        double mx = -inf, sum = 0;
        for (double x : s) mx = std::max(mx, x);
        if (mx == -inf) continue;
        for (double x : s) sum += std::exp(x - mx);
        for (std::int64_t j = 0; j < c.Skv; ++j) {
          const auto index = static_cast<std::uint64_t>(((b * c.H + h) * c.Sq + i) * c.Skv + j);
          double w = std::exp(s[static_cast<std::size_t>(j)] - mx) / sum;
          if (c.p.dropout > 0) w = uniform_at(c.p.seed, index) < c.p.dropout ? 0.0 : w / (1 - c.p.dropout);
          for (std::int64_t d = 0; d < c.Dv; ++d)
            o[static_cast<std::size_t>(((b * c.H + h) * c.Sq + i) * c.Dv + d)] += w * at(v, b, h / (c.H / c.Hk), j, d);
        }
      }
  return Tensor<double>::from_vector(o, Shape{c.B, c.H, c.Sq, c.Dv});
}

struct Inputs {
  Tensor<double> q, k, v, dout, bias;
  Tensor<std::uint8_t> allowed;
};

Inputs inputs(const Case& c, Rng& rng) {
  Inputs in{random({c.B, c.H, c.Sq, c.D}, rng), random({c.B, c.Hk, c.Skv, c.D}, rng),
            random({c.B, c.Hk, c.Skv, c.Dv}, rng), random({c.B, c.H, c.Sq, c.Dv}, rng), Tensor<double>{},
            random_allowed(c, rng)};
  if (c.bias.rank() > 0) in.bias = ops::scale(random(c.bias, rng), 2.0);
  return in;
}

// Rows of o that the definition leaves without a key: all zero in o and in dq.
std::vector<std::int64_t> empty_rows(const Tensor<double>& o) {
  std::vector<std::int64_t> rows;
  const auto v = o.contiguous().to_vector();
  const std::int64_t dv = o.dim(3);
  for (std::int64_t r = 0; r < o.numel() / dv; ++r) {
    bool zero = true;
    for (std::int64_t d = 0; d < dv; ++d) zero = zero && v[static_cast<std::size_t>(r * dv + d)] == 0;
    if (zero) rows.push_back(r);
  }
  return rows;
}

}  // namespace

TEST_CASE("attention masks: forward matches the definition", "[attention][masks]") {
  Rng rng(2201);
  for (const Case& c : cases()) {
    INFO(c.name);
    const Inputs in = inputs(c, rng);
    const auto r = ops::scaled_dot_product_attention_forward(in.q, in.k, in.v, c.p, lengths(c),
                                                             view_of(in.bias, in.allowed));
    const auto want = naive(c, in.q, in.k, in.v, in.bias, in.allowed);
    CHECK(max_diff(r.o, want) < 1e-12);
    // A row with no key: zero output, statistic -inf (with dropout a zero row may be all dropped).
    const auto stats = r.stats.to_vector();
    for (std::int64_t row : c.p.dropout > 0 ? std::vector<std::int64_t>{} : empty_rows(want))
      CHECK(stats[static_cast<std::size_t>(row)] == -inf);
    if (c.empty_row) CHECK(stats[1] == -inf);
  }
}

TEST_CASE("attention masks: gradients of q, k, v and the bias (f64)", "[attention][masks][gradcheck]") {
  Rng rng(2202);
  for (const Case& c : cases()) {
    INFO(c.name);
    Inputs in = inputs(c, rng);
    const AttentionLengths lens = lengths(c);
    Var<double> vq = autograd::parameter(in.q.view()), vk = autograd::parameter(in.k.view()),
                vv = autograd::parameter(in.v.view());
    Var<double> vb = in.bias.defined() ? autograd::parameter(in.bias.view()) : Var<double>{};
    Var<double> o = autograd::scaled_dot_product_attention(vq, vk, vv, c.p, lens, vb, in.allowed);
    o.backward(in.dout);
    const auto f = [&] {
      return ops::scaled_dot_product_attention_forward(in.q, in.k, in.v, c.p, lens, view_of(in.bias, in.allowed)).o;
    };
    gradcheck("masks dq " + c.name, in.q, f, vq.grad(), in.dout);
    gradcheck("masks dk " + c.name, in.k, f, vk.grad(), in.dout);
    gradcheck("masks dv " + c.name, in.v, f, vv.grad(), in.dout);
    if (in.bias.defined()) {
      CHECK(vb.grad().shape() == in.bias.shape());
      gradcheck("masks dbias " + c.name, in.bias, f, vb.grad(), in.dout);
    }
    // Rows with no key give no gradient to q.
    const auto dq = vq.grad().contiguous().to_vector();
    for (std::int64_t row : empty_rows(o.value()))
      for (std::int64_t d = 0; d < c.D; ++d) CHECK(dq[static_cast<std::size_t>(row * c.D + d)] == 0);
  }
}

// A bias of -inf on every key of a row empties it as the boolean mask does; ops' backward gives
// dbias only when asked; a zero bias, an all-true mask, a window at least as wide as the keys and
// a huge soft-cap change nothing; bottom-right equals top-left when Sq == Skv.
TEST_CASE("attention masks: identities", "[attention][masks]") {
  Rng rng(2203);
  const Case c{"plain causal", 2, 2, 2, 5, 5, 4, 4, {.causal = true}};
  const Inputs in = inputs(c, rng);
  const auto fwd = [&](const AttentionParams& p, const AttentionMask<double>& m = {}) {
    return ops::scaled_dot_product_attention_forward(in.q, in.k, in.v, p, {}, m);
  };
  const auto base = fwd(c.p);
  CHECK(max_diff(fwd(c.p, {Tensor<double>::zeros({1, 1, 5, 5})}).o, base.o) == 0);
  CHECK(max_diff(fwd(c.p, {{}, Tensor<std::uint8_t>::full({2, 2, 5, 5}, 1)}).o, base.o) == 0);
  CHECK(max_diff(fwd({.causal = true, .window = 5}).o, base.o) == 0);
  CHECK(max_diff(fwd({.causal = true, .align = CausalAlign::bottom_right}).o, base.o) == 0);
  CHECK(max_diff(fwd({.causal = true, .softcap = 1e7}).o, base.o) < 1e-10);
  CHECK(max_diff(fwd({.causal = true, .window = 2}).o, base.o) > 1e-3);

  auto bias = Tensor<double>::zeros({2, 1, 5, 5});
  for (std::int64_t j = 0; j < 5; ++j) at(bias, 1, 0, 3, j) = -inf;
  const auto r = fwd(c.p, {bias.view()});
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t d = 0; d < c.Dv; ++d) CHECK(at(r.o, 1, h, 3, d) == 0);
  const auto g = ops::scaled_dot_product_attention_backward(in.q, in.k, in.v, r.o, in.dout, r.stats, c.p, {},
                                                            DropoutMask::none, {bias.view()});
  CHECK_FALSE(g.dbias.defined());
  const auto gb = ops::scaled_dot_product_attention_backward(in.q, in.k, in.v, r.o, in.dout, r.stats, c.p, {},
                                                             DropoutMask::none, {bias.view()}, true);
  REQUIRE(gb.dbias.shape() == bias.shape());
  for (std::int64_t j = 0; j < 5; ++j) CHECK(at(gb.dbias, 1, 0, 3, j) == 0);
  CHECK(max_diff(g.dq, gb.dq) == 0);
  for (std::int64_t d = 0; d < c.D; ++d) CHECK(at(gb.dq, 1, 1, 3, d) == 0);
}

TEST_CASE("attention masks: parameters print and compare", "[attention][masks]") {
  const AttentionParams p{.causal = true, .align = CausalAlign::bottom_right, .window = 128, .softcap = 50};
  std::ostringstream os;
  os << p;
  CHECK(os.str() == "{causal true bottom_right, window 128, scale 0, softcap 50}");
  CHECK_FALSE(p == AttentionParams{.causal = true});
  CHECK(AttentionParams{} == AttentionParams{.causal = false, .align = CausalAlign::top_left, .window = 0});
}

// The GPU's fallback composes the op from matmuls on any device: checked here in f32 against the
// f64 reference, with dbias.
TEST_CASE("attention masks: the composed path matches the reference", "[attention][masks]") {
  Rng rng(2204);
  const auto f = [](const Tensor<double>& t) { return t.defined() ? cast<float>(t) : Tensor<float>{}; };
  const auto d = [](const Tensor<float>& t) { return cast<double>(t); };
  for (const Case& c : cases()) {
    INFO(c.name);
    const Inputs in = inputs(c, rng);
    const auto q = f(in.q), k = f(in.k), v = f(in.v), dout = f(in.dout), bias = f(in.bias);
    const AttentionMask<float> m = view_of(bias, in.allowed);
    const auto g = ops::detail::attention_geometry("test", q, k, v, c.p, lengths(c));
    const auto ref = ops::scaled_dot_product_attention_forward(in.q, in.k, in.v, c.p, lengths(c),
                                                               view_of(in.bias, in.allowed));
    const auto gref = ops::scaled_dot_product_attention_backward(in.q, in.k, in.v, ref.o, in.dout, ref.stats, c.p,
                                                                 lengths(c), ref.mask, view_of(in.bias, in.allowed),
                                                                 in.bias.defined());
    const auto com = ops::detail::attention_forward_composed(q, k, v, g, m);
    CHECK(max_diff(d(com.o), ref.o) < 1e-5);
    const std::vector<float> sc = com.stats.to_vector();
    const std::vector<double> sr = ref.stats.to_vector();
    for (std::size_t i = 0; i < sr.size(); ++i) {
      if (sr[i] == -inf) CHECK(sc[i] == -std::numeric_limits<float>::infinity());
      else CHECK(std::abs(sc[i] - sr[i]) < 1e-5);
    }
    const auto gcom = ops::detail::attention_backward_composed(q, k, v, f(ref.o), dout, cast<float>(ref.stats), g, m,
                                                               in.bias.defined());
    CHECK(max_diff(d(gcom.dq), gref.dq) < 1e-5);
    CHECK(max_diff(d(gcom.dk), gref.dk) < 1e-5);
    CHECK(max_diff(d(gcom.dv), gref.dv) < 1e-5);
    CHECK(gcom.dbias.defined() == in.bias.defined());
    if (in.bias.defined()) CHECK(max_diff(d(gcom.dbias), gref.dbias) < 1e-5);
  }
}

TEST_CASE("bad input: attention masks", "[attention][masks][bad_input]") {
  using D = Tensor<double>;
  const auto z = [](Shape s) { return D::zeros(s); };
  const auto q = z({2, 4, 3, 8}), k = z({2, 2, 5, 8}), v = z({2, 2, 5, 6});
  const auto fwd = [&](AttentionParams p, const AttentionMask<double>& m = {}) {
    (void)ops::scaled_dot_product_attention_forward(q, k, v, p, {}, m);
  };
  const auto u8 = [](Shape s) { return Tensor<std::uint8_t>::full(s, 1); };
  constexpr const char* op = "scaled_dot_product_attention";
  run_cases({
      bad<InvalidArgument>("bias rank", op,
                           {"mask.bias must be [B or 1, H or 1, Sq, Skv] = [2 or 1, 4 or 1, 3, 5]", "[3,5]"},
                           [&] { fwd({}, {z({3, 5})}); }),
      bad<InvalidArgument>("bias keys", op, {"mask.bias must be", "[2,4,3,4]"}, [&] { fwd({}, {z({2, 4, 3, 4})}); }),
      bad<InvalidArgument>("bias kv heads", op, {"mask.bias must be", "[1,2,3,5]"},
                           [&] { fwd({}, {z({1, 2, 3, 5})}); }),
      bad<InvalidArgument>("allowed batch", op, {"mask.allowed must be", "[3,1,3,5]"},
                           [&] { fwd({}, {{}, u8({3, 1, 3, 5})}); }),
      bad<InvalidArgument>("window without causal", op, {"take effect with causal = true", "window 4"},
                           [&] { fwd({.window = 4}); }),
      bad<InvalidArgument>("align without causal", op, {"take effect with causal = true", "bottom_right"},
                           [&] { fwd({.align = CausalAlign::bottom_right}); }),
      bad<InvalidArgument>("negative window", op, {"window must be >= 0", "-2"},
                           [&] { fwd({.causal = true, .window = -2}); }),
      bad<InvalidArgument>("negative softcap", op, {"softcap must be finite and >= 0", "-1"},
                           [&] { fwd({.softcap = -1}); }),
      bad<InvalidArgument>("nan softcap", op, {"softcap must be finite and >= 0", "nan"},
                           [&] { fwd({.softcap = std::numeric_limits<double>::quiet_NaN()}); }),
      bad<InvalidArgument>("dbias without a bias", "scaled_dot_product_attention_backward",
                           {"the bias's gradient was asked for, but no mask.bias was given"},
                           [&] {
                             (void)ops::scaled_dot_product_attention_backward(q, k, v, z({2, 4, 3, 6}), z({2, 4, 3, 6}),
                                                                             z({2, 4, 3}), {}, {}, DropoutMask::none,
                                                                             {}, true);
                           }),
  });
}

}  // namespace cutrain_test_attention_masks
