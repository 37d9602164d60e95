// The deploy engine's 8-bit mode on the GPU (deploy/engine_fp8.hpp): the quantize kernel rounds
// as the host's e4m3_from_float, bit for bit; an e4m3 convolution equals the same convolution on
// the CPU of the dequantized x and w (the engine's own scales) in f64; a quantized ResNet block
// (its residual convolution fused) stays near its bf16 engine; a saved quantized engine loads
// with the same outputs, and CUDA-graph replay gives the eager values.
#include "parity.hpp"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "cutrain/core/fp8.hpp"
#include "cutrain/cuda/kernels/quantize.hpp"
#include "cutrain/deploy/engine_file.hpp"
#include "cutrain/deploy/engine_fp8.hpp"
#include "cutrain/nn.hpp"
#include "random_model.hpp"
#include "temp_dir.hpp"

namespace cutrain_test_deploy_fp8_gpu {  // one per file: the unity build compiles files together

using namespace cutrain;
using namespace cutrain::test;

namespace {

// Batches of random inputs in [-2, 2) on the GPU, in bf16, NHWC.
std::vector<Tensor<bfloat16>> batches(const Shape& s, int count, Rng& rng) {
  std::vector<Tensor<bfloat16>> b;
  for (int i = 0; i < count; ++i)
    b.push_back(cast<bfloat16>(Tensor<float>::uniform(s, rng, -2.0, 2.0, {.layout = Layout::nhwc})).to(Device::cuda(0)));
  return b;
}

// t (host or device, any T) dequantized: e4m3(t * (1 / scale)) * scale, in f64, row-major.
template <class T>
Tensor<double> dequantized(const Tensor<T>& t, float scale) {
  const auto f = cast<float>(t.to(Device::cpu())).contiguous(Layout::row_major);
  Tensor<double> r(f.shape());
  const float inv = 1.0f / scale;
  for (std::int64_t i = 0; i < f.numel(); ++i)
    r.data()[i] = static_cast<double>(float_from_e4m3(e4m3_from_float(f.data()[i] * inv))) * scale;
  return r;
}

}  // namespace

TEST_CASE("gpu e4m3: the quantize kernel rounds as the host", "[gpu][deploy][fp8]") {
  Rng rng(91);
  for (const Shape& shape : {Shape{4, 16, 9, 7}, Shape{3, 3, 5, 7}}) {  // four bytes per store; and a tail of 3
    auto host = Tensor<float>::uniform(shape, rng, -300.0, 300.0, {.layout = Layout::nhwc});
    for (std::int64_t i = 0; i < host.numel(); i += 7) host.data()[i] *= static_cast<float>(std::ldexp(1.0, -12));  // subnormals
    host.data()[3] = std::nanf("");
    const auto x = cast<bfloat16>(host);
    for (const float scale : {1.0f, 0.37f, 0.004f}) {
      Tensor<std::uint8_t> y(x.shape(), {.layout = Layout::nhwc, .device = Device::cuda(0)});
      cuda::kernels::quantize_e4m3(x.to(Device::cuda(0)), scale, y);
      const auto got = y.to(Device::cpu());
      const auto xf = cast<float>(x);
      std::int64_t differ = 0;
      for (std::int64_t i = 0; i < xf.numel(); ++i)
        differ += got.data()[i] != e4m3_from_float(xf.data()[i] * (1.0f / scale));
      INFO("shape " << shape << ", scale " << scale);
      CHECK(differ == 0);
    }
  }
}

TEST_CASE("gpu e4m3: a quantized convolution equals the CPU's on the dequantized x and w", "[gpu][deploy][fp8]") {
  Rng rng(92);
  nn::Sequential<double> net{nn::Conv2d<double>({.in = 16, .out = 32, .kernel = 3, .padding = 1}, rng), nn::ReLU{}};
  randomize(net, rng);
  const Shape in{8, 16, 12, 12};
  for (const bool per_channel : {true, false}) {
    auto e = deploy::compile<bfloat16>(net, in, {.device = Device::cuda(0), .layout = Layout::nhwc});
    const auto cal = batches(in, 2, rng);
    deploy::quantize_e4m3<bfloat16>(e, cal, {.per_channel = per_channel, .keep_faster = false});
    INFO(e.report());
    REQUIRE(e.plan().steps.size() == 1);
    const auto& s = e.plan().steps[0];
    REQUIRE(s.x_scale > 0);
    CHECK(e.report().find(std::string("1 of 1 convolutions in e4m3 (max calibration, w scales per ") +
                          (per_channel ? "channel" : "tensor")) != std::string::npos);
    CHECK(s.w_scale.size() == (per_channel ? 32u : 1u));
    // max calibration: the largest |x| of the batches maps onto 448
    double largest = 0;
    for (const auto& b : cal) {
      const auto f = cast<float>(b.to(Device::cpu()));
      for (std::int64_t i = 0; i < f.numel(); ++i) largest = std::max(largest, std::fabs(static_cast<double>(f.data()[i])));
    }
    CHECK(s.x_scale == static_cast<float>(largest) / 448.0f);
    const auto x = std::move(batches(in, 1, rng)[0]);
    // The reference: w per output channel and x dequantized with the engine's scales, conv in f64.
    const auto wf = cast<double>(s.w.to(Device::cpu())).contiguous(Layout::row_major);
    Tensor<double> wd(wf.shape());
    const std::int64_t k = wf.dim(0), per = wf.numel() / k;
    for (std::int64_t o = 0; o < k; ++o) {
      const float sc = s.w_scale[per_channel ? static_cast<std::size_t>(o) : 0], inv = 1.0f / sc;
      for (std::int64_t j = 0; j < per; ++j)
        wd.data()[o * per + j] =
            static_cast<double>(float_from_e4m3(e4m3_from_float(static_cast<float>(wf.data()[o * per + j]) * inv))) * sc;
    }
    const auto bias = cast<double>(s.b.to(Device::cpu())).contiguous(Layout::row_major).reshape({k});
    const auto ref = ops::activation_forward(ops::conv2d_forward(dequantized(x, s.x_scale), wd, bias, s.conv),
                                             {.kind = Activation::relu});
    check_close(per_channel ? "e4m3 conv, w per channel" : "e4m3 conv, w per tensor", e(x), ref, 1e-2);
  }
}

TEST_CASE("gpu e4m3: a quantized ResNet block stays near its bf16 engine; files and graphs keep it", "[gpu][deploy][fp8]") {
  Rng rng(93);
  nn::Sequential<double> net = small_resnet(rng);
  const Shape in{16, 3, 16, 16};
  const deploy::CompileOptions o{.device = Device::cuda(0), .layout = Layout::nhwc, .min_batch = 4};
  const auto plain = deploy::compile<bfloat16>(net, in, o);
  auto q = deploy::compile<bfloat16>(net, in, o);
  const auto cal = batches(in, 3, rng);
  const deploy::QuantizeOptions every{.calibrator = Calibrator::percentile, .percentile = 99.9, .keep_faster = false};
  deploy::quantize_e4m3<bfloat16>(q, cal, every);
  INFO(q.report());
  int convs = 0, eight = 0, residual = 0;
  for (const auto& s : q.plan().steps)
    if (s.kind == deploy::StepKind::conv) ++convs, eight += s.x_scale > 0, residual += s.x_scale > 0 && s.in2 >= 0;
  CHECK(convs == 6);
  CHECK(eight >= 5);     // the stem's 3 input channels may have no e4m3 engine
  CHECK(residual == 2);  // conv + descale + bias + residual + relu as one e4m3 graph
  CHECK(q.report().find("(percentile 99.9 calibration, w scales per channel)") != std::string::npos);
  {  // keep_faster: each convolution timed both ways, e4m3 kept exactly where it was faster
    auto fast = deploy::compile<bfloat16>(net, in, o);
    deploy::quantize_e4m3<bfloat16>(fast, cal);
    INFO(fast.report());
    CHECK(fast.report().find("w scales per channel, where faster)") != std::string::npos);
    for (const auto& s : fast.plan().steps) {
      if (s.kind != deploy::StepKind::conv || s.e4m3_ms < 0) continue;
      CHECK(s.base_ms > 0);
      CHECK((s.x_scale > 0) == (s.e4m3_ms < s.base_ms));
    }
  }
  for (const std::int64_t batch : {16, 5}) {
    const auto x = std::move(batches(Shape{batch, 3, 16, 16}, 1, rng)[0]);
    const auto want = cast<double>(plain(x).to(Device::cpu()));
    const auto y = q(x);
    // 8-bit is an approximation: within 15% of the logits' range of the 16-bit engine's
    check_close("e4m3 resnet vs bf16, batch " + std::to_string(batch), y, want, 0.15);
    TempDir dir("deploy_fp8");
    deploy::save_engine(q, dir / "q.engine");
    const auto loaded = deploy::load_engine<bfloat16>(dir / "q.engine");
    CHECK(loaded.report() == q.report());
    CHECK(cast<double>(loaded(x).to(Device::cpu())).to_vector() == cast<double>(y.to(Device::cpu())).to_vector());
  }
  // One w scale per tensor: a scalar descale, saved and loaded as such.
  auto qt = deploy::compile<bfloat16>(net, in, o);
  deploy::quantize_e4m3<bfloat16>(qt, cal, {.per_channel = false, .keep_faster = false});
  {
    const auto x = std::move(batches(Shape{6, 3, 16, 16}, 1, rng)[0]);
    const auto y = qt(x);
    check_close("e4m3 resnet, w per tensor, vs bf16", y, cast<double>(plain(x).to(Device::cpu())), 0.15);
    TempDir dir("deploy_fp8_tensor");
    deploy::save_engine(qt, dir / "qt.engine");
    const auto loaded = deploy::load_engine<bfloat16>(dir / "qt.engine");
    CHECK(loaded.report() == qt.report());
    CHECK(loaded.report().find("w scales per tensor") != std::string::npos);
    CHECK(cast<double>(loaded(x).to(Device::cpu())).to_vector() == cast<double>(y.to(Device::cpu())).to_vector());
  }
  auto og = o;
  og.cuda_graph = true;
  auto qg = deploy::compile<bfloat16>(net, in, og);
  deploy::quantize_e4m3<bfloat16>(qg, cal, every);
  const auto x = std::move(batches(Shape{8, 3, 16, 16}, 1, rng)[0]);
  const auto eager = cast<double>(q(x).to(Device::cpu())).to_vector();
  for (int rep = 0; rep < 2; ++rep) CHECK(cast<double>(qg(x).to(Device::cpu())).to_vector() == eager);
  CHECK(qg.captured().size() == 1);
}

TEST_CASE("gpu e4m3: quantize_e4m3 refuses what it cannot run", "[gpu][deploy][fp8][bad_input]") {
  Rng rng(94);
  nn::Sequential<double> net{nn::Conv2d<double>({.in = 16, .out = 16, .kernel = 3, .padding = 1}, rng), nn::ReLU{}};
  const Shape in{4, 16, 8, 8};
  auto rm = deploy::compile<bfloat16>(net, in, {.device = Device::cuda(0)});
  auto f32 = deploy::compile<float>(net, in, {.device = Device::cuda(0), .layout = Layout::nhwc});
  auto ok = deploy::compile<bfloat16>(net, in, {.device = Device::cuda(0), .layout = Layout::nhwc});
  const auto cal = batches(in, 1, rng);
  const auto wrong = batches(Shape{4, 8, 8, 8}, 1, rng);
  const std::vector<Tensor<bfloat16>> none;
  CHECK_THROWS_WITH(deploy::quantize_e4m3<bfloat16>(rm, cal), Catch::Matchers::Contains("in row_major"));
  CHECK_THROWS_WITH(deploy::quantize_e4m3<float>(f32, {}), Catch::Matchers::Contains("this one is f32 on cuda:0"));
  CHECK_THROWS_WITH(deploy::quantize_e4m3<bfloat16>(ok, none), Catch::Matchers::Contains("at least one calibration batch"));
  CHECK_THROWS_WITH(deploy::quantize_e4m3<bfloat16>(ok, wrong), Catch::Matchers::Contains("does not fit the engine's input"));
  CHECK_THROWS_WITH(deploy::quantize_e4m3<bfloat16>(ok, cal, {.calibrator = Calibrator::percentile, .percentile = 0}),
                    Catch::Matchers::Contains("percentile must be in (0, 100]"));
  CHECK_FALSE(ok.quantized());
  deploy::quantize_e4m3<bfloat16>(ok, cal);
  CHECK_THROWS_WITH(deploy::quantize_e4m3<bfloat16>(ok, cal), Catch::Matchers::Contains("quantized already"));
}

}  // namespace cutrain_test_deploy_fp8_gpu
