// Scaled dot-product attention composed from cutrain's own ops (matmul, broadcasting
// elementwise, reductions, tanh), in f32 on the tensors' device: the GPU path where cuDNN's fused
// SDPA has no engine (f32 inputs, soft-capping, head dims or masks it refuses). It materializes
// the [Sq, Skv] scores per head, so it costs O(B H Sq Skv) memory; the fused path does not. Same semantics and
// statistics as cpu/attention.hpp. Grouped heads are broadcast batch dims of the matmuls:
// q is seen as [B, Hk, G, Sq, D] against k as [B, Hk, 1, Skv, D]. Dropout is ops::dropout_forward
// on the probabilities: its mask over their logical index is the CPU's (cpu/attention.hpp).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "cutrain/core/params/attention.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/cpu/attention.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/cast.hpp"
#include "cutrain/ops/dropout.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/matmul.hpp"
#include "cutrain/ops/reduce.hpp"
#include "cutrain/ops/sum_to.hpp"

namespace cutrain::inline CUTRAIN_ABI::ops::detail {

// t [B, heads, S, E] in f32 as [B, groups, heads / groups, S, E] (row-major).
template <class T>
Tensor<float> attention_grouped(const Tensor<T>& t, std::int64_t groups) {
  Tensor<float> f = ops::cast<float>(t).contiguous(Layout::row_major);
  return cutrain::reshape(f, Shape{t.dim(0), groups, t.dim(1) / groups, t.dim(2), t.dim(3)});
}

// The additive mask (0 or -inf) of the scores, [B or 1, 1, 1, Sq, Skv], from padding (keys past
// kv_len, and every key of a row past q_len), causal and the window; built on the host, copied
// to `dev`.
inline Tensor<float> attention_structure(const cpu::detail::AttentionGeometry& g, Device dev) {
  CUTRAIN_REQUIRE(dev.is_cpu() || !cutrain::detail::device_capturing(), InvalidArgument, "scaled_dot_product_attention",
                  "the composed path (f32, soft-capping, or a signature cuDNN's SDPA has no engine for) copies its "
                  "masks from the host and cannot be captured in a CUDA graph; capture attention in bf16 or f16");
  const std::int64_t nb = g.q_len.empty() && g.kv_len.empty() ? 1 : g.B;
  constexpr float inf = std::numeric_limits<float>::infinity();
  std::vector<float> add(static_cast<std::size_t>(nb * g.Sq * g.Skv), 0.0f);
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t i = 0; i < g.Sq; ++i) {
      const auto [lo, hi] = i < g.rows(b) ? g.key_range(b, i) : std::pair<std::int64_t, std::int64_t>{0, 0};
      for (std::int64_t j = 0; j < g.Skv; ++j)
        if (j < lo || j >= hi) add[static_cast<std::size_t>((b * g.Sq + i) * g.Skv + j)] = -inf;
    }
  return Tensor<float>::from_vector(add, Shape{nb, 1, 1, g.Sq, g.Skv}).to(dev);
}

// The bias (f32) with -inf where the boolean mask drops a key, [B or 1, Hk or 1, G or 1, Sq, Skv]
// against the grouped scores; undefined without either.
template <class T>
Tensor<float> attention_extra(const AttentionMask<T>& m, const cpu::detail::AttentionGeometry& g, Device dev) {
  if (!m.any()) return {};
  Tensor<float> e = m.bias.defined() ? ops::cast<float>(m.bias).contiguous(Layout::row_major) : Tensor<float>{};
  if (m.allowed.defined()) {
    const auto scalar = [&](float x) { return Tensor<float>::full(Shape{1}, x, {.device = dev}); };
    e = ops::where(m.allowed, e.defined() ? e.view() : scalar(0.0f), scalar(-std::numeric_limits<float>::infinity()));
  }
  const bool heads = e.dim(1) != 1;
  return cutrain::reshape(e, Shape{e.dim(0), heads ? g.Hk : 1, heads ? g.H / g.Hk : 1, g.Sq, g.Skv});
}

// The scores [B, Hk, G, Sq, Skv] of q5 and k5 (grouped f32): scaled, soft-capped (t receives
// tanh(scaled / softcap), the backward's), plus the bias, masked.
inline Tensor<float> attention_scores(const Tensor<float>& q5, const Tensor<float>& k5, const Tensor<float>& structure,
                                      const Tensor<float>& extra, const cpu::detail::AttentionGeometry& g,
                                      Tensor<float>* t = nullptr) {
  Tensor<float> s = ops::scale(ops::matmul(q5, cutrain::transpose(k5, 3, 4)), g.scale);
  if (g.softcap > 0) {
    Tensor<float> th = ops::activation_forward(ops::scale(s, 1.0 / g.softcap), {.kind = Activation::tanh});
    s = ops::scale(th, g.softcap);
    if (t) *t = std::move(th);
  }
  s = ops::add(s, structure);
  return extra.defined() ? ops::add(s, extra) : std::move(s);
}

// u8 [B, Hk, G, Sq, 1]: 1 where a row of the scores has a key left, from the rows' max (finite).
inline Tensor<std::uint8_t> attention_rows(const Tensor<float>& row_max) {
  return ops::gt(row_max,
                 Tensor<float>::full(Shape{1}, -std::numeric_limits<float>::infinity(), {.device = row_max.device()}));
}

