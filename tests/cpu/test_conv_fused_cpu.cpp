// cpu::conv2d_fused_forward (act(conv + bias + residual) with the epilogue on each sample's GEMM
// output) against the direct sum and against the separate ops, in both layouts; its column
// scratch reused across convs of different sizes and the large-conv path; and bad input.
#include "bad_input.hpp"
#include "direct_conv.hpp"
#include "gradcheck.hpp"

#include <cmath>
#include <string>
#include <vector>

#include "cutrain/cpu.hpp"
#include "cutrain/cpu/threads.hpp"

namespace cutrain_test_conv_fused_cpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

// act(conv(x, w) + b + r) element by element, in f64.
std::vector<double> direct(const Tensor<double>& x, const Tensor<double>& w, const Tensor<double>& b,
                           const Tensor<double>& r, const ActivationParams& act, const Conv2dParams& p) {
  std::vector<double> y = direct_conv(x, w, b, p);
  const auto rv = r.defined() ? r.contiguous(Layout::row_major).to_vector() : std::vector<double>{};
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = cpu::detail::act_forward(y[i] + (rv.empty() ? 0.0 : rv[i]), act);
  return y;
}

struct Geometry {
  std::string name;
  Shape x, w;
  Conv2dParams p;
};

std::vector<Geometry> geometries() {
  Conv2dParams pad1;
  pad1.pad_top = pad1.pad_bottom = pad1.pad_left = pad1.pad_right = 1;
  Conv2dParams s2 = pad1;
  s2.stride_h = s2.stride_w = 2;
  Conv2dParams grouped = pad1;
  grouped.groups = 2;
  Conv2dParams dilated = pad1;
  dilated.dilation_h = dilated.dilation_w = 2;
  dilated.pad_top = dilated.pad_bottom = dilated.pad_left = dilated.pad_right = 2;
  return {{"3x3 pad 1", {2, 3, 7, 6}, {5, 3, 3, 3}, pad1},
          {"3x3 stride 2", {2, 4, 9, 8}, {6, 4, 3, 3}, s2},
          {"1x1 pointwise", {3, 5, 4, 5}, {4, 5, 1, 1}, Conv2dParams{}},
          {"groups 2", {2, 4, 6, 6}, {6, 2, 3, 3}, grouped},
          {"dilation 2", {1, 3, 8, 7}, {4, 3, 3, 3}, dilated}};
}

const ActivationParams acts[] = {{.kind = Activation::identity}, {.kind = Activation::relu},
                                 {.kind = Activation::leaky_relu, .alpha = 0.1}, {.kind = Activation::gelu_tanh}};

}  // namespace

TEST_CASE("cpu conv2d_fused_forward: act(conv + bias + residual) against the direct sum, f64, both layouts") {
  Rng rng(2024);
  for (const auto& g : geometries())
    for (const Layout l : {Layout::nchw, Layout::nhwc})
      for (const auto& act : acts)
        for (const bool with_bias : {false, true})
          for (const bool with_res : {false, true}) {
            INFO(g.name << ", " << (l == Layout::nhwc ? "nhwc" : "nchw") << ", activation " << static_cast<int>(act.kind)
                        << ", bias " << with_bias << ", residual " << with_res);
            const auto x = Tensor<double>::uniform(g.x, rng, -1, 1).contiguous(l);
            const auto w = Tensor<double>::uniform(g.w, rng, -1, 1);
            const Shape ys = conv2d_output_shape(g.x, g.w, g.p);
            const auto b = with_bias ? Tensor<double>::uniform(Shape{g.w[0]}, rng, -1, 1) : Tensor<double>{};
            const auto r = with_res ? Tensor<double>::uniform(ys, rng, -1, 1) : Tensor<double>{};
            const auto rl = with_res ? r.contiguous(l) : Tensor<double>{};
            const auto y = cpu::conv2d_fused_forward(x, w, b, rl, act, g.p);
            CHECK(y.shape() == ys);
            CHECK(y.layout() == l);
            const auto want = direct(x, w, b, r, act, g.p);
            const auto got = y.to_vector();
            REQUIRE(got.size() == want.size());
            for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(want[i]).margin(1e-12));
          }
}

TEST_CASE("cpu conv2d_fused_forward in f32 matches f64; the public conv ops take the same path") {
  Rng rng(7);
  Conv2dParams p;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
  const auto x = Tensor<double>::uniform(Shape{4, 16, 12, 12}, rng, -1, 1);
  const auto w = Tensor<double>::uniform(Shape{24, 16, 3, 3}, rng, -0.3, 0.3);
  const auto b = Tensor<double>::uniform(Shape{24}, rng, -1, 1);
  const auto r = Tensor<double>::uniform(Shape{4, 24, 12, 12}, rng, -1, 1);
  const ActivationParams relu{.kind = Activation::relu};
  const auto want = cpu::conv2d_fused_forward(x, w, b, r, relu, p).to_vector();
  const auto got = cpu::conv2d_fused_forward(cast<float>(x), cast<float>(w), cast<float>(b), cast<float>(r), relu, p).to_vector();
  for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(want[i]).margin(1e-4));
  // ops::conv2d_bias_activation_forward runs it on the CPU; conv2d_forward is it with no epilogue.
  const auto fused_op = ops::conv2d_bias_activation_forward(x, w, b, relu, p).to_vector();
  const auto no_res = cpu::conv2d_fused_forward(x, w, b, Tensor<double>{}, relu, p).to_vector();
  CHECK(fused_op == no_res);
  const auto plain = ops::conv2d_forward(x, w, b, p).to_vector();
  const auto identity = cpu::conv2d_fused_forward(x, w, b, Tensor<double>{}, {.kind = Activation::identity}, p).to_vector();
  CHECK(plain == identity);
}

