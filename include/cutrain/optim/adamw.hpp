// optim::AdamW: Adam with decoupled weight decay, PyTorch's rule. Per parameter, step t from 1:
//   w *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   w -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cutrain/core/checkpoint.hpp"
#include "cutrain/optim/optimizer.hpp"

namespace cutrain::inline CUTRAIN_ABI::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  // GPU: the parameters' updates in one launch per 40 tensors (PyTorch's foreach); false, one
  // launch per parameter. The results are the same.
  bool foreach = true;
};

// Parameters that share a weight decay (PyTorch's parameter groups, as far as AdamW's weight
// decay goes): transformers decay their matrices and not their embeddings, biases and norms.
template <class T>
struct ParamGroup {
  std::vector<autograd::Var<T>> params;
  double weight_decay = 0;
};

template <class T>
class AdamW : public Optimizer<T> {
 public:
  AdamW(std::vector<autograd::Var<T>> params, const AdamWOptions& o = {})
      : Optimizer<T>("optim::AdamW", std::move(params), o.lr), opts_(o), state_(this->params_.size()),
        weight_decay_(this->params_.size(), o.weight_decay) {
    check_options(o);
  }
  // Parameter groups with their own weight decay (o.weight_decay is not used); the parameters
  // are numbered group after group (step_count(k), checkpoints).
  AdamW(const std::vector<ParamGroup<T>>& groups, const AdamWOptions& o)
      : Optimizer<T>("optim::AdamW", flatten(groups), o.lr), opts_(o), state_(this->params_.size()) {
    check_options(o);
    for (const auto& g : groups) {
      CUTRAIN_REQUIRE(g.weight_decay >= 0 && std::isfinite(g.weight_decay), InvalidArgument, "optim::AdamW",
                      "a group's weight_decay must be finite and >= 0, got ", g.weight_decay);
      weight_decay_.insert(weight_decay_.end(), g.params.size(), g.weight_decay);
    }
  }

  // Under CUDA graph capture the update is recorded, not run: each replay counts the step and
  // reads the learning rate set by then (set_lr), through the graph's hook.
  void step() {
    constexpr std::string_view op = "optim::AdamW::step";
    const profile::OpScope timed(op, this->params_.empty() ? Device::cpu() : this->params_.front().value().device());
    std::vector<std::size_t> captured;
    typename Optimizer<T>::CaptureCheck capturing_on;
#ifdef CUTRAIN_WITH_CUDA
    std::vector<cuda::kernels::AdamWItem<float>> many;  // foreach: launched after the loop
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
      State& s = state_[k];
      if (capturing_on(*w)) this->require_state(op, s.m.defined());
      if (!s.m.defined()) {
        s.m = this->zeros_like(*w);
        s.v = this->zeros_like(*w);
      }
      if (!w->device().is_cpu()) {
#ifdef CUTRAIN_WITH_CUDA
        if constexpr (std::same_as<T, float>) {
          const bool capture = capturing_on(*w);
          const float* hyper = capture ? this->hyper(k, w->device()) : nullptr;
          if (capture) captured.push_back(k);
          else ++s.step;
          const std::int64_t t = std::max<std::int64_t>(s.step, 1);
          if (opts_.foreach) {
            many.push_back({.w = w, .grad = std::move(g), .m = &s.m, .v = &s.v, .step = t,
                            .weight_decay = weight_decay_[k], .hyper = hyper, .copy = copy});
            many_k.push_back(k);
            continue;
          }
          cuda::kernels::adamw_step(*w, g, s.m, s.v, kernel_params(weight_decay_[k], t), hyper);
          continue;
        }
#endif
        this->no_gpu_path(op, *w);
      }
      const std::int64_t t = ++s.step;
      const double lr = this->lr_, b1 = opts_.beta1, b2 = opts_.beta2;
      const double step_size = lr / (1.0 - std::pow(b1, static_cast<double>(t)));
      const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(t)));
      const double decay = 1.0 - lr * weight_decay_[k];
      T* wd = w->data();
      const T* gd = g.data();
      T* m = s.m.data();
      T* v = s.v.data();
      for (std::int64_t i = 0, n = w->numel(); i < n; ++i) {
        const double gi = static_cast<double>(gd[i]);
        const double mi = b1 * static_cast<double>(m[i]) + (1.0 - b1) * gi;
        const double vi = b2 * static_cast<double>(v[i]) + (1.0 - b2) * gi * gi;
        m[i] = static_cast<T>(mi);
        v[i] = static_cast<T>(vi);
        const double wi = static_cast<double>(wd[i]) * decay;
        wd[i] = static_cast<T>(wi - step_size * mi / (std::sqrt(vi) / bc2_sqrt + opts_.eps));
      }
    }
#ifdef CUTRAIN_WITH_CUDA
    if (!many.empty()) {
      cuda::kernels::adamw_step(std::span<const cuda::kernels::AdamWItem<float>>(many), kernel_params(0.0, 1));
      for (std::size_t i = 0; i < many.size(); ++i) this->copy_rewritten(this->params_[many_k[i]], many[i].copy);
    }
