// Differentiable scaled dot-product attention on Var<T> (ops/attention.hpp). The node saves q,
// k, v, the output o and the log-sum-exp statistics: the backward rebuilds the softmax from them
// (flash-style), never the [Sq, Skv] probabilities. An additive bias is a fourth input (its
// gradient where it requires one: a learned relative-position bias); a boolean mask is not. qkv_attention takes a fused QKV projection's
// output whole, so that its backward writes one gradient buffer instead of three zero-filled
// slices summed.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/ops/attention.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

template <class T>
struct AttentionFn final : Node<T> {
  AttentionParams params;
  AttentionLengths lengths;
  AttentionMask<T> masks;
  DropoutMask mask = DropoutMask::none;
  Tensor<T> q, k, v, o;
  Tensor<AttentionStats<T>> stats;
  std::string_view name() const override { return "scaled_dot_product_attention"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dout) override {
    AttentionBackward<T> r = ops::scaled_dot_product_attention_backward(q, k, v, o, dout, stats, params, lengths, mask,
                                                                        masks, this->needs_grad(3));
    std::vector<Tensor<T>> g(4);
    if (this->needs_grad(0)) g[0] = std::move(r.dq);
    if (this->needs_grad(1)) g[1] = std::move(r.dk);
    if (this->needs_grad(2)) g[2] = std::move(r.dv);
    if (this->needs_grad(3)) g[3] = std::move(r.dbias);
    return g;
  }
  void release_saved() override { q = {}; k = {}; v = {}; o = {}; stats = {}; lengths = {}; masks = {}; }
};

// softmax(scale q kᵀ + bias + mask) v: q [B, H, Sq, D], k [B, Hk, Skv, D], v [B, Hk, Skv, Dv];
// bias [B or 1, H or 1, Sq, Skv] (optional) and allowed, the boolean mask of that shape (u8,
// optional; see ops::scaled_dot_product_attention_forward for masks, lengths and layouts).
template <class T>
Var<T> scaled_dot_product_attention(const Var<T>& q, const Var<T>& k, const Var<T>& v, const AttentionParams& p = {},
                                    const AttentionLengths& lengths = {}, const Var<T>& bias = {},
                                    const Tensor<std::uint8_t>& allowed = {}) {
  detail::require_defined("autograd::scaled_dot_product_attention", {{q.defined(), "q"}, {k.defined(), "k"}, {v.defined(), "v"}});
  auto fn = std::make_shared<AttentionFn<T>>();
  AttentionMask<T> masks{bias.defined() ? bias.value().view() : Tensor<T>{},
                         allowed.defined() ? allowed.view() : Tensor<std::uint8_t>{}};
  AttentionForward<T, AttentionStats<T>> r =
      ops::scaled_dot_product_attention_forward(q.value(), k.value(), v.value(), p, lengths, masks);
  fn->params = p;
  fn->mask = r.mask;
  fn->lengths = lengths.view();
  if (masks.bias.defined()) fn->save(fn->masks.bias, masks.bias, "bias");
  fn->masks.allowed = std::move(masks.allowed);
  fn->save(fn->q, q.value(), "q");
  fn->save(fn->k, k.value(), "k");
  fn->save(fn->v, v.value(), "v");
  fn->save(fn->o, r.o, "o");
  fn->stats = std::move(r.stats);
  return detail::finish<T>(std::move(r.o), fn, {&q, &k, &v, bias.defined() ? &bias : nullptr});
}

namespace detail {
// Part i (0 q, 1 k, 2 v) of qkv [B, S, 3, H, D] as [B, H, S, D] (a view).
template <class T>
Tensor<T> qkv_part(const Tensor<T>& qkv, int i) {
  return cutrain::permute(cutrain::squeeze(cutrain::slice(qkv, 2, i, i + 1), 2), {0, 2, 1, 3});
}
}  // namespace detail

template <class T>
struct QkvAttentionFn final : Node<T> {
  AttentionParams params;
  DropoutMask mask = DropoutMask::none;
  Tensor<T> qkv, o;
  Tensor<AttentionStats<T>> stats;
  std::string_view name() const override { return "qkv_attention"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dout) override {
    // Every element of dqkv is written (the three parts tile it): no zero fill.
    Tensor<T> dqkv(qkv.shape(), {.device = qkv.device()});
    AttentionBackward<T> into{detail::qkv_part(dqkv, 0), detail::qkv_part(dqkv, 1), detail::qkv_part(dqkv, 2)};
    ops::scaled_dot_product_attention_backward_into(detail::qkv_part(qkv, 0), detail::qkv_part(qkv, 1),
                                                    detail::qkv_part(qkv, 2), o, dout, stats, params, {}, mask, into);
    std::vector<Tensor<T>> g;
    g.push_back(std::move(dqkv));
    return g;
  }
  void release_saved() override { qkv = {}; o = {}; stats = {}; }
};

// Self-attention of a fused projection's output qkv [B, S, 3, H, D]: q, k and v are its three
// parts seen as [B, H, S, D] (views, [B, S, H, D] memory, as cuDNN takes them). Returns o
// [B, H, S, D] (on the GPU [B, S, H, D] in memory). The same values as
// scaled_dot_product_attention of the three slices; the backward writes dq, dk and dv straight
// into one [B, S, 3, H, D] gradient (on the GPU cuDNN writes there itself). No padding lengths.
template <class T>
Var<T> qkv_attention(const Var<T>& qkv, const AttentionParams& p = {}) {
  constexpr std::string_view op = "autograd::qkv_attention";
  detail::require_defined(op, {{qkv.defined(), "qkv"}});
  CUTRAIN_REQUIRE(qkv.value().rank() == 5 && qkv.value().dim(2) == 3, InvalidArgument, op,
                  "qkv must be [B, S, 3, H, D] (a fused projection's q, k and v), got ", qkv.value().describe());
  auto fn = std::make_shared<QkvAttentionFn<T>>();
  const Tensor<T>& x = qkv.value();
  AttentionForward<T, AttentionStats<T>> r = ops::scaled_dot_product_attention_forward(
      detail::qkv_part(x, 0), detail::qkv_part(x, 1), detail::qkv_part(x, 2), p);
  fn->params = p;
  fn->mask = r.mask;
  fn->save(fn->qkv, x, "qkv");
  fn->save(fn->o, r.o, "o");
  fn->stats = std::move(r.stats);
  return detail::finish<T>(std::move(r.o), fn, {&qkv});
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
