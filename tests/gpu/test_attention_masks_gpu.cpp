// scaled_dot_product_attention's masks on the GPU against the CPU backend in f64 on the same
// (rounded) random data: an additive bias (full and broadcast, with dbias), a boolean mask (a row
// with no key among them), bottom-right causal alignment (Sq < Skv and Sq > Skv), sliding
// windows, soft-capping, with padding lengths and grouped heads; bf16 and f16 (cuDNN's fused
// SDPA where it takes the signature, else the composed path) and f32 (composed). Which path ran
// is reported (WARN) rather than required where cudnn-frontend decides; soft-capping must take the
// composed path. Also autograd on the device with a bias that requires grad.
#include "parity.hpp"

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "cutrain/autograd/functions/attention.hpp"
#include "cutrain/ops/attention.hpp"

namespace cutrain_test_attention_masks_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

constexpr auto br = CausalAlign::bottom_right;

struct Case {
  std::string name;
  std::int64_t B, H, Hk, Sq, Skv, D;
  AttentionParams p{};
  Shape bias{};     // empty: none
  Shape allowed{};  // empty: none
  std::vector<std::int32_t> q_len{}, kv_len{};
  bool empty_row = false;  // the boolean mask drops every key of row 5 (batch 0, head 0)
};

std::vector<Case> cases() {
  return {
      {"bias [B, H]", 2, 4, 4, 128, 128, 64, {}, {2, 4, 128, 128}},
      {"bias [1, H] causal gqa (ALiBi-like)", 2, 8, 2, 64, 64, 64, {.causal = true}, {1, 8, 64, 64}},
      {"bias [B, 1] d128", 2, 2, 2, 64, 96, 128, {.scale = 0.1}, {2, 1, 64, 96}},
      {"mask [B, 1], a row with no key", 2, 4, 4, 64, 64, 64, {}, {}, {2, 1, 64, 64}, {}, {}, true},
      {"bias [1, H] and mask [B, 1]", 2, 2, 2, 64, 128, 64, {}, {1, 2, 64, 128}, {2, 1, 64, 128}},
      {"bias and padding", 2, 2, 2, 64, 64, 64, {}, {2, 2, 64, 64}, {}, {64, 40}, {64, 17}},
      {"bottom-right decoding (Sq < Skv)", 2, 4, 4, 64, 192, 64, {.causal = true, .align = br}},
      {"bottom-right one query", 3, 4, 2, 1, 80, 64, {.causal = true, .align = br}},
      {"bottom-right Sq > Skv", 1, 2, 2, 96, 64, 64, {.causal = true, .align = br}},
      {"bottom-right padding", 2, 2, 2, 64, 128, 64, {.causal = true, .align = br}, {}, {}, {64, 30}, {128, 50}},
      {"window", 2, 4, 4, 128, 128, 64, {.causal = true, .window = 32}},
      {"window bottom-right gqa", 1, 4, 2, 64, 128, 128, {.causal = true, .align = br, .window = 48}},
      {"window and bias", 2, 2, 2, 128, 128, 64, {.causal = true, .window = 16}, {1, 2, 128, 128}},
      {"softcap (composed)", 2, 4, 4, 64, 64, 64, {.softcap = 5.0}},
      {"softcap causal window bias (composed)", 2, 4, 2, 64, 64, 64,
       {.causal = true, .window = 24, .scale = 0.5, .softcap = 2.0}, {1, 4, 64, 64}},
  };
}

AttentionLengths lengths(const Case& c, Device dev) {
  AttentionLengths l;
  if (!c.q_len.empty()) l.q = Tensor<std::int32_t>::from_vector(c.q_len, Shape{c.B}).to(dev);
  if (!c.kv_len.empty()) l.kv = Tensor<std::int32_t>::from_vector(c.kv_len, Shape{c.B}).to(dev);
  return l;
}

Tensor<std::uint8_t> random_allowed(const Case& c, Rng& rng) {
  if (c.allowed.rank() == 0) return {};
  std::vector<std::uint8_t> v(static_cast<std::size_t>(c.allowed.numel()));
  for (auto& x : v) x = rng.uniform() < 0.3 ? 0 : 1;
  if (c.empty_row)
    for (std::int64_t j = 0; j < c.Skv; ++j) v[static_cast<std::size_t>(5 * c.Skv + j)] = 0;
  return Tensor<std::uint8_t>::from_vector(v, c.allowed);
}

// The statistics with the rows the reference leaves without a key (-inf there) set to zero on
// both sides: their statistic is unspecified.
template <class S>
Tensor<double> keyed_stats(const Tensor<S>& stats, const Tensor<double>& ref) {
  auto v = cast<double>(stats.to(Device::cpu())).contiguous().to_vector();
  const auto r = ref.contiguous().to_vector();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (r[i] == -std::numeric_limits<double>::infinity()) v[i] = 0;
  return Tensor<double>::from_vector(v, stats.shape());
}

