// nn::Linear: y = x w^T + b, w [out, in].
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/nn/init.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

struct LinearOptions {
  std::int64_t in = 0, out = 0;
  bool bias = true;
  Init init = Init::kaiming_uniform;
  std::uint64_t seed = 0;
};

template <class T>
class Linear : public Module<Linear<T>, T> {
 public:
  explicit Linear(const LinearOptions& o) : Linear(o, nullptr) {}
  Linear(const LinearOptions& o, Rng& rng) : Linear(o, &rng) {}

  template <RunsIn<T> X>
  Var<X> operator()(const Var<X>& x) const {
    return autograd::linear(x, autograd::cast<X>(weight), autograd::cast<X>(bias));
  }
  // x w^T + b + r as one op (the residual read by the matmul on the GPU): r [N, out].
  template <RunsIn<T> X>
  Var<X> forward_residual(const Var<X>& x, const Var<X>& r) const {
    return autograd::linear_residual(x, autograd::cast<X>(weight), autograd::cast<X>(bias), r);
  }
  // act(x w^T + b) as one op; what Sequential calls for Linear followed by ReLU.
  template <RunsIn<T> X>
  Var<X> forward_fused(const Var<X>& x, const ActivationParams& act) const {
    return autograd::linear_activation(x, autograd::cast<X>(weight), autograd::cast<X>(bias), act);
  }

  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) {
    f(join_name(prefix, "weight"), weight);
    if (bias.defined()) f(join_name(prefix, "bias"), bias);
  }
  const LinearOptions& options() const { return opts_; }

  Var<T> weight, bias;

 private:
  Linear(const LinearOptions& o, Rng* rng) : opts_(o) {
    CUTRAIN_REQUIRE(o.in > 0 && o.out > 0, InvalidArgument, "nn::Linear", "need in and out > 0, got in ", o.in,
                    ", out ", o.out);
    CUTRAIN_REQUIRE(shape_fits(Shape{o.out, o.in}, sizeof(T)), InvalidArgument, "nn::Linear", "weight [out, in] = ",
                    Shape{o.out, o.in}, " is too large: its byte count overflows int64 (in ", o.in, ", out ", o.out, ")");
    Rng own = init::rng_for(o.seed, (static_cast<std::uint64_t>(o.in) * 7919 + static_cast<std::uint64_t>(o.out)) ^
                                        0x4c494e4552ull);
    Rng& r = rng ? *rng : own;
    weight = autograd::parameter(init::make<T>(Shape{o.out, o.in}, o.init, o.in, o.out, r));
    if (o.bias) bias = autograd::parameter(Tensor<T>::zeros(Shape{o.out}));
  }
  LinearOptions opts_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
