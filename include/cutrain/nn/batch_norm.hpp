// nn::BatchNorm2d: per-channel batch normalization of [N,C,H,W] (or [N,C]); weight (gamma),
// bias (beta), running_mean and running_var in T (the CPU ops want them in x's dtype). Under
// mixed precision, an f32 BatchNorm2d takes a bf16 or f16 x on the GPU and keeps its
// parameters and statistics in f32 (cuDNN computes in f32 from them).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

struct BatchNormOptions {
  std::int64_t features = 0;
  double eps = 1e-5;
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch
};

template <class T>
class BatchNorm2d : public Module<BatchNorm2d<T>, T> {
 public:
  explicit BatchNorm2d(const BatchNormOptions& o)
      : opts_(checked(o)),
        running_mean(Tensor<T>::zeros(Shape{o.features})),
        running_var(Tensor<T>::full(Shape{o.features}, T(1))) {
    weight = autograd::parameter(Tensor<T>::full(Shape{o.features}, T(1)));
    bias = autograd::parameter(Tensor<T>::zeros(Shape{o.features}));
  }

  template <RunsIn<T> X>
  Var<X> operator()(const Var<X>& x) {
    return autograd::batch_norm(x, weight, bias, running_mean, running_var, this->is_training(),
                                {.momentum = opts_.momentum, .eps = opts_.eps});
  }
  // act(bn(x) + residual) as one op (autograd::batch_norm_act), act relu or identity, the residual
  // optional: nn::Sequential runs a BatchNorm2d followed by a ReLU so, nn::ResidualBlock its tail.
  template <RunsIn<T> X>
  Var<X> forward_fused(const Var<X>& x, const ActivationParams& act, const Var<X>& residual = {}) {
    return autograd::batch_norm_act(x, weight, bias, running_mean, running_var, this->is_training(),
                                    {.momentum = opts_.momentum, .eps = opts_.eps}, act, residual);
  }

  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) {
    f(join_name(prefix, "weight"), weight);
    f(join_name(prefix, "bias"), bias);
  }
  void visit_buffers(const std::string& prefix, const BufferVisitor<T>& f) {
    f(join_name(prefix, "running_mean"), running_mean);
    f(join_name(prefix, "running_var"), running_var);
  }
  const BatchNormOptions& options() const { return opts_; }

 private:
  // Before any member is made from the options: an error names the module, not a Tensor.
  static const BatchNormOptions& checked(const BatchNormOptions& o) {
    CUTRAIN_REQUIRE(o.features > 0, InvalidArgument, "nn::BatchNorm2d", "features must be > 0, got ", o.features);
    return o;
  }
  BatchNormOptions opts_;

 public:
  Var<T> weight, bias;
  Tensor<T> running_mean, running_var;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
