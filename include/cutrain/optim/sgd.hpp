// optim::SGD with momentum, dampening, Nesterov and (coupled, L2) weight decay: PyTorch's rule.
//   g = grad + weight_decay * w
//   buf = g on the first step, else momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf        (when momentum != 0)
//   w -= lr * g
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cutrain/core/checkpoint.hpp"
#include "cutrain/optim/optimizer.hpp"

namespace cutrain::inline CUTRAIN_ABI::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  // GPU: the parameters' updates in one launch per 40 tensors (PyTorch's foreach); false, one
  // launch per parameter. The results are the same.
  bool foreach = true;
};

template <class T>
class SGD : public Optimizer<T> {
 public:
  SGD(std::vector<autograd::Var<T>> params, const SGDOptions& o = {})
      : Optimizer<T>("optim::SGD", std::move(params), o.lr), opts_(o), buffers_(this->params_.size()) {
    CUTRAIN_REQUIRE(o.momentum >= 0 && o.dampening >= 0 && o.weight_decay >= 0, InvalidArgument, "optim::SGD",
                    "momentum, dampening and weight_decay must be >= 0, got momentum ", o.momentum, ", dampening ",
                    o.dampening, ", weight_decay ", o.weight_decay);
    CUTRAIN_REQUIRE(!o.nesterov || (o.momentum > 0 && o.dampening == 0), InvalidArgument, "optim::SGD",
                    "nesterov needs momentum > 0 and dampening == 0");
  }

  // One update of every parameter that has a gradient.
  // Under CUDA graph capture the update is recorded, not run: each replay reads the learning
  // rate set by then (set_lr), through the graph's hook.
  void step() {
    constexpr std::string_view op = "optim::SGD::step";
    const profile::OpScope timed(op, this->params_.empty() ? Device::cpu() : this->params_.front().value().device());
    std::vector<std::size_t> captured;
    typename Optimizer<T>::CaptureCheck capturing_on;
#ifdef CUTRAIN_WITH_CUDA
    std::vector<cuda::kernels::SgdItem<float>> many;  // foreach: launched after the loop
    std::vector<std::size_t> many_k;
#endif
    for (std::size_t k = 0; k < this->params_.size(); ++k) {
      auto& p = this->params_[k];
      if (!p.grad().defined()) continue;
      auto [w, g] = this->prepare(op, p);
#ifdef CUTRAIN_WITH_CUDA
      // The parameter's 16-bit cast, written by the many-tensor step (asked before the version changes).
      [[maybe_unused]] const auto copy =
          opts_.foreach && !w->device().is_cpu() ? this->current_copy(p) : cuda::kernels::WeightCopy{};
#endif
      w->bump_version();  // an in-place write: autograd must not use a value saved before it
      const bool first = opts_.momentum != 0 && !buffers_[k].defined();
      if (first && capturing_on(*w)) this->require_state(op, false);
      if (first) buffers_[k] = this->zeros_like(*w);
      if (!w->device().is_cpu()) {
#ifdef CUTRAIN_WITH_CUDA
        if constexpr (std::same_as<T, float>) {
          const bool capture = capturing_on(*w);
          if (capture) captured.push_back(k);
          const float* hyper = capture ? this->hyper(k, w->device()) : nullptr;
          if (opts_.foreach) {
            many.push_back({.w = w, .grad = std::move(g), .momentum_buffer = opts_.momentum != 0 ? &buffers_[k] : nullptr,
                            .first_step = first, .hyper = hyper, .copy = copy});
            many_k.push_back(k);
            continue;
          }
          cuda::kernels::sgd_step(*w, g, buffers_[k], kernel_params(first), hyper);
          continue;
        }
#endif
        this->no_gpu_path(op, *w);
      }
      T* wd = w->data();
      const T* gd = g.data();
      T* buf = opts_.momentum != 0 ? buffers_[k].data() : nullptr;
      const double lr = this->lr_, mu = opts_.momentum, damp = opts_.dampening, wdk = opts_.weight_decay;
      for (std::int64_t i = 0, n = w->numel(); i < n; ++i) {
        double gi = static_cast<double>(gd[i]) + wdk * static_cast<double>(wd[i]);
        if (buf) {
          const double b = first ? gi : mu * static_cast<double>(buf[i]) + (1.0 - damp) * gi;
          buf[i] = static_cast<T>(b);
          gi = opts_.nesterov ? gi + mu * b : b;
        }
        wd[i] = static_cast<T>(static_cast<double>(wd[i]) - lr * gi);
      }
    }
#ifdef CUTRAIN_WITH_CUDA
    if (!many.empty()) {
      cuda::kernels::sgd_step(std::span<const cuda::kernels::SgdItem<float>>(many), kernel_params(false));
      for (std::size_t i = 0; i < many.size(); ++i) this->copy_rewritten(this->params_[many_k[i]], many[i].copy);
    }
#endif
    if (!captured.empty())
      this->on_replay(op, [this, captured] {
        for (std::size_t k : captured) {
          float* h = this->hyper_host_.data() + k * this->hyper_width;
          h[0] = static_cast<float>(this->lr_);
          h[1] = 0.0f;  // never the first momentum step: the buffers exist before capture
        }
      });
  }
  const SGDOptions& options() const { return opts_; }
  // The momentum buffer of parameter k (undefined before its first step or without momentum).
  const Tensor<T>& momentum_buffer(std::size_t k) const { return buffers_.at(k); }

  // Writes the learning rate, every parameter's shape and the momentum buffers under prefix
  // (prefix.lr, prefix.<k>.momentum_buffer, ...). A buffer not created yet (before the
  // parameter's first step, or without momentum) is left out, and on load stays undefined.
  // The options are not saved: they belong to the code that builds the optimizer.
  void save_state(Checkpoint& ckpt, const std::string& prefix) const {
    const auto keys = this->save_common(ckpt, prefix, "optim::SGD");
    for (std::size_t k = 0; k < keys.size(); ++k) {
      // erase: a checkpoint object reused across saves must not keep an older buffer.
      if (buffers_[k].defined()) ckpt.put(keys[k] + ".momentum_buffer", buffers_[k]);
      else ckpt.erase(keys[k] + ".momentum_buffer");
    }
  }

  // Restores what save_state wrote onto the parameters' devices and layouts. Checks the type,
  // the parameter count, every shape and dtype first: on any mismatch it throws and the
  // optimizer is unchanged.
  void load_state(const Checkpoint& ckpt, const std::string& prefix) {
    const auto [lr, keys] = this->load_common(ckpt, prefix, "optim::SGD", "optim::SGD::load_state");
    std::vector<Tensor<T>> staged(keys.size());
    for (std::size_t k = 0; k < keys.size(); ++k)
      if (ckpt.contains(keys[k] + ".momentum_buffer"))
        staged[k] = ckpt.get_like(keys[k] + ".momentum_buffer", this->params_[k].value());
    // Nothing below throws.
    buffers_.swap(staged);
    this->lr_ = lr;
  }

 private:
#ifdef CUTRAIN_WITH_CUDA
  cuda::kernels::SgdParams kernel_params(bool first) const {
    return {.lr = this->lr_, .momentum = opts_.momentum, .dampening = opts_.dampening,
            .weight_decay = opts_.weight_decay, .nesterov = opts_.nesterov, .first_step = first};
  }
#endif
  SGDOptions opts_;
  std::vector<Tensor<T>> buffers_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::optim
