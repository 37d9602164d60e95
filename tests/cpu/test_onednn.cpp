// oneDNN's f32 convolutions and linear layers (cpu/onednn.hpp, built with cutrain::onednn) against
// cutrain's f64 Eigen ops on fresh random data: every tactic (direct on x's layout, direct
// blocked, Winograd) with and without a residual and activation, strides, 1x1, groups, one input
// channel; tuning; the CPU engine in NHWC (its flatten that reads NHWC memory as it lies, with the
// linear layer's weights permuted) against the model; tactics kept through an engine file.
// Without cutrain::onednn (the ASan build) this file registers no tests.
#include "gradcheck.hpp"

#ifdef CUTRAIN_ONEDNN

#include <string>
#include <thread>
#include <vector>

#include "cutrain/autograd/engine.hpp"
#include "cutrain/core/cast.hpp"
#include "cutrain/cpu/conv2d.hpp"
#include "cutrain/cpu/linear.hpp"
#include "cutrain/cpu/onednn.hpp"
#include "cutrain/deploy/engine_file.hpp"
#include "cutrain/nn.hpp"
#include "random_model.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_onednn {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

// max |a - b| / max(1, max |b|)
double scaled_err(const Tensor<float>& a, const Tensor<double>& b) {
  REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector();
  const auto y = b.to_vector();
  double err = 0, peak = 1;
  for (std::size_t i = 0; i < x.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(x[i]) - y[i]));
    peak = std::max(peak, std::abs(y[i]));
  }
  return err / peak;
}

struct ConvCase {
  Shape x, w;
  Conv2dParams p;
  std::string name;
};

}  // namespace

TEST_CASE("onednn::Conv2d: every tactic matches the f64 convolution", "[onednn]") {
  const std::vector<ConvCase> cases{
      {{2, 16, 9, 7}, {32, 16, 3, 3}, Conv2dParams::make(1, 1), "3x3 stride 1"},
      {{2, 16, 9, 8}, {24, 16, 3, 3}, Conv2dParams::make(2, 1), "3x3 stride 2"},
      {{3, 32, 6, 6}, {16, 32, 1, 1}, Conv2dParams::make(1, 0), "1x1"},
      {{2, 16, 8, 8}, {16, 8, 3, 3}, Conv2dParams::make(1, 1, 1, 2), "groups 2"},
      {{4, 1, 12, 12}, {16, 1, 3, 3}, Conv2dParams::make(1, 1), "one input channel"},
  };
  Rng rng(61);
  int ran = 0;
  for (const auto& c : cases)
    for (const Layout l : {Layout::nhwc, Layout::nchw})
      for (const bool residual : {false, true})
        for (const Activation a : {Activation::relu, Activation::identity, Activation::gelu_erf}) {
          const auto xd = Tensor<double>::uniform(c.x, rng, -1, 1, {.layout = l});
          const auto wd = Tensor<double>::uniform(c.w, rng, -0.5, 0.5);
          const auto bd = Tensor<double>::uniform(Shape{c.w[0]}, rng, -0.5, 0.5);
          const Shape ys = conv2d_output_shape(c.x, c.w, c.p, "test");
          const auto rd = residual ? Tensor<double>::uniform(ys, rng, -1, 1, {.layout = l}) : Tensor<double>{};
          const ActivationParams act{.kind = a};
          const auto want = cpu::conv2d_fused_forward(xd, wd, bd, rd, act, c.p);
          const auto xf = cast<float>(xd), rf = residual ? cast<float>(rd) : Tensor<float>{};
          for (const char* tactic : {"direct nhwc", "direct nchw", "direct blocked", "winograd blocked"}) {
            cpu::onednn::Conv2d conv(cast<float>(wd), cast<float>(bd), c.p, act);
            conv.set_tactic(tactic);
            Tensor<float> y(ys, {.layout = l});
            if (!conv.forward(xf, rf, y)) continue;  // no direct kernel for these layouts at all
            if (!conv.fuses_activation()) y = cpu::activation_forward(y, act);
            INFO(c.name << " " << l << (residual ? " +residual " : " ") << a << ": tactic " << tactic);
            CHECK(scaled_err(y, want) < 1e-4);
            ++ran;
          }
        }
  // NHWC has a direct kernel on every CPU oneDNN supports: the loop cannot have skipped them all.
  CHECK(ran >= static_cast<int>(cases.size()) * 2 * 3);
}

