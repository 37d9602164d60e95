// nn::Conv2d: 2-d convolution with optional bias, weights [out, in/groups, k, k].
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/nn/init.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

struct Conv2dOptions {
  std::int64_t in = 0, out = 0;
  int kernel = 3, stride = 1, padding = 0, dilation = 1, groups = 1;
  // Padding 'same' (padding must be 0): the output is ceil(input / stride); with stride > 1 the
  // padding depends on the input's size, worked out per call (conv2d_same_padding(x, w, ...)),
  // the odd pixel after (SamePadding::upper, TensorFlow's and ONNX's SAME_UPPER) or before.
  bool same_padding = false;
  SamePadding same_mode = SamePadding::upper;
  bool bias = true;
  Init init = Init::kaiming_uniform;
  std::uint64_t seed = 0;
};

template <class T>
class Conv2d : public Module<Conv2d<T>, T> {
 public:
  explicit Conv2d(const Conv2dOptions& o) : Conv2d(o, nullptr) {}
  Conv2d(const Conv2dOptions& o, Rng& rng) : Conv2d(o, &rng) {}

  template <RunsIn<T> X>
  Var<X> operator()(const Var<X>& x) const {
    return autograd::conv2d(x, autograd::cast<X>(weight), autograd::cast<X>(bias), params_for(x.shape()));
  }
  // act(conv(x) + b) as one op; what Sequential calls for Conv2d followed by ReLU.
  template <RunsIn<T> X>
  Var<X> forward_fused(const Var<X>& x, const ActivationParams& act) const {
    return autograd::conv2d_bias_activation(x, autograd::cast<X>(weight), autograd::cast<X>(bias), act,
                                            params_for(x.shape()));
  }

  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) {
    f(join_name(prefix, "weight"), weight);
    if (bias.defined()) f(join_name(prefix, "bias"), bias);
  }
  const Conv2dOptions& options() const { return opts_; }
  // The convolution's parameters; for padding 'same' with a stride > 1 they depend on the input:
  // params_for(x's shape).
  const Conv2dParams& params() const {
    CUTRAIN_REQUIRE(!per_input(), InvalidArgument, "nn::Conv2d::params",
                    "padding 'same' with stride ", opts_.stride, " depends on the input's size: use params_for(x)");
    return params_;
  }
  Conv2dParams params_for(const Shape& x) const {
    if (!per_input()) return params_;
    return conv2d_same_padding(x, weight.shape(), params_, opts_.same_mode, "nn::Conv2d");
  }

  Var<T> weight, bias;  // bias undefined without .bias

 private:
  Conv2d(const Conv2dOptions& o, Rng* rng) : opts_(o), params_(make_params(o)) {
    CUTRAIN_REQUIRE(o.in > 0 && o.out > 0 && o.kernel > 0 && o.groups > 0 && o.in % o.groups == 0 &&
                        o.out % o.groups == 0,
                    InvalidArgument, "nn::Conv2d", "need in, out, kernel, groups > 0 with groups dividing in and out, got in ",
                    o.in, ", out ", o.out, ", kernel ", o.kernel, ", groups ", o.groups);
    const Shape w_shape{o.out, o.in / o.groups, o.kernel, o.kernel};
    CUTRAIN_REQUIRE(shape_fits(w_shape, sizeof(T)), InvalidArgument, "nn::Conv2d", "weight ", w_shape,
                    " is too large: its byte count overflows int64 (in ", o.in, ", out ", o.out, ", kernel ", o.kernel, ")");
    // Unsigned: the same seed as the signed formula wherever that did not overflow.
    Rng own = init::rng_for(o.seed, static_cast<std::uint64_t>(o.in) * 1000003 + static_cast<std::uint64_t>(o.out) * 1009 +
                                        static_cast<std::uint64_t>(o.kernel));
    Rng& r = rng ? *rng : own;
    const std::int64_t k2 = std::int64_t{o.kernel} * o.kernel;
    const Shape ws{o.out, o.in / o.groups, o.kernel, o.kernel};
    weight = autograd::parameter(init::make<T>(ws, o.init, o.in / o.groups * k2, o.out / o.groups * k2, r));
    if (o.bias) bias = autograd::parameter(Tensor<T>::zeros(Shape{o.out}));
  }
  bool per_input() const { return opts_.same_padding && (opts_.stride > 1 || opts_.same_mode == SamePadding::lower); }
  static Conv2dParams make_params(const Conv2dOptions& o) {
    const Conv2dParams p = Conv2dParams::make(o.stride, o.padding, o.dilation, o.groups);
    if (!o.same_padding) return p;
    CUTRAIN_REQUIRE(o.padding == 0, InvalidArgument, "nn::Conv2d",
                    "padding 'same' replaces the padding, which must be zero here, got ", p);
    return o.stride > 1 || o.same_mode == SamePadding::lower ? p : conv2d_same_padding(o.kernel, o.kernel, p, "nn::Conv2d");
  }
  Conv2dOptions opts_;
  Conv2dParams params_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
