// conv2d with padding 'same' (also strided, with the pools) and conv_transpose2d on the GPU against the CPU backend in f64, in
// f32, bf16 and f16, NCHW and NHWC, on fresh random data: forward (with and without bias),
// backward data, backward filter and bias gradient through ops::, the fused dgrad + bias graph
// directly, and the autograd op end to end.
#include "parity.hpp"

#include "cutrain/autograd/functions.hpp"
#include "cutrain/cuda/cudnn/conv.hpp"
#include "cutrain/ops/conv2d.hpp"
#include "cutrain/ops/conv_transpose2d.hpp"

namespace cutrain_test_conv_extra_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

const Layout layouts[] = {Layout::nchw, Layout::nhwc};

struct SameCase {
  const char* name;
  Shape x, w;
  int dilation;
};
// Odd and even kernels (even ones pad one more at the bottom/right), dilation 2.
const SameCase same_cases[] = {
    {"same_3x3", {4, 16, 14, 14}, {32, 16, 3, 3}, 1},
    {"same_2x2", {4, 16, 13, 15}, {16, 16, 2, 2}, 1},
    {"same_4x4", {2, 8, 12, 11}, {16, 8, 4, 4}, 1},
    {"same_3x3_dil2", {2, 8, 12, 12}, {8, 8, 3, 3}, 2},
    {"same_2x4_dil2", {2, 8, 10, 12}, {8, 8, 2, 4}, 2},
};

struct TransposeCase {
  const char* name;
  Shape x, w;
  ConvTranspose2dParams p;
};
const TransposeCase transpose_cases[] = {
    {"up_s2_p1_op1", {4, 32, 8, 8}, {32, 16, 3, 3}, ConvTranspose2dParams::make(2, 1, 1)},
    {"up_s2_k2", {4, 16, 7, 9}, {16, 16, 2, 2}, ConvTranspose2dParams::make(2, 0)},
    {"s1_p1", {2, 8, 10, 10}, {8, 12, 3, 3}, ConvTranspose2dParams::make(1, 1)},
    {"dil2_p2", {2, 8, 9, 9}, {8, 8, 3, 3}, ConvTranspose2dParams::make(1, 2, 0, 2)},
    {"s2_dil2_op1", {2, 8, 6, 7}, {8, 8, 3, 3}, ConvTranspose2dParams::make(2, 1, 1, 2)},
    {"groups_2_s2", {2, 16, 6, 6}, {16, 8, 4, 4}, ConvTranspose2dParams::make(2, 1, 0, 1, 2)},
};

// Combinations cuDNN had no engine for; each TEST_CASE fails at its end if a plain one was found.
template <class F>
void attempt(const std::string& tag, bool exotic, F&& f) {
  try {
    f();
    std::printf("%-44s ok\n", tag.c_str());
  } catch (const CudnnError& e) {
    std::printf("%-44s UNSUPPORTED by cuDNN: %.300s\n", tag.c_str(), e.what());
    CHECK(std::string(e.what()).find("no cuDNN engine") != std::string::npos);
    CHECK(exotic);  // plain (no groups, no dilation) convolutions must always run
  }
}

template <class T>
void run_same(const SameCase& c, Layout layout) {
  const std::string tag = cutrain::detail::cat("conv2d ", c.name, " ", dtype_of<T>, " ", layout);
  Rng rng(std::hash<std::string>{}(tag));
  auto [x, xr] = random_pair<T>(c.x, rng, layout);
  auto [w, wr] = random_pair<T>(c.w, rng, layout);
  auto [b, br] = random_pair<T>({c.w[0]}, rng, layout);
  const Conv2dParams p = conv2d_same_padding(c.w, Conv2dParams::make(1, 0, c.dilation));
  const Shape ys = conv2d_output_shape(c.x, c.w, p);
  REQUIRE(ys == Shape{c.x[0], c.w[0], c.x[2], c.x[3]});
  auto [dy, dyr] = random_pair<T>(ys, rng, layout);
  attempt(tag, c.dilation > 1, [&] {
    check_close(tag + " fprop+bias", ops::conv2d_forward(x, w, b, p), ops::conv2d_forward(xr, wr, br, p));
    check_close(tag + " dgrad", ops::conv2d_backward_data(dy, w, c.x, p), ops::conv2d_backward_data(dyr, wr, c.x, p));
    check_close(tag + " wgrad", ops::conv2d_backward_filter(dy, x, c.w, p),
                ops::conv2d_backward_filter(dyr, xr, c.w, p));
    cuda::synchronize();
  });
}

