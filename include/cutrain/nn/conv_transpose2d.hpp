// nn::ConvTranspose2d: transposed 2-d convolution with optional bias, weights [in, out/groups, k, k]
// (PyTorch's layout), output (H - 1) * stride - 2 * padding + dilation * (k - 1) + output_padding + 1.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/nn/init.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

struct ConvTranspose2dOptions {
  std::int64_t in = 0, out = 0;
  int kernel = 3, stride = 1, padding = 0, output_padding = 0, dilation = 1, groups = 1;
  bool bias = true;
  Init init = Init::kaiming_uniform;
  std::uint64_t seed = 0;
};

template <class T>
class ConvTranspose2d : public Module<ConvTranspose2d<T>, T> {
 public:
  explicit ConvTranspose2d(const ConvTranspose2dOptions& o) : ConvTranspose2d(o, nullptr) {}
  ConvTranspose2d(const ConvTranspose2dOptions& o, Rng& rng) : ConvTranspose2d(o, &rng) {}

  template <RunsIn<T> X>
  Var<X> operator()(const Var<X>& x) const {
    return autograd::conv_transpose2d(x, autograd::cast<X>(weight), autograd::cast<X>(bias), params_);
  }

  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) {
    f(join_name(prefix, "weight"), weight);
    if (bias.defined()) f(join_name(prefix, "bias"), bias);
  }
  const ConvTranspose2dOptions& options() const { return opts_; }
  const ConvTranspose2dParams& params() const { return params_; }

  Var<T> weight, bias;  // bias undefined without .bias

 private:
  ConvTranspose2d(const ConvTranspose2dOptions& o, Rng* rng)
      : opts_(o), params_(ConvTranspose2dParams::make(o.stride, o.padding, o.output_padding, o.dilation, o.groups)) {
    constexpr std::string_view op = "nn::ConvTranspose2d";
    CUTRAIN_REQUIRE(o.in > 0 && o.out > 0 && o.kernel > 0 && o.groups > 0 && o.in % o.groups == 0 &&
                        o.out % o.groups == 0,
                    InvalidArgument, op, "need in, out, kernel, groups > 0 with groups dividing in and out, got in ", o.in,
                    ", out ", o.out, ", kernel ", o.kernel, ", groups ", o.groups);
    CUTRAIN_REQUIRE(o.stride > 0 && o.dilation > 0 && o.padding >= 0 && o.output_padding >= 0 &&
                        o.output_padding < o.stride,
                    InvalidArgument, op, "need stride, dilation > 0, padding >= 0 and 0 <= output_padding < stride, got ",
                    params_);
    const Shape ws{o.in, o.out / o.groups, o.kernel, o.kernel};
    CUTRAIN_REQUIRE(shape_fits(ws, sizeof(T)), InvalidArgument, op, "weight ", ws,
                    " is too large: its byte count overflows int64 (in ", o.in, ", out ", o.out, ", kernel ", o.kernel, ")");
    Rng own = init::rng_for(o.seed, static_cast<std::uint64_t>(o.in) * 1000003 + static_cast<std::uint64_t>(o.out) * 1009 +
                                        static_cast<std::uint64_t>(o.kernel) + 7);
    Rng& r = rng ? *rng : own;
    // PyTorch's fans for this weight: dim 1 (out/groups) * k^2 in, dim 0 (in) * k^2 out.
    const std::int64_t k2 = std::int64_t{o.kernel} * o.kernel;
    weight = autograd::parameter(init::make<T>(ws, o.init, o.out / o.groups * k2, o.in * k2, r));
    if (o.bias) bias = autograd::parameter(Tensor<T>::zeros(Shape{o.out}));
  }
  ConvTranspose2dOptions opts_;
  ConvTranspose2dParams params_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
