// optim::EMA: an exponential moving average of a model's parameters and floating-point buffers
// (batch-norm running statistics), the weights timm's ModelEma and torch.optim.swa_utils keep:
//   shadow = decay * shadow + (1 - decay) * current        after every optimizer step
// with warm-up (optional, as timm's): decay_t = min(decay, (1 + t) / (10 + t)) for update t from 0.
//
//   optim::EMA<float> ema(net, {.decay = 0.99});   // after net.to(dev), as an optimizer
//   ... opt.step(); ema.update();
//   { const optim::EMA<float>::Swapped s(ema); evaluate(net); }   // the averages in the model
//
// update() runs in place: host loops for cpu tensors, one launch per 40 tensors on the GPU (f32).
// Under CUDA graph capture it is recorded with a fixed decay, so warm-up cannot be captured.
// swap() exchanges the averages with the model's values (twice restores them); while swapped,
// training steps would train the averages: swap back first.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/autograd/var.hpp"
#include "cutrain/core/profile.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/optim.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::optim {

struct EMAOptions {
  double decay = 0.999;
  bool warmup = false;  // decay_t = min(decay, (1 + t) / (10 + t))
};

template <class T>
class EMA {
 public:
  // Tracks model's parameters and buffers as they are now: build it after model.to(dev).
  template <class M>
  explicit EMA(M& model, const EMAOptions& o = {}) : opts_(o) {
    CUTRAIN_REQUIRE(o.decay >= 0 && o.decay < 1, InvalidArgument, "optim::EMA", "decay must be in [0, 1), got ",
                    o.decay);
    model.visit_params("", [&](const std::string& name, autograd::Var<T>& p) { add(name, p.value()); });
    model.visit_buffers("", [&](const std::string& name, Tensor<T>& b) { add(name, b); });
    CUTRAIN_REQUIRE(!tracked_.empty(), InvalidArgument, "optim::EMA", "the model has no parameters or buffers");
  }

  // shadow = d * shadow + (1 - d) * current for every tracked tensor (d: this update's decay).
  void update() {
    constexpr std::string_view op = "optim::EMA::update";
    const profile::OpScope timed(op, tracked_.front().current.device());
    CUTRAIN_REQUIRE(!swapped_, InvalidArgument, op, "the averages are swapped into the model: swap() back first");
    const double d = decay_at(updates_);
    // Asked once per update, not per tensor (the tracked tensors share one device).
    CUTRAIN_REQUIRE(!opts_.warmup || tracked_.front().current.device().is_cpu() || !cutrain::detail::device_capturing(),
                    InvalidArgument, op,
                    "a captured update would freeze the warm-up's decay: use warmup = false under capture");
#ifdef CUTRAIN_WITH_CUDA
    constexpr bool gpu_f32 = std::same_as<T, float>;
    if constexpr (gpu_f32) {  // the GPU tensors in one launch per 40
      std::vector<cuda::kernels::EmaItem> items;
      for (auto& t : tracked_)
        if (!t.current.device().is_cpu()) items.push_back({&t.shadow, &t.current});
      if (!items.empty()) {
        cuda::kernels::ema_update(items, d);
        for (auto& it : items) it.shadow->bump_version();
      }
    }
#else
    constexpr bool gpu_f32 = false;
#endif
    for (auto& t : tracked_) {
      if (!t.current.device().is_cpu()) {
        if (gpu_f32) continue;  // updated above
        throw NotImplemented(op, cutrain::detail::cat("tensors on the GPU must be f32, got ", t.name, " ",
                                                      t.current.describe()));
      }
      const Tensor<T> c = t.current.contiguous(t.shadow.layout());
      T* s = t.shadow.data();
      const T* w = c.data();
      for (std::int64_t i = 0, n = t.shadow.numel(); i < n; ++i)
        s[i] = static_cast<T>(static_cast<double>(s[i]) + (1.0 - d) * (static_cast<double>(w[i]) - static_cast<double>(s[i])));
      t.shadow.bump_version();
    }
    ++updates_;
  }

  // Exchanges the averages with the model's current values, in place (the model's tensors keep
  // their storage, so a captured CUDA graph stays valid). Call again to restore.
  void swap() {
    for (auto& t : tracked_) {
      Tensor<T> tmp = t.current.clone();
      t.current.copy_from(t.shadow);
      t.shadow.copy_from(tmp);
    }
    swapped_ = !swapped_;
  }
  // The averages in the model for a scope (evaluation, export), the training values after it.
  class Swapped {
   public:
    explicit Swapped(EMA& e) : e_(e) { e_.swap(); }
    ~Swapped() { e_.swap(); }
    Swapped(const Swapped&) = delete;
    Swapped& operator=(const Swapped&) = delete;

   private:
    EMA& e_;
  };

  // The decay update t applies (t counts from 0).
  double decay_at(std::int64_t t) const {
    if (!opts_.warmup) return opts_.decay;
    return std::min(opts_.decay, (1.0 + static_cast<double>(t)) / (10.0 + static_cast<double>(t)));
  }
  std::int64_t updates() const { return updates_; }
  bool swapped() const { return swapped_; }
  // The average kept for the tracked tensor named name (as in the model's state_dict).
  const Tensor<T>& average(const std::string& name) const {
    for (const auto& t : tracked_)
      if (t.name == name) return t.shadow;
    throw InvalidArgument("optim::EMA::average", "no tracked tensor is named \"" + name + "\"");
  }

 private:
  struct Tracked {
    std::string name;
    Tensor<T> current;  // a view of the model's tensor
    Tensor<T> shadow;   // its average, contiguous in the same layout
  };
  void add(const std::string& name, Tensor<T>& t) {
    CUTRAIN_REQUIRE(t.defined(), InvalidArgument, "optim::EMA", name, " is undefined");
    CUTRAIN_REQUIRE(t.is_contiguous(), InvalidArgument, "optim::EMA", name, " ", t.describe(), " must be contiguous");
    tracked_.push_back({name, t.view(), t.clone()});
  }

  EMAOptions opts_;
  std::vector<Tracked> tracked_;
  std::int64_t updates_ = 0;
  bool swapped_ = false;
};

}  // namespace cutrain::inline CUTRAIN_ABI::optim