// p with dropout applied (y) and the dropout weights (mask), or p itself without dropout.
inline DropoutForward<float> attention_dropped(const Tensor<float>& p, const cpu::detail::AttentionGeometry& g) {
  if (g.dropout == 0) return {p.view(), Tensor<float>{}};
  return ops::dropout_forward(p, g.dropout, g.seed);
}

// Rows with no key give zero output and the statistic -inf.
template <class T>
AttentionForward<T, float> attention_forward_composed(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                      const cpu::detail::AttentionGeometry& g,
                                                      const AttentionMask<T>& masks = {}) {
  const Tensor<float> structure = attention_structure(g, q.device()), extra = attention_extra(masks, g, q.device());
  const Tensor<float> q5 = attention_grouped(q, g.Hk), k5 = attention_grouped(k, g.Hk), v5 = attention_grouped(v, g.Hk);
  const Tensor<float> s = attention_scores(q5, k5, structure, extra, g);
  const Tensor<float> zero = Tensor<float>::zeros(Shape{1}, {.device = q.device()});
  const Tensor<float> row_max = ops::max(s, {-1}, true);
  const Tensor<std::uint8_t> rows = attention_rows(row_max);
  const Tensor<float> mx = ops::where(rows, row_max, zero);
  const Tensor<float> lse = ops::add(mx, ops::log(ops::sum(ops::exp(ops::sub(s, mx)), {-1}, true)));
  const Tensor<float> p = ops::where(rows, ops::exp(ops::sub(s, lse)), zero);
  const Tensor<float> o5 = ops::matmul(attention_dropped(p, g).y, v5);
  return {ops::cast<T>(cutrain::reshape(o5, Shape{g.B, g.H, g.Sq, g.Dv})),
          cutrain::reshape(lse, Shape{g.B, g.H, g.Sq})};
}

// dq, dk, dv, and dbias (the bias's shape) where asked.
template <class T>
AttentionBackward<T> attention_backward_composed(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                 const Tensor<T>& o, const Tensor<T>& dout, const Tensor<float>& stats,
                                                 const cpu::detail::AttentionGeometry& g,
                                                 const AttentionMask<T>& masks = {}, bool dbias = false) {
  const Tensor<float> structure = attention_structure(g, q.device()), extra = attention_extra(masks, g, q.device());
  const Tensor<float> q5 = attention_grouped(q, g.Hk), k5 = attention_grouped(k, g.Hk), v5 = attention_grouped(v, g.Hk);
  const Tensor<float> zero = Tensor<float>::zeros(Shape{1}, {.device = q.device()});
  Tensor<float> t;
  const Tensor<float> s = attention_scores(q5, k5, structure, extra, g, &t);
  // Rows with no key (padded, or every key masked) have unspecified statistics and o (cuDNN's
  // forward leaves them): their p, do and o are selected away, not multiplied (0 * NaN).
  const Tensor<std::uint8_t> rows = attention_rows(ops::max(s, {-1}, true));
  const Tensor<float> lse = cutrain::reshape(stats.contiguous(Layout::row_major), Shape{g.B, g.Hk, g.H / g.Hk, g.Sq, 1});
  const Tensor<float> p = ops::where(rows, ops::exp(ops::sub(s, lse)), zero);
  const Tensor<float> do5 = ops::where(rows, attention_grouped(dout, g.Hk), zero);
  const Tensor<float> o5 = ops::where(rows, attention_grouped(o, g.Hk), zero);
  const DropoutForward<float> pd = attention_dropped(p, g);
  const Tensor<float> dv = ops::sum(ops::matmul(cutrain::transpose(pd.y, 3, 4), do5), {2});
  Tensor<float> dp = ops::matmul(do5, cutrain::transpose(v5, 3, 4));
  if (pd.mask.defined()) dp = ops::mul(dp, pd.mask);
  const Tensor<float> delta = ops::sum(ops::mul(do5, o5), {-1}, true);
  const Tensor<float> ds = ops::mul(p, ops::sub(dp, delta));
  Tensor<T> db;
  if (dbias && masks.bias.defined())
    db = ops::cast<T>(ops::sum_to(cutrain::reshape(ds, Shape{g.B, g.H, g.Sq, g.Skv}), masks.bias.shape()));
  // Through the soft-cap: d(c tanh(x / c)) / dx = 1 - tanh².
  const Tensor<float> one = Tensor<float>::full(Shape{1}, 1.0f, {.device = q.device()});
  const Tensor<float> dr = g.softcap > 0 ? ops::mul(ds, ops::sub(one, ops::mul(t, t))) : ds.view();
  const Tensor<float> dq = ops::scale(ops::matmul(dr, k5), g.scale);
  const Tensor<float> dk = ops::scale(ops::sum(ops::matmul(cutrain::transpose(dr, 3, 4), q5), {2}), g.scale);
  return {ops::cast<T>(cutrain::reshape(dq, q.shape())), ops::cast<T>(dk), ops::cast<T>(dv), std::move(db)};
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops::detail
