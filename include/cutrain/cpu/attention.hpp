// Scaled dot-product attention on the CPU: the reference the GPU paths are tested against.
// q [B, H, Sq, D], k [B, Hk, Skv, D], v [B, Hk, Skv, Dv] with H a multiple of Hk (grouped-query
// attention: query head h reads key/value head h / (H / Hk)). Scores s_ij = scale q_i . k_j,
// soft-capped (c tanh(s / c)), plus the bias, masked (padding: j >= kv_len; causal: j > a_i, a_i
// the aligned position of query i; window: j <= a_i - window; the boolean mask), softmax over j,
// o_i = sum_j p_ij m_ij v_j with the dropout weights m_ij (0, or 1 / (1 - dropout) where kept;
// 1 without dropout). Rows i >= q_len and rows with no key left give zeros. Sums are accumulated
// in double and rounded to T at the end. The backward rebuilds p from the forward's log-sum-exp
// statistics. Arguments are checked by ops/attention.hpp.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cutrain/core/params/attention.hpp"
#include "cutrain/core/random.hpp"
#include "cutrain/cpu/common.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
// The sizes of one attention, and its valid lengths per batch element (empty: all valid).
struct AttentionGeometry {
  std::int64_t B = 0, H = 0, Hk = 0, Sq = 0, Skv = 0, D = 0, Dv = 0;
  double scale = 1;
  bool causal = false, bottom_right = false;
  std::int64_t window = 0;  // with causal: keys a_i - window < j <= a_i; 0: none
  double softcap = 0;
  std::vector<std::int32_t> q_len{}, kv_len{};
  // Dropout: p_ij (logical index ((b H + h) Sq + i) Skv + j) is kept unless
  // uniform_at(seed, index) < dropout, or, where `keep` is given (B H Sq Skv values, 1 kept, 0
  // dropped: another generator's mask, as the GPU tests take cuDNN's), as keep says.
  double dropout = 0;
  std::uint64_t seed = 0;
  std::vector<float> keep{};

  // m_ij: the weight dropout gives p_ij.
  double kept(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    if (dropout == 0) return 1.0;
    const auto index = static_cast<std::uint64_t>(((b * H + h) * Sq + i) * Skv + j);
    const bool on = keep.empty() ? uniform_at(seed, index) >= dropout : keep[index] != 0.0f;
    return on ? 1.0 / (1.0 - dropout) : 0.0;
  }

  std::int64_t rows(std::int64_t b) const { return q_len.empty() ? Sq : q_len[static_cast<std::size_t>(b)]; }
  std::int64_t kv_rows(std::int64_t b) const { return kv_len.empty() ? Skv : kv_len[static_cast<std::size_t>(b)]; }
  // The keys [lo, hi) that padding, causal and the window leave query i of batch b (hi <= lo:
  // none). Bottom-right alignment puts the diagonal at a_i = i + kv_len - q_len.
  std::pair<std::int64_t, std::int64_t> key_range(std::int64_t b, std::int64_t i) const {
    std::int64_t lo = 0, hi = kv_rows(b);
    if (causal) {
      const std::int64_t a = bottom_right ? i + kv_rows(b) - rows(b) : i;
      hi = std::min(hi, a + 1);
      if (window > 0) lo = std::max<std::int64_t>(0, a - window + 1);
    }
    return {lo, std::max(lo, hi)};
  }
  std::int64_t kv_head(std::int64_t h) const { return h / (H / Hk); }
};

// The bias and the boolean mask as the loops read them (doubles, u8), each [B or 1, H or 1, Sq,
// Skv] row-major; empty where not given.
struct AttentionMaskValues {
  std::vector<double> bias{};
  std::vector<std::uint8_t> allowed{};
  std::int64_t bias_b = 1, bias_h = 1, allowed_b = 1, allowed_h = 1, Sq = 0, Skv = 0;

  // Element (b, h, i, j) of a [nb, nh, Sq, Skv] tensor broadcast over the dims of size 1.
  std::size_t at(std::int64_t nb, std::int64_t nh, std::int64_t b, std::int64_t h, std::int64_t i,
                 std::int64_t j) const {
    return static_cast<std::size_t>((((nb == 1 ? 0 : b) * nh + (nh == 1 ? 0 : h)) * Sq + i) * Skv + j);
  }
  std::size_t bias_index(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return at(bias_b, bias_h, b, h, i, j);
  }
  double bias_at(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return bias.empty() ? 0.0 : bias[bias_index(b, h, i, j)];
  }
  bool allows(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    return allowed.empty() || allowed[at(allowed_b, allowed_h, b, h, i, j)] != 0;
  }
};

