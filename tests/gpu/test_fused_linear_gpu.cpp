// The fused linear ops of a transformer block on the GPU against the CPU in f64: gelu_mlp (GELU
// in the first matmul's epilogue, its gradient in the second's, the residual as C) forward and
// backward in f32, bf16 and f16, with and without biases and residual, at a GPT-2-like width
// (the fused epilogues) and an odd hidden width (the unfused fallback); that cuBLASLt does fuse
// the GPT-2 MLP's shapes in bf16; linear_residual forward and backward.
#include "parity.hpp"

#include <cstdio>
#include <string>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/cuda/cublas/linear.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/linear.hpp"
#include "cutrain/ops/matmul.hpp"
#include "cutrain/ops/mlp.hpp"

namespace cutrain_test_fused_linear_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

struct Case {
  const char* name;
  std::int64_t n, in, hidden, out;
  bool biases, residual;
};

const Case cases[] = {
    {"gpt_like_256x64_256_64", 256, 64, 256, 64, true, true},
    {"no_bias_96x32_128_48", 96, 32, 128, 48, false, true},
    {"no_residual_64x48_192_40", 64, 48, 192, 40, true, false},
    {"odd_hidden_33x20_13_7", 33, 20, 13, 7, true, true},  // z's rows are not a multiple of 8: unfused
};

// cuBLASLt's GELU epilogues may use the hardware tanh (relative error about 2^-11): f32 at 1e-3.
template <class T>
double mlp_tolerance() {
  if constexpr (std::same_as<T, float>) return 1e-3;
  else return 3e-2;
}

template <class T>
void check_mlp(const Case& c) {
  const std::string tag = cutrain::detail::cat("gelu_mlp ", c.name, " ", dtype_of<T>);
  INFO(tag);
  Rng rng(7301 + static_cast<std::uint64_t>(c.n));
  auto [x, xr] = random_pair<T>({c.n, c.in}, rng, Layout::row_major);
  auto [w1, w1r] = random_pair<T>({c.hidden, c.in}, rng, Layout::row_major);
  auto [b1, b1r] = random_pair<T>({c.hidden}, rng, Layout::row_major);
  auto [w2, w2r] = random_pair<T>({c.out, c.hidden}, rng, Layout::row_major);
  auto [b2, b2r] = random_pair<T>({c.out}, rng, Layout::row_major);
  auto [r, rr] = random_pair<T>({c.n, c.out}, rng, Layout::row_major);
  auto [dy, dyr] = random_pair<T>({c.n, c.out}, rng, Layout::row_major);
  const auto maybe = [](bool on, const auto& t) { return on ? t.view() : std::remove_cvref_t<decltype(t)>{}; };

  const GeluMlpForward<double> want = ops::gelu_mlp_forward(xr, w1r, maybe(c.biases, b1r), w2r, maybe(c.biases, b2r),
                                                            maybe(c.residual, rr));
  const GeluMlpForward<T> got =
      ops::gelu_mlp_forward(x, w1, maybe(c.biases, b1), w2, maybe(c.biases, b2), maybe(c.residual, r));
  const double tol = mlp_tolerance<T>();
  check_close(tag + " y", got.y, want.y, tol);
  check_close(tag + " z", got.z, want.z, tol);
  check_close(tag + " g", got.g, want.g, tol);
  // Backward from the CPU's own z and g (the same values the GPU kept, to rounding).
  const GeluMlpBackward<double> gw = ops::gelu_mlp_backward(xr, w1r, w2r, want.z, want.g, dyr, c.biases, c.biases);
  const GeluMlpBackward<T> gg = ops::gelu_mlp_backward(x, w1, w2, got.z, got.g, dy, c.biases, c.biases);
  check_close(tag + " dx", gg.dx, gw.dx, tol);
  check_close(tag + " dw1", gg.dw1, gw.dw1, tol);
  check_close(tag + " dw2", gg.dw2, gw.dw2, tol);
  if (c.biases) {
    check_close(tag + " db1", gg.db1, gw.db1, tol);
    check_close(tag + " db2", gg.db2, gw.db2, tol);
  } else {
    CHECK(!gg.db1.defined());
    CHECK(!gg.db2.defined());
  }
}

