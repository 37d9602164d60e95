// nn::TransformerBlock (pre-norm: h = x + attn(ln1(x)), then h + fc2(gelu_tanh(fc1(ln2(h))))) and
// nn::GPT: token and learned position embeddings, N blocks, a final layer norm and an output
// head tied to the token embedding (logits = x wteᵀ, no bias). GPT-2's initialization: weights
// normal(0, 0.02), the residual projections' normal(0, 0.02 / sqrt(2 N)), biases zero, norms
// one and zero. Modules take Var<X> in T or, under f32 parameters on the GPU, in bf16/f16.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/nn/attention.hpp"
#include "cutrain/nn/embedding.hpp"
#include "cutrain/nn/layer_norm.hpp"
#include "cutrain/nn/linear.hpp"
#include "cutrain/nn/module.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

struct TransformerBlockOptions {
  std::int64_t dim = 0, heads = 0;
  std::int64_t hidden = 0;  // the MLP's width; 0: 4 dim
  bool causal = true;
  double std = 0.02, proj_std = 0.02;  // the residual projections' (attention proj and fc2)
  double attn_dropout = 0;             // MultiheadAttention's dropout, in training
  std::uint64_t seed = 0;
};

template <class T>
class TransformerBlock : public Module<TransformerBlock<T>, T> {
 public:
  explicit TransformerBlock(const TransformerBlockOptions& o)
      : ln1({.shape = {checked(o).dim}}),
        attn({.dim = o.dim,
              .heads = o.heads,
              .causal = o.causal,
              .std = o.std,
              .proj_std = o.proj_std,
              .dropout = o.attn_dropout,
              .seed = o.seed}),
        ln2({.shape = {o.dim}}),
        fc1(detail::normal_linear<T>(o.dim, hidden_of(o), true, o.std, o.seed, 0xfc1)),
        fc2(detail::normal_linear<T>(hidden_of(o), o.dim, true, o.proj_std, o.seed, 0xfc2)) {}

  // x [B, S, C] -> [B, S, C].
  template <RunsIn<T> X>
  Var<X> operator()(const Var<X>& x) const {
    CUTRAIN_REQUIRE(x.defined() && x.value().rank() == 3 && x.value().dim(2) == ln1.weight.value().dim(0),
                    InvalidArgument, "nn::TransformerBlock", "x must be [B, S, C] with C = ", ln1.weight.value().dim(0),
                    ", got ", x.defined() ? x.value().describe() : std::string("an undefined Var"));
    const std::int64_t b = x.value().dim(0), s = x.value().dim(1), c = x.value().dim(2);
    // Both residual adds ride on a matmul (the attention's projection, fc2), and the MLP is one
    // op (autograd::gelu_mlp: the GELU in fc1's epilogue, its gradient in fc2's).
    const Var<X> h = attn(ln1(x), x);
    const Var<X> mlp = autograd::gelu_mlp(autograd::reshape(ln2(h), Shape{b * s, c}), autograd::cast<X>(fc1.weight),
                                          autograd::cast<X>(fc1.bias), autograd::cast<X>(fc2.weight),
                                          autograd::cast<X>(fc2.bias), autograd::reshape(h, Shape{b * s, c}));
    return autograd::reshape(mlp, Shape{b, s, c});
  }

  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) {
    ln1.visit_params(join_name(prefix, "ln1"), f);
    attn.visit_params(join_name(prefix, "attn"), f);
    ln2.visit_params(join_name(prefix, "ln2"), f);
    fc1.visit_params(join_name(prefix, "fc1"), f);
    fc2.visit_params(join_name(prefix, "fc2"), f);
  }
  void set_training(bool on) {
    Module<TransformerBlock<T>, T>::set_training(on);
    attn.set_training(on);
  }

  LayerNorm<T> ln1;
  MultiheadAttention<T> attn;
  LayerNorm<T> ln2;
  Linear<T> fc1, fc2;

 private:
  static std::int64_t hidden_of(const TransformerBlockOptions& o) { return o.hidden > 0 ? o.hidden : 4 * o.dim; }
  static const TransformerBlockOptions& checked(const TransformerBlockOptions& o) {
    CUTRAIN_REQUIRE(o.dim > 0 && o.heads > 0 && o.dim % o.heads == 0 && o.hidden >= 0, InvalidArgument,
                    "nn::TransformerBlock", "dim must be a positive multiple of heads and hidden >= 0 (0: 4 dim), got dim ",
                    o.dim, ", heads ", o.heads, ", hidden ", o.hidden);
    return o;
  }
};

struct GPTOptions {
  std::int64_t vocab = 0, context = 0, dim = 384, heads = 6, layers = 6;
  double attn_dropout = 0;  // in every block's attention, in training
  // Keep only each block's input for backward and run the block again there (autograd::
  // checkpoint): activation memory of one block instead of all, for a third more forward work.
  bool recompute = false;
  std::uint64_t seed = 0;
};