template <class T>
AttentionMaskValues attention_mask_values(const AttentionMask<T>& m, const AttentionGeometry& g) {
  AttentionMaskValues r;
  r.Sq = g.Sq, r.Skv = g.Skv;
  if (m.bias.defined()) {
    const auto v = m.bias.to_vector();
    r.bias.assign(v.begin(), v.end());
    r.bias_b = m.bias.dim(0), r.bias_h = m.bias.dim(1);
  }
  if (m.allowed.defined()) {
    r.allowed = m.allowed.to_vector();
    r.allowed_b = m.allowed.dim(0), r.allowed_h = m.allowed.dim(1);
  }
  return r;
}

template <class T>
std::vector<double> attention_doubles(const Tensor<T>& t) {
  const auto v = t.to_vector();
  return {v.begin(), v.end()};
}

template <class T>
Tensor<T> attention_tensor(const std::vector<double>& v, const Shape& shape) {
  std::vector<T> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i]);
  return Tensor<T>::from_vector(out, shape);
}

// fn(b, h, hk, i, lo, hi, lse, p, t) for every query row with a key left: [lo, hi) the keys
// padding, causal and the window leave it, p the row's softmax over them (0 where the mask or a
// -inf bias drops a key), t (with a soft-cap) tanh(scale q_i . k_j / softcap); lse its
// log-sum-exp, from the forward (stats) or computed here. Rows with no key are skipped.
template <class Fn>
void attention_rows(const AttentionGeometry& g, const AttentionMaskValues& mv, const std::vector<double>& q,
                    const std::vector<double>& k, const double* stats, Fn&& fn) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  std::vector<double> s(static_cast<std::size_t>(g.Skv)), p(s.size()), t(s.size());
  for (std::int64_t b = 0; b < g.B; ++b)
    for (std::int64_t h = 0; h < g.H; ++h) {
      const std::int64_t hk = g.kv_head(h);
      for (std::int64_t i = 0; i < g.rows(b); ++i) {
        const auto [lo, hi] = g.key_range(b, i);
        const double* qi = &q[static_cast<std::size_t>(((b * g.H + h) * g.Sq + i) * g.D)];
        double mx = -inf;
        for (std::int64_t j = lo; j < hi; ++j) {
          const auto jj = static_cast<std::size_t>(j);
          if (!mv.allows(b, h, i, j)) {
            s[jj] = -inf;
            continue;
          }
          const double* kj = &k[static_cast<std::size_t>(((b * g.Hk + hk) * g.Skv + j) * g.D)];
          double dot = 0;
          for (std::int64_t d = 0; d < g.D; ++d) dot += qi[d] * kj[d];
          double x = g.scale * dot;
          if (g.softcap > 0) {
            t[jj] = std::tanh(x / g.softcap);
            x = g.softcap * t[jj];
          }
          s[jj] = x + mv.bias_at(b, h, i, j);
          mx = std::max(mx, s[jj]);
        }
        if (mx == -inf) continue;  // no key left: zero output, zero gradients
        double lse = 0;
        if (stats) {
          lse = stats[(b * g.H + h) * g.Sq + i];
        } else {
          double sum = 0;
          for (std::int64_t j = lo; j < hi; ++j) sum += std::exp(s[static_cast<std::size_t>(j)] - mx);
          lse = mx + std::log(sum);
        }
        for (std::int64_t j = lo; j < hi; ++j) {
          const auto jj = static_cast<std::size_t>(j);
          p[jj] = std::exp(s[jj] - lse);
        }
        fn(b, h, hk, i, lo, hi, lse, p.data(), t.data());
      }
    }
}
}  // namespace detail

// o and the statistics (-inf for a row with no key).
template <CpuFloat T>
AttentionForward<T> attention_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                      const detail::AttentionGeometry& g, const AttentionMask<T>& masks = {}) {
  const auto qd = detail::attention_doubles(q), kd = detail::attention_doubles(k), vd = detail::attention_doubles(v);
  std::vector<double> o(static_cast<std::size_t>(g.B * g.H * g.Sq * g.Dv), 0.0);
  std::vector<double> lse(static_cast<std::size_t>(g.B * g.H * g.Sq), -std::numeric_limits<double>::infinity());
  detail::attention_rows(g, detail::attention_mask_values(masks, g), qd, kd, nullptr,
                         [&](std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i, std::int64_t lo,
                             std::int64_t hi, double l, const double* p, const double*) {
                           const std::int64_t row = (b * g.H + h) * g.Sq + i;
                           lse[static_cast<std::size_t>(row)] = l;
                           double* oi = &o[static_cast<std::size_t>(row * g.Dv)];
                           for (std::int64_t j = lo; j < hi; ++j) {
                             const double* vj = &vd[static_cast<std::size_t>(((b * g.Hk + hk) * g.Skv + j) * g.Dv)];
                             const double w = p[j] * g.kept(b, h, i, j);
                             for (std::int64_t d = 0; d < g.Dv; ++d) oi[d] += w * vj[d];
                           }
                         });
  return {detail::attention_tensor<T>(o, Shape{g.B, g.H, g.Sq, g.Dv}),
          detail::attention_tensor<T>(lse, Shape{g.B, g.H, g.Sq})};
}