template <class T>
void check_all_mlp() {  // TF32 is off by default: f32 means f32
  for (const Case& c : cases) check_mlp<T>(c);
}

}  // namespace

TEST_CASE("gpu gelu_mlp f32 against the CPU in f64", "[gpu][fused_linear]") { check_all_mlp<float>(); }
TEST_CASE("gpu gelu_mlp bf16 against the CPU in f64", "[gpu][fused_linear]") { check_all_mlp<bfloat16>(); }
TEST_CASE("gpu gelu_mlp f16 against the CPU in f64", "[gpu][fused_linear]") { check_all_mlp<cutrain::half>(); }

TEST_CASE("gpu gelu_mlp: cuBLASLt fuses GPT-2's MLP shapes in bf16", "[gpu][fused_linear]") {
  // dim 768, hidden 3072, 1024 tokens: the GELU_AUX_BIAS and DGELU epilogues must be offered,
  // else the MLP runs unfused (correct, but the speed the benchmark claims is gone).
  Rng rng(7302);
  auto x = random_pair<bfloat16>({1024, 768}, rng, Layout::row_major).first;
  auto w1 = random_pair<bfloat16>({3072, 768}, rng, Layout::row_major).first;
  auto b1 = random_pair<bfloat16>({3072}, rng, Layout::row_major).first;
  auto w2 = random_pair<bfloat16>({768, 3072}, rng, Layout::row_major).first;
  auto dy = random_pair<bfloat16>({1024, 768}, rng, Layout::row_major).first;
  Tensor<bfloat16> y(Shape{1024, 3072}, {.device = Device::cuda(0)}), z(Shape{1024, 3072}, {.device = Device::cuda(0)});
  CHECK(cuda::cublas::linear_gelu_forward(x, w1, b1, y, z, "test"));
  Tensor<bfloat16> dz(Shape{1024, 3072}, {.device = Device::cuda(0)});
  CHECK(cuda::cublas::linear_dgrad_gelu(w2, dy, z, dz, "test"));
  // The fused results equal the unfused ones (same matmul, the GELU applied after).
  const Tensor<bfloat16> z2 = ops::linear_forward(x, w1, b1);
  check_close("GELU_AUX z", z, cast<double>(z2), 1e-2);
  check_close("GELU_AUX y", y, cast<double>(ops::activation_forward(z2, {.kind = Activation::gelu_tanh})), 2e-2);
  const Tensor<bfloat16> dg = ops::matmul(dy, w2);
  check_close("DGELU dz", dz, cast<double>(ops::activation_backward(z, dg, {.kind = Activation::gelu_tanh})), 3e-2);
}

TEST_CASE("gpu linear_residual forward and backward against the CPU in f64", "[gpu][fused_linear]") {
  Rng rng(7303);
  auto [x, xr] = random_pair<float>({40, 24}, rng, Layout::row_major);
  auto [w, wr] = random_pair<float>({16, 24}, rng, Layout::row_major);
  auto [b, br] = random_pair<float>({16}, rng, Layout::row_major);
  auto [r, rr] = random_pair<float>({40, 16}, rng, Layout::row_major);
  auto [dy, dyr] = random_pair<float>({40, 16}, rng, Layout::row_major);
  Var<double> vx = autograd::parameter(xr.view()), vw = autograd::parameter(wr.view()),
              vb = autograd::parameter(br.view()), vr = autograd::parameter(rr.view());
  Var<float> gx = autograd::parameter(x.view()), gw = autograd::parameter(w.view()), gb = autograd::parameter(b.view()),
             gr = autograd::parameter(r.view());
  Var<double> want = autograd::linear_residual(vx, vw, vb, vr);
  Var<float> got = autograd::linear_residual(gx, gw, gb, gr);
  check_close("linear_residual y", got.value(), want.value());
  want.backward(dyr);
  got.backward(dy);
  check_close("linear_residual dx", gx.grad(), vx.grad());
  check_close("linear_residual dw", gw.grad(), vw.grad());
  check_close("linear_residual db", gb.grad(), vb.grad());
  check_close("linear_residual dr", gr.grad(), vr.grad());
}

}  // namespace cutrain_test_fused_linear_gpu