template <class T>
void run_transpose(const TransposeCase& c, Layout layout) {
  const std::string tag = cutrain::detail::cat("conv_transpose2d ", c.name, " ", dtype_of<T>, " ", layout);
  Rng rng(std::hash<std::string>{}(tag));
  auto [x, xr] = random_pair<T>(c.x, rng, layout);
  auto [w, wr] = random_pair<T>(c.w, rng, layout);
  const Shape ys = conv_transpose2d_output_shape(c.x, c.w, c.p);
  auto [b, br] = random_pair<T>({ys[1]}, rng, layout);
  auto [dy, dyr] = random_pair<T>(ys, rng, layout);
  const bool exotic = c.p.groups > 1 || c.p.dilation_h > 1;
  attempt(tag, exotic, [&] {
    auto y = ops::conv_transpose2d_forward(x, w, c.p);
    CHECK(y.device() == Device::cuda(0));
    CHECK(y.layout() == Tensor<double>(ys, {.layout = layout}).layout());
    check_close(tag + " fwd", y, ops::conv_transpose2d_forward(xr, wr, c.p));
    check_close(tag + " fwd+bias", ops::conv_transpose2d_forward(x, w, b, c.p),
                ops::conv_transpose2d_forward(xr, wr, br, c.p));
    check_close(tag + " dx", ops::conv_transpose2d_backward_data(dy, w, c.x, c.p),
                ops::conv_transpose2d_backward_data(dyr, wr, c.x, c.p));
    check_close(tag + " dw", ops::conv_transpose2d_backward_filter(dy, x, c.w, c.p),
                ops::conv_transpose2d_backward_filter(dyr, xr, c.w, c.p));
    check_close(tag + " db", ops::conv2d_backward_bias(dy), ops::conv2d_backward_bias(dyr));
    cuda::synchronize();
  });
  // The fused dgrad + bias graph itself (ops:: falls back to dgrad, then add, where it has no
  // engine): report, do not fail, when cuDNN lacks the fusion.
  try {
    auto yb = poisoned<T>(ys, layout);
    cuda::cudnn::conv_transpose2d_forward(x, w, b, c.p.conv(), yb);
    check_close(tag + " fused dgrad+bias", yb, ops::conv_transpose2d_forward(xr, wr, br, c.p));
  } catch (const CudnnError& e) {
    std::printf("%-44s fused dgrad+bias UNSUPPORTED by cuDNN (ops:: falls back): %.200s\n", tag.c_str(), e.what());
  }
}

}  // namespace

TEST_CASE("gpu conv2d padding 'same' matches the CPU backend, f32 / bf16 / f16, NCHW / NHWC") {
  for (const auto& c : same_cases)
    for (Layout l : layouts) {
      run_same<float>(c, l);
      run_same<cutrain::bfloat16>(c, l);
      run_same<cutrain::half>(c, l);
    }
}

// Padding 'same' with stride 2 (TensorFlow's SAME, ONNX's SAME_UPPER / SAME_LOWER): asymmetric
// padding that depends on the input's size, through nn::Conv2d and the pools, forward and
// backward through autograd, against the CPU in f64.
template <class T>
void run_same_strided(Layout layout) {
  for (const SamePadding mode : {SamePadding::upper, SamePadding::lower}) {
    const std::string tag = cutrain::detail::cat("same stride 2 ", mode == SamePadding::upper ? "upper " : "lower ",
                                                 dtype_of<T>, " ", layout);
    Rng rng(std::hash<std::string>{}(tag));
    auto [x, xr] = random_pair<T>({2, 8, 13, 10}, rng, layout);
    nn::Conv2d<double> conv_ref({.in = 8, .out = 16, .kernel = 4, .stride = 2, .same_padding = true, .same_mode = mode, .seed = 5});
    nn::Conv2d<float> conv({.in = 8, .out = 16, .kernel = 4, .stride = 2, .same_padding = true, .same_mode = mode, .seed = 5});
    conv.weight.value().copy_from(cast<float>(conv_ref.weight.value()));
    conv.to(Device::cuda(0));
    if (layout == Layout::nhwc) conv.to(Layout::nhwc);
    nn::MaxPool2d mp({.kernel = 3, .stride = 2, .same_padding = true, .same_mode = mode});
    nn::AvgPool2d ap({.kernel = 2, .stride = 2, .count_include_pad = false, .same_padding = true, .same_mode = mode});
    autograd::Var<T> xv(x.view(), true);
    autograd::Var<double> rv(xr.view(), true);
    const auto y = ap(mp(conv.template operator()<T>(xv)));
    const auto yr = ap(mp(conv_ref(rv)));
    REQUIRE(y.shape() == yr.shape());
    CHECK(yr.shape() == Shape{2, 16, 2, 2});  // 13 x 10 -> 7 x 5 -> 4 x 3 -> 2 x 2
    check_close(tag + " forward", y.value(), yr.value(), 20 * tolerance<T>);
    auto [dy, dyr] = random_pair<T>(y.shape(), rng, Layout::row_major);
    y.backward(dy);
    yr.backward(dyr);
    check_close(tag + " dx", xv.grad(), rv.grad(), 20 * tolerance<T>);
  }
}

