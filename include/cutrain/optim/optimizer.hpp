// What SGD and AdamW share: the parameter handles, the learning rate and zero_grad().
// Updates run in place on the parameters' tensors: plain loops on the host for cpu tensors,
// the fused kernels of cuda/kernels/optim.hpp for cuda ones (f32 parameters).
#pragma once

#include <cmath>
#include <concepts>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/var.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/optim.hpp"
#endif

namespace cutrain::optim {

template <class T>
class Optimizer {
 public:
  Optimizer(std::string_view name, std::vector<autograd::Var<T>> params, double lr) : params_(std::move(params)), lr_(lr) {
    for (std::size_t i = 0; i < params_.size(); ++i)
      CUTRAIN_REQUIRE(params_[i].defined() && params_[i].requires_grad() && params_[i].is_leaf(), InvalidArgument,
                      name, "parameter ", i, " must be a defined leaf Var that requires grad");
    CUTRAIN_REQUIRE(lr >= 0 && std::isfinite(lr), InvalidArgument, name, "lr must be finite and >= 0, got ", lr);
  }

  // Drops every gradient (the next backward() writes fresh ones instead of adding).
  void zero_grad() {
    for (auto& p : params_) p.zero_grad();
  }
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  const std::vector<autograd::Var<T>>& params() const { return params_; }

 protected:
  // The parameter's tensor, checked to be contiguous, and its gradient in the same layout.
  static std::pair<Tensor<T>*, Tensor<T>> prepare(std::string_view op, autograd::Var<T>& p) {
    Tensor<T>& w = p.value();
    CUTRAIN_REQUIRE(w.is_contiguous(), InvalidArgument, op, "parameter ", w.describe(), " must be contiguous");
    const Tensor<T>& g = p.grad();
    CUTRAIN_REQUIRE(g.shape() == w.shape() && g.device() == w.device(), InvalidArgument, op, "gradient ",
                    g.describe(), " does not match its parameter ", w.describe());
    return {&w, g.device().is_cpu() ? g.contiguous(w.layout()) : g.view()};
  }
  static Tensor<T> zeros_like(const Tensor<T>& w) {
    return Tensor<T>::zeros(w.shape(), {.layout = w.layout(), .device = w.device()});
  }
  [[noreturn]] static void no_gpu_path(std::string_view op, const Tensor<T>& w) {
    throw NotImplemented(op, cutrain::detail::cat("parameters on the GPU must be f32, got ", w.describe()));
  }

  std::vector<autograd::Var<T>> params_;
  double lr_;
};

}  // namespace cutrain::optim

#include "cutrain/optim/adamw.hpp"
#include "cutrain/optim/sgd.hpp"
