// nn::RMSNorm (torch.nn.RMSNorm): scales x by the inverse root mean square over its trailing dims
// `shape` ({C} for tokens [B, T, C]) and by a learned weight of that shape; no bias.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <vector>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

struct RMSNormOptions {
  std::vector<std::int64_t> shape;  // the trailing normalized dims of x, e.g. {C}
  double eps = 1e-5;                // torch's default (eps=None) is the dtype's machine epsilon
};

template <class T>
class RMSNorm : public Module<RMSNorm<T>, T> {
 public:
  explicit RMSNorm(const RMSNormOptions& o) : opts_(o) {
    CUTRAIN_REQUIRE(!o.shape.empty(), InvalidArgument, "nn::RMSNorm", "shape must name at least one dim");
    const Shape s(o.shape);
    for (auto d : s)
      CUTRAIN_REQUIRE(d > 0, InvalidArgument, "nn::RMSNorm", "shape ", s, " must have positive dims");
    cutrain::detail::norm_check_eps("nn::RMSNorm", o.eps);
    check_shape_valid("nn::RMSNorm", s, sizeof(T));
    weight = autograd::parameter(Tensor<T>::full(s, T(1)));
  }
  // x in T, or (mixed precision, on the GPU) bf16/f16 under f32 parameters, which stay f32.
  template <RunsIn<T> X>
  Var<X> operator()(const Var<X>& x) const {
    return autograd::rms_norm(x, weight, opts_.eps);
  }
  const RMSNormOptions& options() const { return opts_; }
  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) { f(join_name(prefix, "weight"), weight); }
  Var<T> weight;

 private:
  RMSNormOptions opts_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