TEST_CASE("cpu conv: the column scratch is reused across sizes, and a large conv gets its own") {
  Rng rng(99);
  Conv2dParams p;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
  // 64 channels, 3x3, 128x128: a 9.4M-element column matrix, past the 8M kept per thread.
  const auto big_x = Tensor<float>::uniform(Shape{1, 64, 128, 128}, rng, -1, 1);
  const auto big_w = Tensor<float>::uniform(Shape{2, 64, 3, 3}, rng, -0.1, 0.1);
  const auto small_x = Tensor<float>::uniform(Shape{2, 8, 10, 10}, rng, -1, 1);
  const auto small_w = Tensor<float>::uniform(Shape{3, 8, 3, 3}, rng, -0.5, 0.5);
  const auto mid_x = Tensor<float>::uniform(Shape{1, 32, 40, 40}, rng, -1, 1);
  const auto mid_w = Tensor<float>::uniform(Shape{4, 32, 3, 3}, rng, -0.2, 0.2);
  const ActivationParams identity{.kind = Activation::identity};
  const auto check = [&](const Tensor<float>& x, const Tensor<float>& w) {
    const auto got = cpu::conv2d_forward(x, w, p).to_vector();
    const auto want = direct(cast<double>(x), cast<double>(w), {}, {}, identity, p);
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(want[i]).margin(1e-4));
  };
  check(small_x, small_w);  // the kept buffer grows ...
  check(mid_x, mid_w);      // ... and grows again
  check(small_x, small_w);  // a smaller conv in the larger buffer
  check(big_x, big_w);      // its own allocation
  check(mid_x, mid_w);
  // The backward passes share the scratch: dgrad and wgrad after the convs above match f64.
  const auto dy = Tensor<float>::uniform(Shape{1, 4, 40, 40}, rng, -1, 1);
  const auto dx = cpu::conv2d_backward_data(dy, mid_w, mid_x.shape(), p).to_vector();
  const auto dx64 = cpu::conv2d_backward_data(cast<double>(dy), cast<double>(mid_w), mid_x.shape(), p).to_vector();
  for (std::size_t i = 0; i < dx.size(); ++i) REQUIRE(dx[i] == Approx(dx64[i]).margin(1e-4));
  const auto dw = cpu::conv2d_backward_filter(dy, mid_x, mid_w.shape(), p).to_vector();
  const auto dw64 = cpu::conv2d_backward_filter(cast<double>(dy), cast<double>(mid_x), mid_w.shape(), p).to_vector();
  for (std::size_t i = 0; i < dw.size(); ++i) REQUIRE(dw[i] == Approx(dw64[i]).margin(1e-3));
}

TEST_CASE("cpu conv2d_fused_forward: a residual or bias of the wrong size is refused, naming the op") {
  Rng rng(3);
  const auto x = Tensor<float>::uniform(Shape{2, 3, 6, 6}, rng, -1, 1);
  const auto w = Tensor<float>::uniform(Shape{4, 3, 3, 3}, rng, -1, 1);
  const ActivationParams relu{.kind = Activation::relu};
  run_cases({
      bad<InvalidArgument>("residual of another shape", "conv2d_fused_forward", {"residual", "[2,4,4,4]", "[2,4,6,6]"},
                           [&] {
                             (void)cpu::conv2d_fused_forward(x, w, Tensor<float>{}, Tensor<float>::zeros({2, 4, 6, 6}), relu,
                                                             Conv2dParams{});
                           }),
      bad<InvalidArgument>("bias of the wrong size", "conv2d_fused_forward", {"bias", "4 elements"},
                           [&] {
                             (void)cpu::conv2d_fused_forward(x, w, Tensor<float>::zeros({3}), Tensor<float>{}, relu,
                                                             Conv2dParams{});
                           }),
  });
}

TEST_CASE("cpu threads: the GEMM library is named and the thread count is settable") {
  const std::string lib(cpu::gemm_library());
  CHECK((lib == "OpenBLAS" || lib == "Eigen"));
  const int before = cpu::num_threads();
  CHECK(before >= 1);
  cpu::set_num_threads(1);
  CHECK(cpu::num_threads() == 1);
  cpu::set_num_threads(before);
  CUTRAIN_REQUIRE_THROWS_OP(cpu::set_num_threads(0), InvalidArgument, "cpu::set_num_threads");
}

}  // namespace cutrain_test_conv_fused_cpu