TEST_CASE("gpu padding 'same' with stride 2 (conv, max and average pool) matches the CPU, upper and lower") {
  for (Layout l : layouts) {
    run_same_strided<float>(l);
    run_same_strided<cutrain::bfloat16>(l);
  }
}

TEST_CASE("gpu conv_transpose2d forward and backward match the CPU backend, f32 / bf16 / f16, NCHW / NHWC") {
  for (const auto& c : transpose_cases)
    for (Layout l : layouts) {
      run_transpose<float>(c, l);
      run_transpose<cutrain::bfloat16>(c, l);
      run_transpose<cutrain::half>(c, l);
    }
}

TEST_CASE("gpu conv_transpose2d reads strided (sliced) inputs") {
  Rng rng(31);
  const auto p = ConvTranspose2dParams::make(2, 1, 1);
  auto [xb, xbr] = random_pair<float>({4, 8, 6, 7}, rng, Layout::nhwc);
  auto [w, wr] = random_pair<float>({8, 4, 3, 3}, rng, Layout::nchw);
  // every other sample: a strided view on both sides
  const Tensor<float> x = xb.as_strided({2, 8, 6, 7}, {2 * xb.strides()[0], xb.strides()[1], xb.strides()[2],
                                                       xb.strides()[3]}, xb.offset());
  const Tensor<double> xr = xbr.as_strided({2, 8, 6, 7}, {2 * xbr.strides()[0], xbr.strides()[1], xbr.strides()[2],
                                                          xbr.strides()[3]}, xbr.offset());
  check_close("strided conv_transpose2d fwd", ops::conv_transpose2d_forward(x, w, p),
              ops::conv_transpose2d_forward(xr, wr, p));
}

TEST_CASE("gpu autograd conv_transpose2d: gradients match the CPU's") {
  Rng rng(32);
  const auto p = ConvTranspose2dParams::make(2, 1, 1);
  auto [x, xr] = random_pair<float>({2, 8, 5, 6}, rng, Layout::nhwc);
  auto [w, wr] = random_pair<float>({8, 4, 3, 3}, rng, Layout::nhwc);
  auto [b, br] = random_pair<float>({4}, rng, Layout::nhwc);
  auto [dy, dyr] = random_pair<float>({2, 4, 10, 12}, rng, Layout::nhwc);
  auto xv = autograd::parameter(std::move(x)), wv = autograd::parameter(std::move(w)), bv = autograd::parameter(std::move(b));
  auto xc = autograd::parameter(std::move(xr)), wc = autograd::parameter(std::move(wr)), bc = autograd::parameter(std::move(br));
  auto y = autograd::conv_transpose2d(xv, wv, bv, p);
  auto yc = autograd::conv_transpose2d(xc, wc, bc, p);
  check_close("autograd conv_transpose2d y", y.value(), yc.value());
  y.backward(std::move(dy));
  yc.backward(std::move(dyr));
  check_close("autograd conv_transpose2d dx", xv.grad(), xc.grad());
  check_close("autograd conv_transpose2d dw", wv.grad(), wc.grad());
  check_close("autograd conv_transpose2d db", bv.grad(), bc.grad());
}

}  // namespace cutrain_test_conv_extra_gpu
