// Scaled dot-product attention composed from cutrain's own ops (matmul, broadcasting
// elementwise, reductions), in f32 on the tensors' device: the GPU path where cuDNN's fused
// SDPA has no engine (f32 inputs, head dims it refuses). It materializes the [Sq, Skv] scores
// per head, so it costs O(B H Sq Skv) memory; the fused path does not. Same semantics and
// statistics as cpu/attention.hpp. Grouped heads are broadcast batch dims of the matmuls:
// q is seen as [B, Hk, G, Sq, D] against k as [B, Hk, 1, Skv, D]. Dropout is ops::dropout_forward
// on the probabilities: its mask over their logical index is the CPU's (cpu/attention.hpp).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <limits>
#include <vector>

#include "cutrain/core/params/attention.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/cpu/attention.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/cast.hpp"
#include "cutrain/ops/dropout.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/matmul.hpp"
#include "cutrain/ops/reduce.hpp"

namespace cutrain::inline CUTRAIN_ABI::ops::detail {

// t [B, heads, S, E] in f32 as [B, groups, heads / groups, S, E] (row-major).
template <class T>
Tensor<float> attention_grouped(const Tensor<T>& t, std::int64_t groups) {
  Tensor<float> f = ops::cast<float>(t).contiguous(Layout::row_major);
  return cutrain::reshape(f, Shape{t.dim(0), groups, t.dim(1) / groups, t.dim(2), t.dim(3)});
}

// The additive mask (0 or -inf) of the scores, [B or 1, 1, 1, Sq, Skv], and the valid query
// rows, u8 [B or 1, 1, 1, Sq, 1]; built on the host, copied to `dev`.
struct AttentionMasks {
  Tensor<float> add;
  Tensor<std::uint8_t> rows;
};

inline AttentionMasks attention_masks(const cpu::detail::AttentionGeometry& g, Device dev) {
  CUTRAIN_REQUIRE(dev.is_cpu() || !cutrain::detail::device_capturing(), InvalidArgument, "scaled_dot_product_attention",
                  "the composed path (f32, or a signature cuDNN's SDPA has no engine for) copies its masks from the "
                  "host and cannot be captured in a CUDA graph; capture attention in bf16 or f16");
  const std::int64_t nb = g.q_len.empty() && g.kv_len.empty() ? 1 : g.B;
  std::vector<float> add(static_cast<std::size_t>(nb * g.Sq * g.Skv), 0.0f);
  std::vector<std::uint8_t> rows(static_cast<std::size_t>(nb * g.Sq), 1);
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t i = 0; i < g.Sq; ++i) {
      if (i >= g.rows(b)) rows[static_cast<std::size_t>(b * g.Sq + i)] = 0;
      for (std::int64_t j = g.keys(b, i); j < g.Skv; ++j)
        add[static_cast<std::size_t>((b * g.Sq + i) * g.Skv + j)] = -std::numeric_limits<float>::infinity();
    }
  return {Tensor<float>::from_vector(add, Shape{nb, 1, 1, g.Sq, g.Skv}).to(dev),
          Tensor<std::uint8_t>::from_vector(rows, Shape{nb, 1, 1, g.Sq, 1}).to(dev)};
}

// The scaled, masked scores [B, Hk, G, Sq, Skv] of q5 and k5 (grouped f32).
inline Tensor<float> attention_scores(const Tensor<float>& q5, const Tensor<float>& k5, const AttentionMasks& m,
                                      double scale) {
  return ops::add(ops::scale(ops::matmul(q5, cutrain::transpose(k5, 3, 4)), scale), m.add);
}

// p with dropout applied (y) and the dropout weights (mask), or p itself without dropout.
inline DropoutForward<float> attention_dropped(const Tensor<float>& p, const cpu::detail::AttentionGeometry& g) {
  if (g.dropout == 0) return {p.view(), Tensor<float>{}};
  return ops::dropout_forward(p, g.dropout, g.seed);
}

template <class T>
AttentionForward<T, float> attention_forward_composed(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                      const cpu::detail::AttentionGeometry& g) {
  const AttentionMasks m = attention_masks(g, q.device());
  const Tensor<float> q5 = attention_grouped(q, g.Hk), k5 = attention_grouped(k, g.Hk), v5 = attention_grouped(v, g.Hk);
  const Tensor<float> s = attention_scores(q5, k5, m, g.scale);
  const Tensor<float> mx = ops::max(s, {-1}, true);
  const Tensor<float> lse = ops::add(mx, ops::log(ops::sum(ops::exp(ops::sub(s, mx)), {-1}, true)));
  const Tensor<float> p = ops::exp(ops::sub(s, lse));
  const Tensor<float> zero = Tensor<float>::zeros(Shape{1}, {.device = q.device()});
  const Tensor<float> o5 = ops::where(m.rows, ops::matmul(attention_dropped(p, g).y, v5), zero);
  return {ops::cast<T>(cutrain::reshape(o5, Shape{g.B, g.H, g.Sq, g.Dv})),
          cutrain::reshape(lse, Shape{g.B, g.H, g.Sq})};
}

template <class T>
AttentionBackward<T> attention_backward_composed(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                 const Tensor<T>& o, const Tensor<T>& dout, const Tensor<float>& stats,
                                                 const cpu::detail::AttentionGeometry& g) {
  const AttentionMasks m = attention_masks(g, q.device());
  const Tensor<float> q5 = attention_grouped(q, g.Hk), k5 = attention_grouped(k, g.Hk), v5 = attention_grouped(v, g.Hk);
  const Tensor<float> zero = Tensor<float>::zeros(Shape{1}, {.device = q.device()});
  // Padded rows' statistics are unspecified: their p and do are selected away, not multiplied.
  const Tensor<float> lse = cutrain::reshape(stats.contiguous(Layout::row_major), Shape{g.B, g.Hk, g.H / g.Hk, g.Sq, 1});
  const Tensor<float> p = ops::where(m.rows, ops::exp(ops::sub(attention_scores(q5, k5, m, g.scale), lse)), zero);
  const Tensor<float> do5 = ops::where(m.rows, attention_grouped(dout, g.Hk), zero);
  // Padded rows of o are unspecified too (cuDNN's forward leaves them): 0 * NaN must not reach delta.
  const Tensor<float> o5 = ops::where(m.rows, attention_grouped(o, g.Hk), zero);
  const DropoutForward<float> pd = attention_dropped(p, g);
  const Tensor<float> dv = ops::sum(ops::matmul(cutrain::transpose(pd.y, 3, 4), do5), {2});
  Tensor<float> dp = ops::matmul(do5, cutrain::transpose(v5, 3, 4));
  if (pd.mask.defined()) dp = ops::mul(dp, pd.mask);
  const Tensor<float> delta = ops::sum(ops::mul(do5, o5), {-1}, true);
  const Tensor<float> ds = ops::mul(p, ops::sub(dp, delta));
  const Tensor<float> dq = ops::scale(ops::matmul(ds, k5), g.scale);
  const Tensor<float> dk = ops::scale(ops::sum(ops::matmul(cutrain::transpose(ds, 3, 4), q5), {2}), g.scale);
  return {ops::cast<T>(cutrain::reshape(dq, q.shape())), ops::cast<T>(dk), ops::cast<T>(dv)};
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops::detail
