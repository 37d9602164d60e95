// conv2d with padding 'same' and conv_transpose2d: values against naive loops, f64 gradient
// checks in both layouts, autograd and nn modules, and bad input.
#include "gradcheck.hpp"
#include "bad_input.hpp"
#include "direct_conv.hpp"

#include <string>
#include <vector>

#include "cutrain/nn.hpp"

namespace cutrain_test_conv_extra {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;
using autograd::Var;

namespace {

const Layout layouts[] = {Layout::nchw, Layout::nhwc};


// conv_transpose2d as PyTorch defines it: every x element scatters x * w into the output at
// oh = ih * stride - pad + r * dilation (and likewise ow); bias added; logical row-major order.
std::vector<double> naive_conv_transpose(const Tensor<double>& x, const Tensor<double>& w, const Tensor<double>& b,
                                         const ConvTranspose2dParams& p) {
  const Shape ys = conv_transpose2d_output_shape(x.shape(), w.shape(), p);
  const std::int64_t Cig = x.dim(1) / p.groups, Cog = w.dim(1);
  std::vector<double> y(static_cast<std::size_t>(ys.numel()), 0.0);
  auto at = [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t v) -> double& {
    return y[static_cast<std::size_t>(((n * ys[1] + c) * ys[2] + h) * ys[3] + v)];
  };
  for (std::int64_t n = 0; n < ys[0]; ++n)
    for (std::int64_t ci = 0; ci < x.dim(1); ++ci)
      for (std::int64_t ih = 0; ih < x.dim(2); ++ih)
        for (std::int64_t iw = 0; iw < x.dim(3); ++iw)
          for (std::int64_t co = 0; co < Cog; ++co)
            for (std::int64_t r = 0; r < w.dim(2); ++r)
              for (std::int64_t s = 0; s < w.dim(3); ++s) {
                const std::int64_t oh = ih * p.stride_h - p.pad_h + r * p.dilation_h;
                const std::int64_t ow = iw * p.stride_w - p.pad_w + s * p.dilation_w;
                if (oh < 0 || oh >= ys[2] || ow < 0 || ow >= ys[3]) continue;
                at(n, (ci / Cig) * Cog + co, oh, ow) += x(n, ci, ih, iw) * w(ci, co, r, s);
              }
  if (b.defined())
    for (std::int64_t n = 0; n < ys[0]; ++n)
      for (std::int64_t c = 0; c < ys[1]; ++c)
        for (std::int64_t h = 0; h < ys[2]; ++h)
          for (std::int64_t v = 0; v < ys[3]; ++v) at(n, c, h, v) += b(c);
  return y;
}

struct SameCase {
  const char* name;
  Shape x, w;
  int dilation;
};
const SameCase same_cases[] = {
    {"odd 3x3", {2, 3, 6, 5}, {4, 3, 3, 3}, 1},
    {"even 4x4", {2, 2, 7, 6}, {3, 2, 4, 4}, 1},
    {"even 2x3", {2, 2, 5, 6}, {3, 2, 2, 3}, 1},
    {"odd 3x3 dilation 2", {2, 2, 7, 7}, {3, 2, 3, 3}, 2},
    {"even 2x2 dilation 2", {1, 3, 6, 5}, {2, 3, 2, 2}, 2},
    {"even 4x2 dilation 2", {2, 2, 9, 6}, {2, 2, 4, 2}, 2},
};

struct TransposeCase {
  const char* name;
  Shape x, w;
  ConvTranspose2dParams p;
};
const TransposeCase transpose_cases[] = {
    {"stride 2, pad 1, output_padding 1", {2, 3, 4, 5}, {3, 2, 3, 3}, ConvTranspose2dParams::make(2, 1, 1)},
    {"stride 1, no padding", {2, 2, 4, 4}, {2, 3, 3, 3}, ConvTranspose2dParams::make(1, 0)},
    {"dilation 2, pad 1", {2, 2, 4, 5}, {2, 3, 3, 3}, ConvTranspose2dParams::make(1, 1, 0, 2)},
    {"stride 2, dilation 2, output_padding 1", {1, 2, 3, 4}, {2, 2, 3, 2}, ConvTranspose2dParams::make(2, 1, 1, 2)},
    {"groups 2, stride 2", {2, 4, 3, 3}, {4, 3, 3, 3}, ConvTranspose2dParams::make(2, 1, 0, 1, 2)},
    {"stride 3x2, pad 2x0, output_padding 2x1, even kernel", {2, 2, 3, 4}, {2, 2, 4, 2},
     {.stride_h = 3, .stride_w = 2, .pad_h = 2, .pad_w = 0, .output_padding_h = 2, .output_padding_w = 1}},
    {"1x1 kernel, stride 2", {2, 3, 3, 4}, {3, 2, 1, 1}, ConvTranspose2dParams::make(2, 0, 1)},
};

}  // namespace

// ---- padding 'same' -----------------------------------------------------------------------

TEST_CASE("conv2d_same_padding: total dilation*(k-1), the odd one at the bottom/right") {
  auto pads = [](int kh, int kw, int d) {
    const Conv2dParams p = conv2d_same_padding(kh, kw, Conv2dParams::make(1, 0, d));
    return std::vector<int>{p.pad_top, p.pad_bottom, p.pad_left, p.pad_right};
  };
  CHECK(pads(3, 3, 1) == std::vector<int>{1, 1, 1, 1});
  CHECK(pads(4, 2, 1) == std::vector<int>{1, 2, 0, 1});
  CHECK(pads(1, 5, 1) == std::vector<int>{0, 0, 2, 2});
  CHECK(pads(3, 2, 2) == std::vector<int>{2, 2, 1, 1});
  CHECK(pads(4, 4, 3) == std::vector<int>{4, 5, 4, 5});
  const Conv2dParams g = conv2d_same_padding(Shape{6, 2, 2, 3}, Conv2dParams::make(1, 0, 1, 3));
  CHECK(g.groups == 3);
  CHECK(g.pad_bottom == 1);
  CHECK(g.pad_right == 1);
}

TEST_CASE("conv2d with padding 'same': output has the input's size and matches the naive loop") {
  for (const auto& c : same_cases)
    for (const Layout l : layouts) {
      INFO(c.name << " " << l);
      Rng rng(11);
      auto x = random(c.x, rng, l);
      auto w = random(c.w, rng, l);
      const Conv2dParams p = conv2d_same_padding(c.w, Conv2dParams::make(1, 0, c.dilation));
      const auto y = ops::conv2d_forward(x, w, p);
      CHECK(y.dim(2) == c.x[2]);
      CHECK(y.dim(3) == c.x[3]);
      require_close(y, direct_conv(x, w, Tensor<double>{}, p), 1e-12);
    }
}

TEST_CASE("gradcheck: conv2d with padding 'same' (odd and even kernels, dilation 2)") {
  for (const auto& c : same_cases)
    for (const Layout l : layouts) {
      Rng rng(12);
      auto x = random(c.x, rng, l);
      auto w = random(c.w, rng, l);
      const Conv2dParams p = conv2d_same_padding(c.w, Conv2dParams::make(1, 0, c.dilation));
      auto r = random(conv2d_output_shape(c.x, c.w, p), rng, l);
      const std::string tag = detail::cat(c.name, " ", l);
      gradcheck("same dx " + tag, x, [&] { return ops::conv2d_forward(x, w, p); },
                ops::conv2d_backward_data(r, w, x.shape(), p), r);
      gradcheck("same dw " + tag, w, [&] { return ops::conv2d_forward(x, w, p); },
                ops::conv2d_backward_filter(r, x, w.shape(), p), r);
    }
}

TEST_CASE("nn::Conv2d with same_padding keeps the spatial size; with stride s, ceil(size / s)") {
  nn::Conv2d<double> even({.in = 2, .out = 3, .kernel = 4, .dilation = 2, .same_padding = true, .seed = 1});
  CHECK(even.params().pad_top == 3);
  CHECK(even.params().pad_bottom == 3);
  nn::Conv2d<double> m({.in = 2, .out = 3, .kernel = 2, .same_padding = true, .seed = 1});
  CHECK(m.params().pad_top == 0);
  CHECK(m.params().pad_bottom == 1);
  Rng rng(3);
  auto x = autograd::parameter(random({2, 2, 5, 7}, rng));
  CHECK(m(x).value().shape() == Shape{2, 3, 5, 7});
  // Stride 2 (TensorFlow's SAME, ONNX's SAME_UPPER / SAME_LOWER): out = ceil(in / 2); a 2x2 kernel
  // on 5 rows needs 1 padding row, after (upper) or before (lower); on 7 columns, 1 too.
  for (const SamePadding mode : {SamePadding::upper, SamePadding::lower}) {
    nn::Conv2d<double> s2({.in = 2, .out = 3, .kernel = 2, .stride = 2, .same_padding = true, .same_mode = mode, .seed = 2});
    const Conv2dParams p = s2.params_for(x.shape());
    const int before = mode == SamePadding::upper ? 0 : 1;
    CHECK((p.pad_top == before && p.pad_bottom == 1 - before && p.pad_left == before && p.pad_right == 1 - before));
    const auto y = s2(x);
    CHECK(y.value().shape() == Shape{2, 3, 3, 4});
    require_close(y.value(), direct_conv(x.value(), s2.weight.value(), s2.bias.value(), p), 1e-12);
  }
  nn::Conv2d<double> s3({.in = 2, .out = 3, .kernel = 3, .stride = 3, .dilation = 2, .same_padding = true, .seed = 3});
  CHECK(s3(x).value().shape() == Shape{2, 3, 2, 3});  // ceil(5 / 3), ceil(7 / 3)
  CHECK(conv2d_same_padding(Shape{1, 1, 6, 6}, Shape{1, 1, 1, 1}, Conv2dParams::make(2, 0)).pad_bottom == 0);
  run_cases({
      bad<InvalidArgument>("params() of a same conv with stride 2", "nn::Conv2d::params", {"depends on the input", "params_for"},
                           [] { (void)nn::Conv2d<double>({.in = 2, .out = 3, .kernel = 3, .stride = 2, .same_padding = true}).params(); }),
      bad<InvalidArgument>("same with padding", "nn::Conv2d", {"must be zero", "pad t1 b1"},
                           [] { nn::Conv2d<double>({.in = 2, .out = 3, .kernel = 3, .padding = 1, .same_padding = true}); }),
      bad<InvalidArgument>("same with stride 1x2", "conv2d_same_padding", {"needs stride 1", "stride 1x2"},
                           [] { conv2d_same_padding(3, 3, {.stride_w = 2}); }),
      bad<InvalidArgument>("same with a zero kernel", "conv2d_same_padding", {"0x3"},
                           [] { conv2d_same_padding(0, 3); }),
      bad<InvalidArgument>("same from a 3-d w", "conv2d_same_padding", {"w must be 4-d", "[3,3,3]"},
                           [] { conv2d_same_padding(Shape{3, 3, 3}); }),
      bad<InvalidArgument>("same from a 3-d x", "conv2d_same_padding", {"x must be 4-d"},
                           [] { conv2d_same_padding(Shape{3, 3, 3}, Shape{1, 3, 1, 1}, {}); }),
  });
}

// ---- conv_transpose2d ----------------------------------------------------------------------

TEST_CASE("conv_transpose2d_output_shape: PyTorch's rule") {
  // (H-1)*s - 2p + d*(k-1) + op + 1
  CHECK(conv_transpose2d_output_shape({2, 3, 4, 5}, {3, 2, 3, 3}, ConvTranspose2dParams::make(2, 1, 1)) ==
        Shape{2, 2, 8, 10});
  CHECK(conv_transpose2d_output_shape({1, 4, 3, 3}, {4, 3, 3, 3}, ConvTranspose2dParams::make(2, 1, 0, 1, 2)) ==
        Shape{1, 6, 5, 5});
  CHECK(conv_transpose2d_output_shape({1, 2, 4, 4}, {2, 1, 3, 3}, ConvTranspose2dParams::make(1, 0, 0, 3)) ==
        Shape{1, 1, 10, 10});
}

TEST_CASE("conv_transpose2d_forward: hand-computed 1x1x2x2 input, 2x2 kernel, stride 2") {
  // Each input pixel stamps its value times the kernel into its own 2x2 block.
  auto x = Tensor<double>::from_vector({1, 2, 3, 4}, Shape{1, 1, 2, 2});
  auto w = Tensor<double>::from_vector({1, 10, 100, 1000}, Shape{1, 1, 2, 2});
  auto b = Tensor<double>::from_vector({0.5}, Shape{1});
  const auto y = ops::conv_transpose2d_forward(x, w, b, ConvTranspose2dParams::make(2, 0));
  REQUIRE(y.shape() == Shape{1, 1, 4, 4});
  require_close(y, {1.5, 10.5, 2.5, 20.5, 100.5, 1000.5, 200.5, 2000.5, 3.5, 30.5, 4.5, 40.5, 300.5, 3000.5, 400.5,
                    4000.5});
}

TEST_CASE("conv_transpose2d_forward: matches the naive scatter loop, both layouts, with and without bias") {
  for (const auto& c : transpose_cases)
    for (const Layout l : layouts) {
      INFO(c.name << " " << l);
      Rng rng(21);
      auto x = random(c.x, rng, l);
      auto w = random(c.w, rng, l);
      auto b = random({c.w[1] * c.p.groups}, rng);
      const auto y = ops::conv_transpose2d_forward(x, w, b, c.p);
      CHECK(y.shape() == conv_transpose2d_output_shape(c.x, c.w, c.p));
      CHECK(y.layout() == Tensor<double>(y.shape(), {.layout = l}).layout());
      require_close(y, naive_conv_transpose(x, w, b, c.p), 1e-12);
      require_close(ops::conv_transpose2d_forward(x, w, c.p), naive_conv_transpose(x, w, Tensor<double>{}, c.p),
                    1e-12);
    }
}

TEST_CASE("gradcheck: conv_transpose2d backward data, filter and bias") {
  for (const auto& c : transpose_cases)
    for (const Layout l : layouts) {
      Rng rng(22);
      auto x = random(c.x, rng, l);
      auto w = random(c.w, rng, l);
      auto b = random({c.w[1] * c.p.groups}, rng);
      auto r = random(conv_transpose2d_output_shape(c.x, c.w, c.p), rng, l);
      auto f = [&] { return ops::conv_transpose2d_forward(x, w, b, c.p); };
      const std::string tag = detail::cat(c.name, " ", l);
      gradcheck("conv_transpose2d dx " + tag, x, f, ops::conv_transpose2d_backward_data(r, w, x.shape(), c.p), r);
      gradcheck("conv_transpose2d dw " + tag, w, f, ops::conv_transpose2d_backward_filter(r, x, w.shape(), c.p), r);
      gradcheck("conv_transpose2d db " + tag, b, f, ops::conv2d_backward_bias(r), r);
    }
}

TEST_CASE("float conv_transpose2d matches double") {
  Rng rng(23);
  const auto& c = transpose_cases[0];
  for (const Layout l : layouts) {
    auto x = random(c.x, rng, l), w = random(c.w, rng, l), dy = random(conv_transpose2d_output_shape(c.x, c.w, c.p), rng, l);
    auto xf = cutrain::cast<float>(x), wf = cutrain::cast<float>(w), dyf = cutrain::cast<float>(dy);
    require_close(ops::conv_transpose2d_forward(xf, wf, c.p), ops::conv_transpose2d_forward(x, w, c.p).to_vector(), 1e-5);
    require_close(ops::conv_transpose2d_backward_data(dyf, wf, c.x, c.p),
                  ops::conv_transpose2d_backward_data(dy, w, c.x, c.p).to_vector(), 1e-5);
    require_close(ops::conv_transpose2d_backward_filter(dyf, xf, c.w, c.p),
                  ops::conv_transpose2d_backward_filter(dy, x, c.w, c.p).to_vector(), 1e-5);
  }
}

TEST_CASE("gradcheck: autograd conv_transpose2d -> conv2d 'same' -> sum", "[autograd]") {
  Rng rng(24);
  auto x = autograd::parameter(random({2, 3, 3, 4}, rng));
  auto wt = autograd::parameter(random({3, 2, 3, 3}, rng));
  auto bt = autograd::parameter(random({2}, rng));
  auto wc = autograd::parameter(random({2, 2, 2, 2}, rng));
  auto proj = random({2, 2, 6, 8}, rng);
  const auto pt = ConvTranspose2dParams::make(2, 1, 1);
  const auto pc = conv2d_same_padding(2, 2);
  auto loss_fn = [&] {
    auto y = autograd::conv2d(autograd::conv_transpose2d(x, wt, bt, pt), wc, pc);
    return autograd::sum(autograd::multiply(y, Var<double>(proj.view(), false)));
  };
  for (Var<double>* v : {&x, &wt, &bt, &wc}) v->zero_grad();
  Var<double> loss = loss_fn();
  loss.backward();
  const Tensor<double> one = Tensor<double>::full(Shape{}, 1.0);
  for (Var<double>* v : {&x, &wt, &bt, &wc}) {
    REQUIRE(v->grad().defined());
    const Tensor<double> analytic = v->grad().clone();
    gradcheck("autograd conv_transpose2d chain", v->value(), [&] {
      autograd::NoGradGuard ng;
      return loss_fn().value().view();
    }, analytic, one, 1e-6, 60);
  }
}

TEST_CASE("nn::ConvTranspose2d: shapes, parameters, and a stride-2 upsampling that doubles the size") {
  nn::ConvTranspose2d<double> up({.in = 4, .out = 2, .kernel = 3, .stride = 2, .padding = 1, .output_padding = 1,
                                  .seed = 5});
  CHECK(up.weight.value().shape() == Shape{4, 2, 3, 3});
  CHECK(up.bias.value().shape() == Shape{2});
  std::vector<std::string> names;
  up.visit_params("up", [&](const std::string& n, Var<double>&) { names.push_back(n); });
  CHECK(names == std::vector<std::string>{"up.weight", "up.bias"});
  Rng rng(6);
  auto x = autograd::parameter(random({2, 4, 5, 6}, rng));
  auto y = up(x);
  CHECK(y.value().shape() == Shape{2, 2, 10, 12});
  autograd::sum(y).backward();
  CHECK(up.weight.grad().shape() == Shape{4, 2, 3, 3});
  CHECK(x.grad().shape() == x.value().shape());
  run_cases({
      bad<InvalidArgument>("output_padding >= stride", "nn::ConvTranspose2d", {"output_padding < stride"},
                           [] { nn::ConvTranspose2d<double>({.in = 2, .out = 2, .kernel = 3, .stride = 2,
                                                             .output_padding = 2}); }),
      bad<InvalidArgument>("groups not dividing out", "nn::ConvTranspose2d", {"out 3", "groups 2"},
                           [] { nn::ConvTranspose2d<double>({.in = 2, .out = 3, .groups = 2}); }),
  });
}

TEST_CASE("conv_transpose2d: bad input") {
  Rng rng(25);
  auto x = random({2, 4, 5, 5}, rng);
  auto w = random({4, 3, 3, 3}, rng);
  const auto p = ConvTranspose2dParams::make(2, 1, 1);
  auto with = [&](auto edit) { ConvTranspose2dParams q = p; edit(q); return q; };
  auto y = ops::conv_transpose2d_forward(x, w, p);  // [2, 3, 10, 10]
  REQUIRE(y.shape() == Shape{2, 3, 10, 10});
  constexpr const char* fwd = "conv_transpose2d_forward";
  run_cases({
      bad<InvalidArgument>("channels of x != w.dim(0)", fwd, {"[2,4,5,5]", "[3,3,3,3]", "expects 3"},
                           [&] { ops::conv_transpose2d_forward(x, random({3, 3, 3, 3}, rng), p); }),
      bad<InvalidArgument>("groups not dividing Cin", fwd, {"[4,3,3,3]", "groups 3"},
                           [&] { ops::conv_transpose2d_forward(x, w, with([](auto& q) { q.groups = 3; })); }),
      bad<InvalidArgument>("output_padding == stride", fwd, {"smaller than the stride", "output_padding 2x2"},
                           [&] { ops::conv_transpose2d_forward(x, w, with([](auto& q) {
                               q.output_padding_h = q.output_padding_w = 2; })); }),
      bad<InvalidArgument>("output_padding >= stride though < dilation", fwd, {"smaller than the stride", "dilation 3x3"},
                           [&] { ops::conv_transpose2d_forward(x, w, ConvTranspose2dParams::make(1, 0, 1, 3)); }),
      bad<InvalidArgument>("negative output_padding", fwd, {"output_padding must be >= 0"},
                           [&] { ops::conv_transpose2d_forward(x, w, with([](auto& q) { q.output_padding_w = -1; })); }),
      bad<InvalidArgument>("negative output size", fwd, {"is not positive", "[2,4,5,5]", "pad 9x9"},
                           [&] { ops::conv_transpose2d_forward(x, w, ConvTranspose2dParams::make(2, 9)); }),
      bad<InvalidArgument>("zero stride", fwd, {"stride must be >= 1"},
                           [&] { ops::conv_transpose2d_forward(x, w, with([](auto& q) { q.stride_h = 0; })); }),
      bad<InvalidArgument>("negative padding", fwd, {"padding must be >= 0"},
                           [&] { ops::conv_transpose2d_forward(x, w, with([](auto& q) { q.pad_w = -1; })); }),
      bad<InvalidArgument>("rank-3 x", fwd, {"x"}, [&] { ops::conv_transpose2d_forward(random({4, 5, 5}, rng), w, p); }),
      bad<InvalidArgument>("undefined w", fwd, {"w"}, [&] { ops::conv_transpose2d_forward(x, Tensor<double>{}, p); }),
      bad<InvalidArgument>("bias of Cin instead of Cout", fwd, {"bias", "[4]"},
                           [&] { ops::conv_transpose2d_forward(x, w, random({4}, rng), p); }),
      bad<NotImplemented>("f16 on the host", fwd, {},
                          [&] { ops::conv_transpose2d_forward(Tensor<half>({2, 4, 5, 5}), Tensor<half>({4, 3, 3, 3}), p); }),
      bad<InvalidArgument>("dy of the wrong shape (data)", "conv_transpose2d_backward_data",
                           {"dy must have the output shape [2,3,10,10]", "[2,3,9,10]"},
                           [&] { ops::conv_transpose2d_backward_data(random({2, 3, 9, 10}, rng), w, x.shape(), p); }),
      bad<InvalidArgument>("x_shape inconsistent with w (data)", "conv_transpose2d_backward_data", {"[2,5,5,5]"},
                           [&] { ops::conv_transpose2d_backward_data(y, w, Shape{2, 5, 5, 5}, p); }),
      bad<InvalidArgument>("dy of the wrong shape (filter)", "conv_transpose2d_backward_filter",
                           {"dy must have the output shape", "[2,2,10,10]"},
                           [&] { ops::conv_transpose2d_backward_filter(random({2, 2, 10, 10}, rng), x, w.shape(), p); }),
      bad<InvalidArgument>("w_shape of another Cout (filter)", "conv_transpose2d_backward_filter", {"[4,2,3,3]"},
                           [&] { ops::conv_transpose2d_backward_filter(y, x, Shape{4, 2, 3, 3}, p); }),
      bad<InvalidArgument>("undefined x (autograd)", "autograd::conv_transpose2d", {"x"},
                           [&] { autograd::conv_transpose2d(Var<double>{}, autograd::parameter(w.view()), p); }),
  });
  // the good calls still work after all that
  CHECK(ops::conv_transpose2d_backward_data(y, w, x.shape(), p).shape() == x.shape());
  CHECK(ops::conv_transpose2d_backward_filter(y, x, w.shape(), p).shape() == w.shape());
}

}  // namespace cutrain_test_conv_extra

