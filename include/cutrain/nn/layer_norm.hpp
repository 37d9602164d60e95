// nn::LayerNorm: normalizes x over its trailing dims `shape` (torch's normalized_shape: {C} for
// tokens [B, T, C], {C, H, W} for [N, C, H, W]), with weight and bias of that shape.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <vector>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

struct LayerNormOptions {
  std::vector<std::int64_t> shape;  // the trailing normalized dims of x, e.g. {C} or {C, H, W}
  double eps = 1e-5;
};

template <class T>
class LayerNorm : public Module<LayerNorm<T>, T> {
 public:
  explicit LayerNorm(const LayerNormOptions& o) : opts_(o) {
    CUTRAIN_REQUIRE(!o.shape.empty(), InvalidArgument, "nn::LayerNorm", "shape must name at least one dim");
    const Shape s(o.shape);
    for (auto d : s)
      CUTRAIN_REQUIRE(d > 0, InvalidArgument, "nn::LayerNorm", "shape ", s, " must have positive dims");
    check_shape_valid("nn::LayerNorm", s, sizeof(T));
    weight = autograd::parameter(Tensor<T>::full(s, T(1)));
    bias = autograd::parameter(Tensor<T>::zeros(s));
  }
  // x in T, or (mixed precision, on the GPU) bf16/f16 under f32 parameters, which stay f32.
  template <RunsIn<T> X>
  Var<X> operator()(const Var<X>& x) const {
    return autograd::layer_norm(x, weight, bias, opts_.eps);
  }
  const LayerNormOptions& options() const { return opts_; }
  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) {
    f(join_name(prefix, "weight"), weight);
    f(join_name(prefix, "bias"), bias);
  }
  Var<T> weight, bias;

 private:
  LayerNormOptions opts_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