template <class T>
void check_case(const Case& c, Rng& rng) {
  const std::string name = c.name + " " + std::string(to_string(dtype_of<T>));
  INFO(name);
  const Device dev = Device::cuda(0);
  auto [q, qr] = random_pair<T>(Shape{c.B, c.H, c.Sq, c.D}, rng, Layout::row_major);
  auto [k, kr] = random_pair<T>(Shape{c.B, c.Hk, c.Skv, c.D}, rng, Layout::row_major);
  auto [v, vr] = random_pair<T>(Shape{c.B, c.Hk, c.Skv, c.D}, rng, Layout::row_major);
  auto [dout, dr] = random_pair<T>(Shape{c.B, c.H, c.Sq, c.D}, rng, Layout::row_major);
  Tensor<T> bias;
  Tensor<double> bias_ref;
  if (c.bias.rank() > 0) std::tie(bias, bias_ref) = random_pair<T>(c.bias, rng, Layout::row_major);
  const Tensor<std::uint8_t> allowed_ref = random_allowed(c, rng);
  const Tensor<std::uint8_t> allowed = allowed_ref.defined() ? allowed_ref.to(dev) : Tensor<std::uint8_t>{};
  const AttentionMask<T> m{bias.defined() ? bias.view() : Tensor<T>{},
                           allowed.defined() ? allowed.view() : Tensor<std::uint8_t>{}};
  const AttentionMask<double> mr{bias_ref.defined() ? bias_ref.view() : Tensor<double>{},
                                 allowed_ref.defined() ? allowed_ref.view() : Tensor<std::uint8_t>{}};
  const AttentionLengths lg = lengths(c, dev), lc = lengths(c, Device::cpu());
  const bool with_bias = bias.defined();

  const auto fallbacks0 = cuda::cudnn::kernel_fallbacks().load();
  const auto r = ops::scaled_dot_product_attention_forward(q, k, v, c.p, lg, m);
  const bool forward_fused = !std::is_same_v<T, float> && c.p.softcap == 0 &&
                             cuda::cudnn::kernel_fallbacks().load() == fallbacks0;
  const auto fallbacks1 = cuda::cudnn::kernel_fallbacks().load();
  const auto g = ops::scaled_dot_product_attention_backward(q, k, v, r.o, dout, r.stats, c.p, lg, r.mask, m, with_bias);
  const bool backward_fused = !std::is_same_v<T, float> && c.p.softcap == 0 &&
                              cuda::cudnn::kernel_fallbacks().load() == fallbacks1;
  if (!std::is_same_v<T, float>)
    WARN(name << ": cuDNN's fused SDPA ran the forward: " << forward_fused << ", the backward: " << backward_fused);
  if (c.p.softcap > 0) CHECK(cuda::cudnn::kernel_fallbacks().load() == fallbacks0);  // composed, never tried

  const auto geom = ops::detail::attention_geometry("test", qr, kr, vr, c.p, lc);
  const auto ref = cpu::attention_forward(qr, kr, vr, geom, mr);
  const auto gref = cpu::attention_backward(qr, kr, vr, ref.o, dr, ref.stats, geom, mr, with_bias);
  check_close(name + " o", r.o, ref.o);
  check_close(name + " stats", keyed_stats(r.stats, ref.stats), keyed_stats(ref.stats, ref.stats), tolerance<T>);
  check_close(name + " o for inference", ops::scaled_dot_product_attention_inference(q, k, v, c.p, lg, m), ref.o);
  const double grad_tol = 2 * tolerance<T>;
  check_close(name + " dq", g.dq, gref.dq, grad_tol);
  check_close(name + " dk", g.dk, gref.dk, grad_tol);
  check_close(name + " dv", g.dv, gref.dv, grad_tol);
  REQUIRE(g.dbias.defined() == with_bias);
  if (with_bias) {
    CHECK(g.dbias.shape() == bias.shape());
    check_close(name + " dbias", g.dbias, gref.dbias, grad_tol);
  }
}

template <class T>
void check_all() {
  Rng rng(2211);
  for (const Case& c : cases()) check_case<T>(c, rng);
}

}  // namespace

TEST_CASE("gpu attention masks: against the CPU, bf16", "[gpu][attention][masks]") { check_all<bfloat16>(); }
TEST_CASE("gpu attention masks: against the CPU, f16", "[gpu][attention][masks]") { check_all<cutrain::half>(); }
TEST_CASE("gpu attention masks: against the CPU, f32 (composed)", "[gpu][attention][masks]") { check_all<float>(); }

TEST_CASE("gpu attention masks: autograd with a learned bias", "[gpu][attention][masks]") {
  Rng rng(2212);
  const std::int64_t B = 2, H = 4, S = 64, D = 64;
  const AttentionParams p{.causal = true, .window = 20};
  auto [q, qr] = random_pair<bfloat16>(Shape{B, H, S, D}, rng, Layout::row_major);
  auto [k, kr] = random_pair<bfloat16>(Shape{B, H, S, D}, rng, Layout::row_major);
  auto [v, vr] = random_pair<bfloat16>(Shape{B, H, S, D}, rng, Layout::row_major);
  auto [b, br_] = random_pair<bfloat16>(Shape{1, H, S, S}, rng, Layout::row_major);
  auto [dout, dr] = random_pair<bfloat16>(Shape{B, H, S, D}, rng, Layout::row_major);
  auto vq = autograd::parameter(q.view()), vk = autograd::parameter(k.view()), vv = autograd::parameter(v.view());
  auto vb = autograd::parameter(b.view());
  auto o = autograd::scaled_dot_product_attention(vq, vk, vv, p, {}, vb);
  o.backward(dout);
  const AttentionMask<double> mr{br_.view()};
  const auto ref = ops::scaled_dot_product_attention_forward(qr, kr, vr, p, {}, mr);
  const auto gref = ops::scaled_dot_product_attention_backward(qr, kr, vr, ref.o, dr, ref.stats, p, {},
                                                               DropoutMask::none, mr, true);
  check_close("autograd o", o.value(), ref.o);
  check_close("autograd dq", vq.grad(), gref.dq, 2 * tolerance<bfloat16>);
  check_close("autograd dk", vk.grad(), gref.dk, 2 * tolerance<bfloat16>);
  check_close("autograd dv", vv.grad(), gref.dv, 2 * tolerance<bfloat16>);
  check_close("autograd dbias", vb.grad(), gref.dbias, 2 * tolerance<bfloat16>);
}

}  // namespace cutrain_test_attention_masks_gpu