TEST_CASE("onednn::Conv2d: tune picks a tactic whose output agrees", "[onednn]") {
  Rng rng(67);
  const auto wd = Tensor<double>::uniform(Shape{32, 32, 3, 3}, rng, -0.3, 0.3);
  const auto bd = Tensor<double>::uniform(Shape{32}, rng, -0.3, 0.3);
  const auto p = Conv2dParams::make(1, 1);
  const ActivationParams relu{.kind = Activation::relu};
  cpu::onednn::Conv2d conv(cast<float>(wd), cast<float>(bd), p, relu);
  CHECK(conv.tactic().empty());
  const std::string report = conv.tune(Shape{4, 32, 10, 10}, true, true, true);
  INFO(report);
  CHECK(!conv.tactic().empty());
  CHECK(report.find(conv.tactic()) == 0);
  CHECK(report.find("direct nhwc") != std::string::npos);  // the reference was timed too
  const auto xd = Tensor<double>::uniform(Shape{4, 32, 10, 10}, rng, -1, 1, {.layout = Layout::nhwc});
  const auto rd = Tensor<double>::uniform(Shape{4, 32, 10, 10}, rng, -1, 1, {.layout = Layout::nhwc});
  Tensor<float> y(Shape{4, 32, 10, 10}, {.layout = Layout::nhwc});
  REQUIRE(conv.forward(cast<float>(xd), cast<float>(rd), y));
  CHECK(scaled_err(y, cpu::conv2d_fused_forward(xd, wd, bd, rd, relu, p)) < 1e-4);
}

TEST_CASE("onednn::Linear matches the f64 linear layer", "[onednn]") {
  Rng rng(71);
  for (const bool bias : {true, false})
    for (const Activation a : {Activation::relu, Activation::identity, Activation::tanh}) {
      const auto xd = Tensor<double>::uniform(Shape{5, 37}, rng, -1, 1);
      const auto wd = Tensor<double>::uniform(Shape{11, 37}, rng, -0.5, 0.5);
      const auto bd = bias ? Tensor<double>::uniform(Shape{11}, rng, -0.5, 0.5) : Tensor<double>{};
      const ActivationParams act{.kind = a};
      const cpu::onednn::Linear lin(cast<float>(wd), bias ? cast<float>(bd) : Tensor<float>{}, act);
      Tensor<float> y = lin.forward(cast<float>(xd));
      if (!lin.fuses_activation()) y = cpu::activation_forward(y, act);
      INFO((bias ? "bias " : "no bias ") << a);
      CHECK(scaled_err(y, cpu::activation_forward(cpu::linear_forward(xd, wd, bd), act)) < 1e-5);
    }
}

TEST_CASE("deploy engine on the CPU in NHWC f32 (oneDNN) matches the model, and a file keeps its tactics",
          "[onednn][deploy]") {
  Rng rng(73);
  auto cnn = nn::fashion_mnist_cnn<double>(rng);
  randomize(cnn, rng);
  auto net = small_resnet(rng);
  TempDir dir("onednn_engine");
  for (auto* model : {&cnn, &net}) {
    const Shape in = model == &cnn ? Shape{3, 1, 28, 28} : Shape{3, 3, 8, 8};
    const auto engine = deploy::compile<float>(*model, in, {.layout = Layout::nhwc, .min_batch = 1});
    model->eval();
    for (const std::int64_t batch : {in[0], std::int64_t{1}}) {
      Shape s = in;
      s[0] = batch;
      const auto x = Tensor<double>::uniform(s, rng, -1, 1);
      autograd::NoGradGuard off;
      const auto want = (*model)(x).value().contiguous(Layout::row_major);
      CHECK(scaled_err(engine(cast<float>(x)).contiguous(Layout::row_major), want) < 1e-4);
    }
    int convs = 0;
    for (std::size_t i = 0; i < engine.plan().steps.size(); ++i)
      if (engine.plan().steps[i].kind == deploy::StepKind::conv) {
        CHECK(!engine.cpu_tactic(i).empty());
        ++convs;
      }
    CHECK(convs > 0);
    deploy::save_engine(engine, dir / "model.engine");
    const auto loaded = deploy::load_engine<float>(dir / "model.engine");
    for (std::size_t i = 0; i < engine.plan().steps.size(); ++i) CHECK(loaded.cpu_tactic(i) == engine.cpu_tactic(i));
    CHECK(loaded.report() == engine.report());
    const auto x = Tensor<float>::uniform(in, rng, -1, 1);
    const auto a = engine(x).contiguous(Layout::row_major), b = loaded(x).contiguous(Layout::row_major);
    for (std::int64_t i = 0; i < a.numel(); ++i) REQUIRE(a.flat(i) == b.flat(i));
  }
}

