// optim::GradScaler: dynamic loss scaling for f16 training, the rules of PyTorch's GradScaler.
// f16 gradients of small losses underflow to zero; backward(loss) seeds the graph with `scale`
// instead of 1, so every gradient comes out multiplied by it, and step(opt) divides them back
// before the optimizer sees them. A step whose gradients hold an inf or NaN is skipped and the
// scale halves; after growth_interval clean steps in a row it doubles. (bf16 has f32's range and
// needs no scaling.)
//
//   optim::GradScaler<float> scaler;
//   auto loss = nn::cross_entropy(nn::autocast<half>(net, x), y);
//   opt.zero_grad();
//   scaler.backward(loss);
//   scaler.step(opt);  // unscale, check, step or skip, update the scale
//
// Finding an overflow needs one read of a device flag per step: a scaled step cannot run inside
// a CUDA graph capture (it throws there).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "cutrain/autograd/var.hpp"
#include "cutrain/core/checkpoint.hpp"
#include "cutrain/ops/elementwise.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/optim.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
};

template <class T>
class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& o = {}) : opts_(o), scale_(o.init_scale) {
    constexpr std::string_view op = "optim::GradScaler";
    CUTRAIN_REQUIRE(std::isfinite(o.init_scale) && o.init_scale > 0, InvalidArgument, op,
                    "init_scale must be finite and > 0, got ", o.init_scale);
    CUTRAIN_REQUIRE(std::isfinite(o.growth_factor) && o.growth_factor > 1, InvalidArgument, op,
                    "growth_factor must be finite and > 1, got ", o.growth_factor);
    CUTRAIN_REQUIRE(o.backoff_factor > 0 && o.backoff_factor < 1, InvalidArgument, op,
                    "backoff_factor must be in (0, 1), got ", o.backoff_factor);
    CUTRAIN_REQUIRE(o.growth_interval >= 1, InvalidArgument, op, "growth_interval must be >= 1, got ",
                    o.growth_interval);
  }

  double scale() const { return scale_; }
  std::int64_t skipped_steps() const { return skipped_; }

  // loss.backward() with d loss / d loss = scale: every gradient comes out multiplied by scale.
  void backward(const autograd::Var<T>& loss) {
    constexpr std::string_view op = "optim::GradScaler::backward";
    CUTRAIN_REQUIRE(loss.defined() && loss.numel() == 1, InvalidArgument, op, "loss must be a one-element Var, got ",
                    loss.defined() ? loss.value().describe() : std::string("an undefined Var"));
    require_eager(op, loss.device());
    loss.backward(Tensor<T>::full(loss.shape(), static_cast<T>(scale_), {.device = loss.device()}));
    unscaled_ = false;
  }

  // Divides the gradients of opt's parameters by the scale (once per step) and returns whether
  // any is inf or NaN. Call it before clipping; step() calls it when it has not been called.
  template <class Opt>
  bool unscale(Opt& opt) {
    constexpr std::string_view op = "optim::GradScaler::unscale";
    if (unscaled_) return found_inf_;
    const double inv = 1.0 / scale_;
    bool found = false;
    Tensor<std::int32_t> flag;  // set by the GPU gradients' kernels when one holds an inf or NaN
    for (const auto& p : opt.params()) {
      Tensor<T>& g = p.grad();
      if (!g.defined()) continue;
      require_eager(op, g.device());
      if (g.device().is_cpu()) {
        g = ops::scale(g, inv);
        for (const T v : g.to_vector()) found = found || !std::isfinite(static_cast<double>(v));
        continue;
      }
#ifdef CUTRAIN_WITH_CUDA
      if constexpr (cuda::GpuFloat<T>) {
        if (!flag.defined()) flag = Tensor<std::int32_t>::zeros(Shape{1}, {.device = g.device()});
        CUTRAIN_REQUIRE(flag.device() == g.device(), DeviceError, op, "gradients on ", flag.device(), " and ",
                        g.device());
        if (!g.is_contiguous()) g = g.contiguous(g.layout());
        cuda::kernels::unscale_check(g, inv, flag.data());
      } else {
        throw NotImplemented(op, cutrain::detail::cat("GPU gradients must be f32, bf16 or f16, got ", g.describe()));
      }
#endif
    }
    if (flag.defined()) found = found || flag.to_vector()[0] != 0;  // the one read of the device per step
    found_inf_ = found;
    unscaled_ = true;
    return found;
  }

  // Unscales (unless unscale() ran), then runs opt.step() when every gradient is finite and skips
  // it otherwise, and updates the scale. Returns whether opt stepped.
  template <class Opt>
  bool step(Opt& opt) {
    const bool skip = unscale(opt);
    if (skip) {
      scale_ *= opts_.backoff_factor;
      clean_steps_ = 0;
      ++skipped_;
    } else {
      opt.step();
      if (++clean_steps_ == opts_.growth_interval) {
        const double grown = scale_ * opts_.growth_factor;
        if (std::isfinite(grown)) scale_ = grown;
        clean_steps_ = 0;
      }
    }
    unscaled_ = false;
    return !skip;
  }

  // The scale, the clean-step count and the skipped-step count under prefix.
  void save_state(Checkpoint& ckpt, const std::string& prefix) const {
    ckpt.put_string(Checkpoint::key(prefix, "type"), "optim::GradScaler");
    ckpt.put_double(Checkpoint::key(prefix, "scale"), scale_);
    ckpt.put_int(Checkpoint::key(prefix, "clean_steps"), clean_steps_);
    ckpt.put_int(Checkpoint::key(prefix, "skipped_steps"), skipped_);
  }
  // Restores what save_state wrote; checks everything first and changes nothing on error.
  void load_state(const Checkpoint& ckpt, const std::string& prefix) {
    constexpr std::string_view op = "optim::GradScaler::load_state";
    const std::string type_key = Checkpoint::key(prefix, "type");
    CUTRAIN_REQUIRE(ckpt.contains(type_key), InvalidArgument, op, "the checkpoint has no GradScaler state under \"",
                    prefix, "\"");
    const std::string type = ckpt.get_string(type_key);
    CUTRAIN_REQUIRE(type == "optim::GradScaler", InvalidArgument, op, "\"", prefix, "\" holds ", type,
                    " state, not optim::GradScaler");
    const double scale = ckpt.get_double(Checkpoint::key(prefix, "scale"));
    const std::int64_t clean = ckpt.get_int(Checkpoint::key(prefix, "clean_steps"));
    const std::int64_t skipped = ckpt.get_int(Checkpoint::key(prefix, "skipped_steps"));
    CUTRAIN_REQUIRE(std::isfinite(scale) && scale > 0 && clean >= 0 && clean < opts_.growth_interval && skipped >= 0,
                    InvalidArgument, op, "saved scale ", scale, ", clean steps ", clean, ", skipped steps ", skipped,
                    " are not a state of a scaler with growth_interval ", opts_.growth_interval);
    scale_ = scale;
    clean_steps_ = clean;
    skipped_ = skipped;
    unscaled_ = false;
  }

 private:
  static void require_eager(std::string_view op, Device dev) {
    if (!dev.is_cpu())
      CUTRAIN_REQUIRE(!cutrain::detail::device_capturing(), InvalidArgument, op,
                      "a loss-scaled step reads an overflow flag on the host and cannot be captured in a CUDA graph "
                      "(train in bf16, which needs no scaling, to use CUDA graphs)");
  }

  GradScalerOptions opts_;
  double scale_;
  std::int64_t clean_steps_ = 0;
  std::int64_t skipped_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
};

}  // namespace cutrain::inline CUTRAIN_ABI::optim
