// deploy::quantize_e4m3(engine, batches, options): the engine's convolutions in FP8 e4m3 on the
// GPU, calibrated on real data, TensorRT's "precision calibration". Each convolution's weights get
// one scale per output channel (its largest |w| / 448); its input one scale per tensor, from the
// |x| it saw on the calibration batches (the largest, or a percentile: QuantizeOptions). At run
// time x / scale is rounded to e4m3 (cuda/kernels/quantize.hpp), the convolution accumulates in
// f32 and multiplies both scales back in before the bias, residual and activation, and writes E
// (cuda/cudnn/conv_fp8.hpp): one more pass over x than the 16-bit step. A convolution cuDNN has
// no e4m3 engine for stays in E, and so do the other steps (linear layers, pools, adds); the
// report marks each convolution's precision.
//
//   auto engine = deploy::compile<bfloat16>(model, Shape{256, 1, 28, 28}, {.device = Device::cuda(0), .layout = Layout::nhwc});
//   deploy::quantize_e4m3(engine, calibration_batches, {.calibrator = Calibrator::percentile});
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "cutrain/core/fp8.hpp"
#include "cutrain/deploy/engine.hpp"

namespace cutrain::inline CUTRAIN_ABI::deploy {

namespace detail {
inline constexpr std::string_view quantize_op = "deploy::quantize_e4m3";

// w [K, ...] (host, any layout) in e4m3: its scales (the largest |w| / 448 per output channel,
// or one for the tensor; 1 for all zeros) and w / scale in e4m3, row-major.
template <class E>
std::pair<std::vector<float>, Tensor<std::uint8_t>> quantize_weights(const Tensor<E>& w, bool per_channel) {
  const Tensor<float> wf = cast<float>(w.to(Device::cpu())).contiguous(Layout::row_major);
  const std::int64_t k = wf.dim(0), per = wf.numel() / k, groups = per_channel ? k : 1, size = wf.numel() / groups;
  std::vector<float> scale(static_cast<std::size_t>(groups));
  Tensor<std::uint8_t> q(wf.shape());
  for (std::int64_t o = 0; o < groups; ++o) {
    float m = 0;
    for (std::int64_t j = 0; j < size; ++j) m = std::max(m, std::fabs(wf.data()[o * size + j]));
    scale[static_cast<std::size_t>(o)] = m > 0 ? m / e4m3_max : 1.0f;
    const float inv = 1.0f / scale[static_cast<std::size_t>(o)];  // as the GPU's kernel: x * (1 / scale)
    for (std::int64_t j = 0; j < size; ++j) q.data()[o * size + j] = e4m3_from_float(wf.data()[o * size + j] * inv);
  }
  return {std::move(scale), std::move(q)};
}
}  // namespace detail

template <class E>
struct Quantizer {
  static void run(Engine<E>& e, std::span<const Tensor<E>> batches, const QuantizeOptions& o) {
    using detail::quantize_op;
    const auto& opt = e.options();
    constexpr bool sixteen = std::same_as<E, bfloat16> || std::same_as<E, half>;
    CUTRAIN_REQUIRE(sixteen && opt.device.is_cuda() && opt.layout == Layout::nhwc, InvalidArgument, quantize_op,
                    "e4m3 convolutions run on cuDNN's engines: a GPU engine in bf16 or f16 with the nhwc layout; this "
                    "one is ", dtype_of<E>, " on ", opt.device, " in ", opt.layout);
    CUTRAIN_REQUIRE(!e.quantized_, InvalidArgument, quantize_op, "the engine is quantized already");
    CUTRAIN_REQUIRE(!batches.empty(), InvalidArgument, quantize_op, "needs at least one calibration batch");
    CUTRAIN_REQUIRE(o.calibrator == Calibrator::max || (o.percentile > 0 && o.percentile <= 100), InvalidArgument,
                    quantize_op, "percentile must be in (0, 100], got ", o.percentile);
    for (const auto& b : batches) e.check_input(quantize_op, b);
#ifdef CUTRAIN_WITH_CUDA
    if constexpr (sixteen) calibrate(e, batches, o);
#endif
  }

#ifdef CUTRAIN_WITH_CUDA
  static void calibrate(Engine<E>& e, std::span<const Tensor<E>> batches, const QuantizeOptions& o) {
    using detail::quantize_op;
    const auto& opt = e.options();
    auto& steps = e.plan_.steps;
    const std::size_t n = steps.size();
    // |x| per convolution over the batches, in the engine as compiled (E throughout).
    std::vector<float> largest(n, 0.0f);
    std::vector<std::vector<float>> sample(n);
    for (const auto& b : batches)
      (void)e.forward(b, [&](std::size_t i, const std::vector<Tensor<E>>& v) {
        if (steps[i].kind != StepKind::conv) return;
        const Tensor<E>& x = v[static_cast<std::size_t>(steps[i].in)];
        const Tensor<float> xf = cast<float>(x.to(Device::cpu()));
        const std::int64_t m = xf.numel(), stride = (std::max<std::int64_t>(1, m >> 20)) | 1;  // odd: every channel
        for (std::int64_t j = 0; j < m; ++j) largest[i] = std::max(largest[i], std::fabs(xf.data()[j]));
        if (o.calibrator == Calibrator::percentile)
          for (std::int64_t j = 0; j < m; j += stride) sample[i].push_back(std::fabs(xf.data()[j]));
      });
    for (std::size_t i = 0; i < n; ++i) {
      auto& s = steps[i];
      if (s.kind != StepKind::conv) continue;
      CUTRAIN_REQUIRE(std::isfinite(largest[i]), InvalidArgument, quantize_op, "step ", i, " (module ", s.module,
                      ") saw a NaN or an infinity in its input on the calibration batches");
      std::vector<float> one{largest[i]};
      s.x_scale = e4m3_scale(o.calibrator == Calibrator::max ? std::span<float>(one) : std::span<float>(sample[i]),
                             o.calibrator, o.percentile);
      auto [ws, wq] = detail::quantize_weights(s.w, o.per_channel);
      const auto k = static_cast<std::int64_t>(ws.size());
      Tensor<float> d(Shape{1, k, 1, 1});
      for (std::int64_t c = 0; c < k; ++c) d.data()[c] = s.x_scale * ws[static_cast<std::size_t>(c)];
      s.w_scale = std::move(ws);
      s.wq = wq.contiguous(Layout::nhwc).to(opt.device);
      s.descale = d.to(opt.device);
      if (!s.b.defined()) s.b = Tensor<E>::zeros(Shape{s.w.dim(0)}, {.device = opt.device});
    }
    // A trial on the first batch: a convolution cuDNN builds no e4m3 graph for stays in E, and
    // with keep_faster one whose e4m3 form (quantize and convolution) is not faster than E's.
    const auto demote = [](Step<E>& s) {
      s.x_scale = 0;
      s.w_scale.clear();
      s.wq = {};
      s.descale = {};
    };
    const auto ms_of = [](auto&& call) {  // the mean of 10 calls after 2, CUDA events
      call();
      call();
      cuda::Event a, b;
      a.record();
      for (int k = 0; k < 10; ++k) call();
      b.record();
      b.synchronize();
      return b.elapsed_ms(a) / 10.0f;
    };
    (void)e.forward(batches[0], [&](std::size_t i, const std::vector<Tensor<E>>& v) {
      auto& s = steps[i];
      if (s.x_scale <= 0) return;
      if (!e.run_e4m3(i, v)) return demote(s);
      const float x_scale = s.x_scale;
      s.e4m3_ms = ms_of([&] { (void)e.run(i, v); });
      s.x_scale = 0;  // run() takes the step in E
      s.base_ms = ms_of([&] { (void)e.run(i, v); });
      s.x_scale = x_scale;
      if (o.keep_faster && s.e4m3_ms >= s.base_ms) demote(s);
    });
    e.quantized_ = o;
    if (e.replays_) e.replays_->clear();  // graphs captured before hold the 16-bit steps
  }
#endif
};

// Calibrates and quantizes engine's convolutions to e4m3 on batches (inputs the engine takes, on
// its device; a few hundred real samples). InvalidArgument for an engine that is not a GPU engine
// in bf16 or f16 with the nhwc layout, one quantized already, no batches or a batch that does not
// fit, a percentile outside (0, 100].
template <class E>
void quantize_e4m3(Engine<E>& engine, std::span<const Tensor<E>> batches, const QuantizeOptions& o = {}) {
  Quantizer<E>::run(engine, batches, o);
}

}  // namespace cutrain::inline CUTRAIN_ABI::deploy