// dq, dk, dv (and, with dbias, the bias's gradient) from the forward's o and stats and the output
// gradient do. With p rebuilt from the statistics: dv_j += p_ij m_ij do_i, dp_ij = m_ij do_i . v_j,
// ds_ij = p_ij (m_ij dp_ij - do_i . o_i) (the bias's gradient, summed over its broadcast dims),
// dr_ij = ds_ij (1 - t_ij²) with a soft-cap (else ds_ij), dq_i = scale sum_j dr_ij k_j,
// dk_j += scale dr_ij q_i (summed over a key head's query heads).
template <CpuFloat T>
AttentionBackward<T> attention_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& o,
                                        const Tensor<T>& dout, const Tensor<T>& stats,
                                        const detail::AttentionGeometry& g, const AttentionMask<T>& masks = {},
                                        bool dbias = false) {
  const auto qd = detail::attention_doubles(q), kd = detail::attention_doubles(k), vd = detail::attention_doubles(v);
  const auto od = detail::attention_doubles(o), dod = detail::attention_doubles(dout);
  const auto sd = detail::attention_doubles(stats);
  const detail::AttentionMaskValues mv = detail::attention_mask_values(masks, g);
  const bool with_dbias = dbias && masks.bias.defined();
  std::vector<double> dq(qd.size(), 0.0), dk(kd.size(), 0.0), dv(vd.size(), 0.0);
  std::vector<double> db(with_dbias ? mv.bias.size() : 0, 0.0);
  std::vector<double> ds(static_cast<std::size_t>(g.Skv));
  detail::attention_rows(
      g, mv, qd, kd, sd.data(),
      [&](std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i, std::int64_t lo, std::int64_t hi, double,
          const double* p, const double* t) {
        const std::int64_t row = (b * g.H + h) * g.Sq + i;
        const double* doi = &dod[static_cast<std::size_t>(row * g.Dv)];
        const double* oi = &od[static_cast<std::size_t>(row * g.Dv)];
        double delta = 0;
        for (std::int64_t d = 0; d < g.Dv; ++d) delta += doi[d] * oi[d];
        for (std::int64_t j = lo; j < hi; ++j) {
          const std::size_t kv_row = static_cast<std::size_t>((b * g.Hk + hk) * g.Skv + j);
          const double* vj = &vd[kv_row * static_cast<std::size_t>(g.Dv)];
          double* dvj = &dv[kv_row * static_cast<std::size_t>(g.Dv)];
          const double m = g.kept(b, h, i, j), w = p[j] * m;
          double dp = 0;
          for (std::int64_t d = 0; d < g.Dv; ++d) {
            dp += doi[d] * vj[d];
            dvj[d] += w * doi[d];
          }
          ds[static_cast<std::size_t>(j)] = p[j] * (m * dp - delta);
          if (with_dbias) db[mv.bias_index(b, h, i, j)] += ds[static_cast<std::size_t>(j)];
        }
        const double* qi = &qd[static_cast<std::size_t>(row * g.D)];
        double* dqi = &dq[static_cast<std::size_t>(row * g.D)];
        for (std::int64_t j = lo; j < hi; ++j) {
          const std::size_t kv_row = static_cast<std::size_t>((b * g.Hk + hk) * g.Skv + j);
          const double* kj = &kd[kv_row * static_cast<std::size_t>(g.D)];
          double* dkj = &dk[kv_row * static_cast<std::size_t>(g.D)];
          const double cap = g.softcap > 0 ? 1.0 - t[j] * t[j] : 1.0;
          const double w = g.scale * ds[static_cast<std::size_t>(j)] * cap;
          for (std::int64_t d = 0; d < g.D; ++d) {
            dqi[d] += w * kj[d];
            dkj[d] += w * qi[d];
          }
        }
      });
  return {detail::attention_tensor<T>(dq, q.shape()), detail::attention_tensor<T>(dk, k.shape()),
          detail::attention_tensor<T>(dv, v.shape()),
          with_dbias ? detail::attention_tensor<T>(db, masks.bias.shape()) : Tensor<T>{}};
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
