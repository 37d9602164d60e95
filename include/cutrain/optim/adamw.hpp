// optim::AdamW: Adam with decoupled weight decay, PyTorch's rule. Per parameter, step t from 1:
//   w *= 1 - lr * weight_decay
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   w -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "cutrain/optim/optimizer.hpp"

namespace cutrain::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

template <class T>
class AdamW : public Optimizer<T> {
 public:
  AdamW(std::vector<autograd::Var<T>> params, const AdamWOptions& o = {})
      : Optimizer<T>("optim::AdamW", std::move(params), o.lr), opts_(o), state_(this->params_.size()) {
    CUTRAIN_REQUIRE(o.beta1 >= 0 && o.beta1 < 1 && o.beta2 >= 0 && o.beta2 < 1, InvalidArgument, "optim::AdamW",
                    "beta1 and beta2 must be in [0, 1), got ", o.beta1, " and ", o.beta2);
    CUTRAIN_REQUIRE(o.eps >= 0 && o.weight_decay >= 0, InvalidArgument, "optim::AdamW",
                    "eps and weight_decay must be >= 0");
  }

  void step() {
    constexpr std::string_view op = "optim::AdamW::step";
    for (std::size_t k = 0; k < this->params_.size(); ++k) {
      auto& p = this->params_[k];
      if (!p.grad().defined()) continue;
      auto [w, g] = this->prepare(op, p);
      State& s = state_[k];
      if (!s.m.defined()) {
        s.m = this->zeros_like(*w);
        s.v = this->zeros_like(*w);
      }
      const std::int64_t t = ++s.step;
      if (!w->device().is_cpu()) {
#ifdef CUTRAIN_WITH_CUDA
        if constexpr (std::same_as<T, float>) {
          cuda::kernels::adamw_step(*w, g, s.m, s.v,
                                    {.lr = this->lr_, .beta1 = opts_.beta1, .beta2 = opts_.beta2, .eps = opts_.eps,
                                     .weight_decay = opts_.weight_decay, .step = t});
          continue;
        }
#endif
        this->no_gpu_path(op, *w);
      }
      const double lr = this->lr_, b1 = opts_.beta1, b2 = opts_.beta2;
      const double step_size = lr / (1.0 - std::pow(b1, static_cast<double>(t)));
      const double bc2_sqrt = std::sqrt(1.0 - std::pow(b2, static_cast<double>(t)));
      const double decay = 1.0 - lr * opts_.weight_decay;
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
  }
  const AdamWOptions& options() const { return opts_; }
  std::int64_t step_count(std::size_t k) const { return state_.at(k).step; }
  const Tensor<T>& exp_avg(std::size_t k) const { return state_.at(k).m; }
  const Tensor<T>& exp_avg_sq(std::size_t k) const { return state_.at(k).v; }

 private:
  struct State {
    Tensor<T> m, v;
    std::int64_t step = 0;
  };
  AdamWOptions opts_;
  std::vector<State> state_;
};

}  // namespace cutrain::optim
