// Scaled dot-product attention on the CPU: the reference the GPU paths are tested against.
// q [B, H, Sq, D], k [B, Hk, Skv, D], v [B, Hk, Skv, Dv] with H a multiple of Hk (grouped-query
// attention: query head h reads key/value head h / (H / Hk)). Scores s_ij = scale q_i . k_j,
// masked (causal: j > i; padding: j >= kv_len, rows i >= q_len give zeros), softmax over j,
// o_i = sum_j p_ij m_ij v_j with the dropout weights m_ij (0, or 1 / (1 - dropout) where kept;
// 1 without dropout). Sums are accumulated in double and rounded to T at the end. The backward
// rebuilds p from the forward's log-sum-exp statistics. Arguments are checked by ops/attention.hpp.
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
  bool causal = false;
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
  std::int64_t keys(std::int64_t b, std::int64_t i) const {
    std::int64_t n = kv_len.empty() ? Skv : kv_len[static_cast<std::size_t>(b)];
    if (causal) n = std::min(n, i + 1);
    return n;
  }
  std::int64_t kv_head(std::int64_t h) const { return h / (H / Hk); }
};

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

// fn(b, h, i, n, srow, p) for every valid query row: srow its n scaled scores, p the row's
// softmax (n values); lse its log-sum-exp, from the forward (stats) or computed here.
template <class Fn>
void attention_rows(const AttentionGeometry& g, const std::vector<double>& q, const std::vector<double>& k,
                    const double* stats, Fn&& fn) {
  std::vector<double> s(static_cast<std::size_t>(g.Skv)), p(s.size());
  for (std::int64_t b = 0; b < g.B; ++b)
    for (std::int64_t h = 0; h < g.H; ++h) {
      const std::int64_t hk = g.kv_head(h);
      for (std::int64_t i = 0; i < g.rows(b); ++i) {
        const std::int64_t n = g.keys(b, i);
        const double* qi = &q[static_cast<std::size_t>(((b * g.H + h) * g.Sq + i) * g.D)];
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < n; ++j) {
          const double* kj = &k[static_cast<std::size_t>(((b * g.Hk + hk) * g.Skv + j) * g.D)];
          double dot = 0;
          for (std::int64_t d = 0; d < g.D; ++d) dot += qi[d] * kj[d];
          s[static_cast<std::size_t>(j)] = g.scale * dot;
          mx = std::max(mx, s[static_cast<std::size_t>(j)]);
        }
        double lse = 0;
        if (stats) {
          lse = stats[(b * g.H + h) * g.Sq + i];
        } else {
          double sum = 0;
          for (std::int64_t j = 0; j < n; ++j) sum += std::exp(s[static_cast<std::size_t>(j)] - mx);
          lse = mx + std::log(sum);
        }
        for (std::int64_t j = 0; j < n; ++j) p[static_cast<std::size_t>(j)] = std::exp(s[static_cast<std::size_t>(j)] - lse);
        fn(b, h, hk, i, n, lse, p.data());
      }
    }
}
}  // namespace detail

template <CpuFloat T>
AttentionForward<T> attention_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                      const detail::AttentionGeometry& g) {
  const auto qd = detail::attention_doubles(q), kd = detail::attention_doubles(k), vd = detail::attention_doubles(v);
  std::vector<double> o(static_cast<std::size_t>(g.B * g.H * g.Sq * g.Dv), 0.0);
  std::vector<double> lse(static_cast<std::size_t>(g.B * g.H * g.Sq), 0.0);
  detail::attention_rows(g, qd, kd, nullptr,
                         [&](std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i, std::int64_t n, double l,
                             const double* p) {
                           const std::int64_t row = (b * g.H + h) * g.Sq + i;
                           lse[static_cast<std::size_t>(row)] = l;
                           double* oi = &o[static_cast<std::size_t>(row * g.Dv)];
                           for (std::int64_t j = 0; j < n; ++j) {
                             const double* vj = &vd[static_cast<std::size_t>(((b * g.Hk + hk) * g.Skv + j) * g.Dv)];
                             const double w = p[j] * g.kept(b, h, i, j);
                             for (std::int64_t d = 0; d < g.Dv; ++d) oi[d] += w * vj[d];
                           }
                         });
  return {detail::attention_tensor<T>(o, Shape{g.B, g.H, g.Sq, g.Dv}),
          detail::attention_tensor<T>(lse, Shape{g.B, g.H, g.Sq})};
}

// dq, dk, dv from the forward's o and stats and the output gradient do. With p rebuilt from the
// statistics: dv_j += p_ij m_ij do_i, dp_ij = m_ij do_i . v_j, ds_ij = p_ij (dp_ij - do_i . o_i),
// dq_i = scale sum_j ds_ij k_j, dk_j += scale ds_ij q_i (summed over a key head's query heads).
template <CpuFloat T>
AttentionBackward<T> attention_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& o,
                                        const Tensor<T>& dout, const Tensor<T>& stats,
                                        const detail::AttentionGeometry& g) {
  const auto qd = detail::attention_doubles(q), kd = detail::attention_doubles(k), vd = detail::attention_doubles(v);
  const auto od = detail::attention_doubles(o), dod = detail::attention_doubles(dout);
  const auto sd = detail::attention_doubles(stats);
  std::vector<double> dq(qd.size(), 0.0), dk(kd.size(), 0.0), dv(vd.size(), 0.0);
  std::vector<double> ds(static_cast<std::size_t>(g.Skv));
  detail::attention_rows(
      g, qd, kd, sd.data(),
      [&](std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i, std::int64_t n, double, const double* p) {
        const std::int64_t row = (b * g.H + h) * g.Sq + i;
        const double* doi = &dod[static_cast<std::size_t>(row * g.Dv)];
        const double* oi = &od[static_cast<std::size_t>(row * g.Dv)];
        double delta = 0;
        for (std::int64_t d = 0; d < g.Dv; ++d) delta += doi[d] * oi[d];
        for (std::int64_t j = 0; j < n; ++j) {
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
        }
        const double* qi = &qd[static_cast<std::size_t>(row * g.D)];
        double* dqi = &dq[static_cast<std::size_t>(row * g.D)];
        for (std::int64_t j = 0; j < n; ++j) {
          const std::size_t kv_row = static_cast<std::size_t>((b * g.Hk + hk) * g.Skv + j);
          const double* kj = &kd[kv_row * static_cast<std::size_t>(g.D)];
          double* dkj = &dk[kv_row * static_cast<std::size_t>(g.D)];
          const double w = g.scale * ds[static_cast<std::size_t>(j)];
          for (std::int64_t d = 0; d < g.D; ++d) {
            dqi[d] += w * kj[d];
            dkj[d] += w * qi[d];
          }
        }
      });
  return {detail::attention_tensor<T>(dq, q.shape()), detail::attention_tensor<T>(dk, k.shape()),
          detail::attention_tensor<T>(dv, v.shape())};
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