TEST_CASE("deploy engine on oneDNN: a conv and the pool after it run in batch chunks", "[onednn][deploy]") {
  Rng rng(83);
  auto cnn = nn::fashion_mnist_cnn<double>(rng);
  randomize(cnn, rng);
  // The CNN's first conv (one input channel: 9 multiply-adds an output, 98 KiB an image) chunks by
  // 10, its second (288 multiply-adds an output) runs whole. The block's last conv (3 channels,
  // 3 x 3: 27, 192 KiB an image at 128 x 128, with the residual) feeds the max pool: chunks of 5.
  nn::Sequential<double> res{nn::ResidualBlock<double>({.in = 3}), nn::MaxPool2d({.kernel = 2}),
                             nn::AdaptiveAvgPool2d{}, nn::Flatten{}, nn::Linear<double>({.in = 3, .out = 5}, rng)};
  randomize(res, rng);
  for (auto* model : {&cnn, &res}) {
    const bool is_cnn = model == &cnn;
    const Shape in = is_cnn ? Shape{37, 1, 28, 28} : Shape{9, 3, 128, 128};
    model->eval();
    for (const Layout l : {Layout::nhwc, Layout::row_major}) {
      const auto engine = deploy::compile<float>(*model, in, {.layout = l});
      const std::string r = engine.report();
      INFO(r);
      CHECK(r.find(is_cnn ? "in chunks of 10 images with the pool after it" : "in chunks of 5 images") !=
            std::string::npos);
      CHECK(r.find("in chunks") == r.rfind("in chunks"));  // one conv each
      if (is_cnn) {  // the second conv runs with its pool too, whole
        const auto second = r.find("oneDNN:", r.find("2: conv"));
        CHECK(r.find(", with the pool after it", second) < r.find('\n', second));
      }
      for (const std::int64_t batch : {in[0], std::int64_t{3}}) {  // 37: three chunks and a part; 9: 5 + 4; 3: none
        Shape s = in;
        s[0] = batch;
        const auto x = Tensor<double>::uniform(s, rng, -1, 1);
        autograd::NoGradGuard off;
        const auto want = (*model)(x).value().contiguous(Layout::row_major);
        profile::Session prof;  // the chunked path ran (or, below a chunk, did not)
        const auto got = engine(cast<float>(x)).contiguous(Layout::row_major);
        prof.stop();
        CHECK((prof.table().find("(oneDNN, in chunks)") != std::string::npos) == (batch > 3));
        CHECK(prof.table().find("\npool2d_forward (oneDNN)") == std::string::npos);  // every pool ran in its conv
        CHECK(scaled_err(got, want) < 1e-4);
      }
    }
  }
}

TEST_CASE("deploy engine on oneDNN: calls from other threads than the compiling one", "[onednn][deploy]") {
  Rng rng(79);
  auto net = small_resnet(rng);
  const auto engine = deploy::compile<float>(net, Shape{2, 3, 8, 8}, {.layout = Layout::nhwc});
  const auto x = Tensor<float>::uniform(Shape{2, 3, 8, 8}, rng, -1, 1);
  const auto want = engine(x).contiguous(Layout::row_major);
  std::vector<Tensor<float>> got(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      try {
        for (int k = 0; k < 5; ++k) got[t] = engine(x).contiguous(Layout::row_major);
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  for (std::size_t t = 0; t < got.size(); ++t) {
    INFO("thread " << t << ": " << errors[t]);
    REQUIRE(errors[t].empty());
    for (std::int64_t i = 0; i < want.numel(); ++i) REQUIRE(got[t].flat(i) == want.flat(i));
  }
}

}  // namespace cutrain_test_onednn

#endif  // CUTRAIN_ONEDNN