#endif
    if (!captured.empty())
      this->on_replay(op, [this, captured] {
        for (std::size_t k : captured) {
          const double t = static_cast<double>(++state_[k].step);
          float* h = this->hyper_host_.data() + k * this->hyper_width;
          h[0] = static_cast<float>(this->lr_);
          h[1] = static_cast<float>(this->lr_ / (1.0 - std::pow(opts_.beta1, t)));
          h[2] = static_cast<float>(std::sqrt(1.0 - std::pow(opts_.beta2, t)));
        }
      });
  }
  const AdamWOptions& options() const { return opts_; }
  double weight_decay(std::size_t k) const { return weight_decay_.at(k); }
  std::int64_t step_count(std::size_t k) const { return state_.at(k).step; }
  const Tensor<T>& exp_avg(std::size_t k) const { return state_.at(k).m; }
  const Tensor<T>& exp_avg_sq(std::size_t k) const { return state_.at(k).v; }

  // Writes the learning rate and, per parameter, its shape, step count and (once it has taken a
  // step) exp_avg and exp_avg_sq under prefix (prefix.lr, prefix.<k>.step, ...). The options
  // are not saved: they belong to the code that builds the optimizer.
  void save_state(Checkpoint& ckpt, const std::string& prefix) const {
    const auto keys = this->save_common(ckpt, prefix, "optim::AdamW");
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const State& s = state_[k];
      ckpt.put_int(keys[k] + ".step", s.step);
      // erase: a checkpoint object reused across saves must not keep older moments.
      if (s.m.defined()) {
        ckpt.put(keys[k] + ".exp_avg", s.m);
        ckpt.put(keys[k] + ".exp_avg_sq", s.v);
      } else {
        ckpt.erase(keys[k] + ".exp_avg");
        ckpt.erase(keys[k] + ".exp_avg_sq");
      }
    }
  }

  // Restores what save_state wrote onto the parameters' devices and layouts. Checks the type,
  // the parameter count, every shape, dtype and step count first: on any mismatch it throws and
  // the optimizer is unchanged.
  void load_state(const Checkpoint& ckpt, const std::string& prefix) {
    constexpr std::string_view op = "optim::AdamW::load_state";
    const auto [lr, keys] = this->load_common(ckpt, prefix, "optim::AdamW", op);
    std::vector<State> staged(keys.size());
    for (std::size_t k = 0; k < keys.size(); ++k) {
      const std::string& p = keys[k];
      State& s = staged[k];
      s.step = ckpt.get_int(p + ".step");
      // step() creates both moments on a parameter's first step: a step count without them (or
      // moments without a step) is not a state this optimizer can be in.
      const bool has_m = ckpt.contains(p + ".exp_avg"), has_v = ckpt.contains(p + ".exp_avg_sq");
      CUTRAIN_REQUIRE(s.step >= 0 && has_m == has_v && has_m == (s.step > 0), InvalidArgument, op, "parameter ", k,
                      " has step count ", s.step, (has_m ? " with" : " without"), " exp_avg and",
                      (has_v ? " with" : " without"), " exp_avg_sq");
      if (has_m) {
        s.m = ckpt.get_like(p + ".exp_avg", this->params_[k].value());
        s.v = ckpt.get_like(p + ".exp_avg_sq", this->params_[k].value());
      }
    }
    // Nothing below throws.
    state_.swap(staged);
    this->lr_ = lr;
  }

 private:
  struct State {
    Tensor<T> m, v;
    std::int64_t step = 0;
  };
  static void check_options(const AdamWOptions& o) {
    CUTRAIN_REQUIRE(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, InvalidArgument, "optim::AdamW",
                    "beta1 and beta2 must be in [0, 1), got ", o.beta1, " and ", o.beta2);
    CUTRAIN_REQUIRE(o.eps >= 0 && o.weight_decay >= 0 && std::isfinite(o.eps) && std::isfinite(o.weight_decay),
                    InvalidArgument, "optim::AdamW", "eps and weight_decay must be finite and >= 0, got eps ", o.eps,
                    ", weight_decay ", o.weight_decay);
  }
  static std::vector<autograd::Var<T>> flatten(const std::vector<ParamGroup<T>>& groups) {
    std::vector<autograd::Var<T>> all;
    for (const auto& g : groups) all.insert(all.end(), g.params.begin(), g.params.end());
    return all;
  }
#ifdef CUTRAIN_WITH_CUDA
  cuda::kernels::AdamWParams kernel_params(double weight_decay, std::int64_t step) const {
    return {.lr = this->lr_, .beta1 = opts_.beta1, .beta2 = opts_.beta2, .eps = opts_.eps,
            .weight_decay = weight_decay, .step = step};
  }
#endif
  AdamWOptions opts_;
  std::vector<State> state_;
  std::vector<double> weight_decay_;  // per parameter
};

}  // namespace cutrain::inline CUTRAIN_ABI::optim
