// nn::MultiheadAttention: self-attention over tokens x [B, S, C] with one fused QKV projection
// (a Linear(C, 3C) whose output is viewed, without copies, as q, k and v in [B, S, H, D] memory,
// the layout cuDNN's SDPA takes without transposes), scaled dot-product attention (causal by
// option) and an output projection Linear(C, C). Weights normal(0, std); the output
// projection's normal(0, proj_std) (GPT-2 scales it by 1 / sqrt(2 · layers)); biases zero.
// dropout > 0 drops attention probabilities in training (a fresh seed per call, from (seed, call
// number), as nn::Dropout does; not inside a CUDA-graph capture); eval mode turns it off.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <string>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/nn/init.hpp"
#include "cutrain/nn/linear.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

struct MultiheadAttentionOptions {
  std::int64_t dim = 0, heads = 0;
  bool causal = true;
  bool bias = true;
  double std = 0.02, proj_std = 0.02;
  double dropout = 0;  // on the attention probabilities, in training
  std::uint64_t seed = 0;
};

namespace detail {
// A Linear(in, out) with weights normal(0, std) and zero biases.
template <class T>
Linear<T> normal_linear(std::int64_t in, std::int64_t out, bool bias, double std, std::uint64_t seed,
                        std::uint64_t salt) {
  Linear<T> l({.in = in, .out = out, .bias = bias});
  Rng rng = init::rng_for(seed, salt);
  l.weight.value() = Tensor<T>::randn(Shape{out, in}, rng, std);
  return l;
}
}  // namespace detail

template <class T>
class MultiheadAttention : public Module<MultiheadAttention<T>, T> {
 public:
  explicit MultiheadAttention(const MultiheadAttentionOptions& o)
      : opts_(checked(o)),
        qkv(detail::normal_linear<T>(o.dim, 3 * o.dim, o.bias, o.std, o.seed, 0x71b0)),
        proj(detail::normal_linear<T>(o.dim, o.dim, o.bias, o.proj_std, o.seed, 0x9e07)) {}

  // x [B, S, C] -> [B, S, C].
  template <RunsIn<T> X>
  Var<X> operator()(const Var<X>& x) const {
    const Var<X> y = attend(x);  // checks x
    return autograd::reshape(proj(y), x.value().shape());
  }
  // residual + attention(x), the residual [B, S, C] added by the output projection's matmul: a
  // pre-norm block's x + attn(ln(x)) with no pass of its own.
  template <RunsIn<T> X>
  Var<X> operator()(const Var<X>& x, const Var<X>& residual) const {
    const Var<X> y = attend(x);
    CUTRAIN_REQUIRE(residual.defined() && residual.value().shape() == x.value().shape(), InvalidArgument,
                    "nn::MultiheadAttention", "the residual must have x's shape ", x.value().describe(), ", got ",
                    residual.defined() ? residual.value().describe() : std::string("an undefined Var"));
    const Shape s = x.value().shape();
    return autograd::reshape(proj.forward_residual(y, autograd::reshape(residual, Shape{s[0] * s[1], s[2]})), s);
  }

  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) {
    qkv.visit_params(join_name(prefix, "qkv"), f);
    proj.visit_params(join_name(prefix, "proj"), f);
  }
  const MultiheadAttentionOptions& options() const { return opts_; }

 private:
  static const MultiheadAttentionOptions& checked(const MultiheadAttentionOptions& o) {
    CUTRAIN_REQUIRE(o.dim > 0 && o.heads > 0 && o.dim % o.heads == 0, InvalidArgument, "nn::MultiheadAttention",
                    "dim must be a positive multiple of heads, got dim ", o.dim, ", heads ", o.heads);
    CUTRAIN_REQUIRE(o.std > 0 && o.proj_std > 0, InvalidArgument, "nn::MultiheadAttention",
                    "std and proj_std must be positive, got ", o.std, " and ", o.proj_std);
    CUTRAIN_REQUIRE(o.dropout >= 0 && o.dropout < 1, InvalidArgument, "nn::MultiheadAttention",
                    "dropout must be in [0, 1), got ", o.dropout);
    return o;
  }
  // The heads' outputs [B·S, C] for x [B, S, C], before the output projection.
  template <RunsIn<T> X>
  Var<X> attend(const Var<X>& x) const {
    CUTRAIN_REQUIRE(x.defined() && x.value().rank() == 3 && x.value().dim(2) == opts_.dim, InvalidArgument,
                    "nn::MultiheadAttention", "x must be [B, S, ", opts_.dim, "], got ",
                    x.defined() ? x.value().describe() : std::string("an undefined Var"));
    const std::int64_t b = x.value().dim(0), s = x.value().dim(1), c = opts_.dim, h = opts_.heads;
    const Var<X> fused = autograd::reshape(qkv(autograd::reshape(x, Shape{b * s, c})), Shape{b, s, 3, h, c / h});
    AttentionParams p{.causal = opts_.causal};
    if (this->is_training() && opts_.dropout > 0) {
      p.dropout = opts_.dropout;
      p.seed = splitmix64(opts_.seed ^ splitmix64(calls_++));
    }
    // q, k, v are views of `fused`; its gradient is written whole (autograd::qkv_attention).
    const Var<X> o = autograd::qkv_attention(fused, p);
    // o is [B, S, H, D] in memory on the GPU: back to [B·S, C] without a copy there.
    return autograd::reshape(autograd::permute(o, {0, 2, 1, 3}), Shape{b * s, c});
  }
  MultiheadAttentionOptions opts_;
  mutable std::uint64_t calls_ = 0;  // dropout's seed per call

 public:
  Linear<T> qkv, proj;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
