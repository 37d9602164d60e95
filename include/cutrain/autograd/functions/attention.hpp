// Differentiable scaled dot-product attention on Var<T> (ops/attention.hpp). The node saves q,
// k, v, the output o and the log-sum-exp statistics: the backward rebuilds the softmax from them
// (flash-style), never the [Sq, Skv] probabilities.
#pragma once

#include "cutrain/core/abi.hpp"

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/attention.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

template <class T>
struct AttentionFn final : Node<T> {
  AttentionParams params;
  AttentionLengths lengths;
  Tensor<T> q, k, v, o;
  Tensor<AttentionStats<T>> stats;
  std::string_view name() const override { return "scaled_dot_product_attention"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dout) override {
    AttentionBackward<T> r = ops::scaled_dot_product_attention_backward(q, k, v, o, dout, stats, params, lengths);
    std::vector<Tensor<T>> g(3);
    if (this->needs_grad(0)) g[0] = std::move(r.dq);
    if (this->needs_grad(1)) g[1] = std::move(r.dk);
    if (this->needs_grad(2)) g[2] = std::move(r.dv);
    return g;
  }
  void release_saved() override { q = {}; k = {}; v = {}; o = {}; stats = {}; lengths = {}; }
};

// softmax(scale q kᵀ + mask) v: q [B, H, Sq, D], k [B, Hk, Skv, D], v [B, Hk, Skv, Dv] (see
// ops::scaled_dot_product_attention_forward for masks, lengths and layouts).
template <class T>
Var<T> scaled_dot_product_attention(const Var<T>& q, const Var<T>& k, const Var<T>& v, const AttentionParams& p = {},
                                    const AttentionLengths& lengths = {}) {
  detail::require_defined("autograd::scaled_dot_product_attention", {{q.defined(), "q"}, {k.defined(), "k"}, {v.defined(), "v"}});
  auto fn = std::make_shared<AttentionFn<T>>();
  AttentionForward<T, AttentionStats<T>> r =
      ops::scaled_dot_product_attention_forward(q.value(), k.value(), v.value(), p, lengths);
  fn->params = p;
  fn->lengths = lengths.view();
  fn->save(fn->q, q.value(), "q");
  fn->save(fn->k, k.value(), "k");
  fn->save(fn->v, v.value(), "v");
  fn->save(fn->o, r.o, "o");
  fn->stats = std::move(r.stats);
  return detail::finish<T>(std::move(r.o), fn, {&q, &k, &v});
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