namespace cutrain_test_conv_extra_same_pool {
using namespace cutrain;

TEST_CASE("pooling with padding 'same': ceil(size / stride), padded taps never win, TF's average") {
  // 5 x 7 input, 2x2 windows, stride 2: out 3 x 4, one padding row and column, after (upper).
  std::vector<double> v(35);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) - 20;  // negatives: padding must not win
  const auto x = autograd::Var<double>(Tensor<double>::from_vector(v, {1, 1, 5, 7}));
  nn::MaxPool2d mp({.kernel = 2, .stride = 2, .same_padding = true});
  const auto y = mp(x).value().view();
  REQUIRE(y.shape() == Shape{1, 1, 3, 4});
  CHECK(y(0, 0, 2, 3) == v[4 * 7 + 6]);  // the last window holds x[4][6] alone
  CHECK(y(0, 0, 0, 0) == v[1 * 7 + 1]);
  nn::AvgPool2d ap({.kernel = 2, .stride = 2, .count_include_pad = false, .same_padding = true});
  const auto a = ap(x).value().view();
  CHECK(a(0, 0, 2, 3) == v[4 * 7 + 6]);                          // an average over the one tap inside x
  CHECK(a(0, 0, 2, 0) == (v[4 * 7 + 0] + v[4 * 7 + 1]) / 2);
  // lower: the padding row/column before.
  nn::MaxPool2d lower({.kernel = 2, .stride = 2, .same_padding = true, .same_mode = SamePadding::lower});
  const auto p = lower.params_for(x.shape());
  CHECK((p.pad_top == 1 && p.pad_bottom == 0 && p.pad_left == 1 && p.pad_right == 0));
  CHECK(lower(x).value()(0, 0, 0, 0) == v[0]);
  // 3x3 windows, stride 1: the spatial size stays.
  CHECK(nn::MaxPool2d({.kernel = 3, .stride = 1, .same_padding = true})(x).value().shape() == Shape{1, 1, 5, 7});
  CHECK_THROWS_WITH(pool2d_same_padding(Shape{1, 1, 5, 7}, Pool2dParams::max(2, 2, 1)),
                    Catch::Contains("pool2d_same_padding") && Catch::Contains("must be zero"));
}

}  // namespace cutrain_test_conv_extra_same_pool