template <class T>
class GPT : public Module<GPT<T>, T> {
 public:
  explicit GPT(const GPTOptions& o)
      : opts_(checked(o)),
        wte({.num = o.vocab, .dim = o.dim, .seed = o.seed}),
        wpe({.num = o.context, .dim = o.dim, .seed = o.seed ^ 0x9e3779b97f4a7c15ull}),
        ln_f({.shape = {o.dim}}) {
    const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(o.layers));
    for (std::int64_t i = 0; i < o.layers; ++i)
      blocks.emplace_back(TransformerBlockOptions{.dim = o.dim,
                                                  .heads = o.heads,
                                                  .proj_std = proj_std,
                                                  .attn_dropout = o.attn_dropout,
                                                  .seed = o.seed + 1000 * static_cast<std::uint64_t>(i + 1)});
  }

  // tokens [B, S] (int32 or int64 in [0, vocab), S <= context, on the model's device) -> logits
  // [B·S, vocab] in X.
  template <RunsIn<T> X = T, ops::IndexInt I = std::int32_t>
  Var<X> operator()(const Tensor<I>& tokens) const {
    return autograd::linear(hidden<X>(tokens), autograd::cast<X>(wte.weight));
  }

  // The mean (or p's reduction) cross-entropy of the next-token logits against targets [B, S] (or
  // [B·S]; int32 or int64 in [0, vocab) or p.ignore_index) through the fused classifier
  // (autograd::linear_cross_entropy): the logits are never held whole, nor in f32. The loss is
  // f32 (f64 in an f64 model), whatever X.
  template <RunsIn<T> X = T, ops::IndexInt I = std::int32_t, ops::IndexInt J = I>
  Var<loss_float_t<X>> loss(const Tensor<I>& tokens, const Tensor<J>& targets,
                            const LinearCrossEntropyParams& p = {}) const {
    const Var<X> h = hidden<X>(tokens);
    CUTRAIN_REQUIRE(targets.defined() && targets.numel() == h.value().dim(0), InvalidArgument, "nn::GPT::loss",
                    "targets must hold one token per input token, ", tokens.describe(), ", got ",
                    targets.defined() ? targets.describe() : std::string("an undefined tensor"));
    const Tensor<J> flat = targets.contiguous().reshape({targets.numel()});
    if constexpr (std::same_as<X, T> || std::same_as<T, float>)
      return autograd::linear_cross_entropy(h, wte.weight, flat, p);
    else
      return autograd::linear_cross_entropy(h, autograd::cast<X>(wte.weight), flat, p);
  }

  // The final layer norm's output [B·S, dim] for tokens [B, S]: what the output head reads.
  template <RunsIn<T> X = T, ops::IndexInt I = std::int32_t>
  Var<X> hidden(const Tensor<I>& tokens) const {
    CUTRAIN_REQUIRE(tokens.defined() && tokens.rank() == 2 && tokens.dim(1) >= 1 && tokens.dim(1) <= opts_.context,
                    InvalidArgument, "nn::GPT", "tokens must be int32 or int64 [B, S] with 1 <= S <= context ", opts_.context,
                    ", got ", tokens.defined() ? tokens.describe() : std::string("an undefined tensor"));
    const std::int64_t b = tokens.dim(0), s = tokens.dim(1);
    Var<X> x = autograd::add(wte.template operator()<X>(tokens), wpe.template operator()<X>(positions(s, tokens.device())));
    for (const auto& block : blocks) {
      if (opts_.recompute) x = autograd::checkpoint<X>([&block](const Var<X>& v) { return block(v); }, x);
      else x = block(x);
    }
    return autograd::reshape(ln_f(x), Shape{b * s, opts_.dim});
  }

  void visit_params(const std::string& prefix, const ParamVisitor<T>& f) {
    wte.visit_params(join_name(prefix, "wte"), f);
    wpe.visit_params(join_name(prefix, "wpe"), f);
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i].visit_params(join_name(prefix, "h." + std::to_string(i)), f);
    ln_f.visit_params(join_name(prefix, "ln_f"), f);
  }
  void set_training(bool on) {
    Module<GPT<T>, T>::set_training(on);
    for (auto& b : blocks) b.set_training(on);
  }
  const GPTOptions& options() const { return opts_; }
  std::int64_t parameter_count() {
    std::int64_t n = 0;
    this->visit_params("", [&](const std::string&, Var<T>& v) { n += v.value().numel(); });
    return n;
  }

 private:
  // 0 .. s-1 on dev, kept between calls (a CUDA graph capture cannot copy them from the host).
  const Tensor<std::int32_t>& positions(std::int64_t s, Device dev) const {
    if (!positions_.defined() || positions_.numel() != s || positions_.device() != dev) {
      std::vector<std::int32_t> pos(static_cast<std::size_t>(s));
      for (std::int64_t i = 0; i < s; ++i) pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
      positions_ = Tensor<std::int32_t>::from_vector(pos, Shape{s}).to(dev);
    }
    return positions_;
  }
  static const GPTOptions& checked(const GPTOptions& o) {
    CUTRAIN_REQUIRE(o.vocab > 0 && o.context > 0 && o.layers > 0, InvalidArgument, "nn::GPT",
                    "vocab, context and layers must be positive, got vocab ", o.vocab, ", context ", o.context,
                    ", layers ", o.layers);
    CUTRAIN_REQUIRE(o.dim > 0 && o.heads > 0 && o.dim % o.heads == 0, InvalidArgument, "nn::GPT",
                    "dim must be a positive multiple of heads, got dim ", o.dim, ", heads ", o.heads);
    CUTRAIN_REQUIRE(!o.recompute || o.attn_dropout == 0, InvalidArgument, "nn::GPT",
                    "recompute needs attn_dropout 0 (a recomputed block must draw the same dropout mask), got ",
                    o.attn_dropout);
    return o;
  }
  GPTOptions opts_;
  mutable Tensor<std::int32_t> positions_;

 public:
  Embedding<T> wte, wpe;
  std::vector<TransformerBlock<T>> blocks;
  LayerNorm<T> ln_f;
};

}  // namespace cutrain::inline CUTRAIN_ABI::nn
