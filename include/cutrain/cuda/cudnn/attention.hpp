// Scaled dot-product attention on cuDNN's fused SDPA nodes (flash-style: the [Sq, Skv] scores
// never reach memory), forward and backward, bf16 and f16, with the semantics of
// cpu/attention.hpp. q, k, v, o and their gradients are [B, H, S, D] with any strides whose last
// is 1 (a [B, S, H, D] tensor viewed through permute needs no copy); stats is [B, H, Sq] in f32,
// the log-sum-exp the backward takes. Lengths (padding masks) are int32 [B] or undefined; bias is
// an additive bias [B or 1, H or 1, Sq, Skv] of T, or undefined; band is causal (top-left or
// bottom-right aligned) with an optional sliding window. cudnn-frontend refuses some pairings
// (in 1.32: bottom-right with a bias or dropout; a window with Sq > Skv and no lengths).
// The functions return false, having run nothing, where cuDNN has no engine for the signature
// (f32, head dims it does not support); ops/attention.hpp then composes the op from matmuls.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "cutrain/core/params/attention.hpp"
#include "cutrain/cuda/api.hpp"  // the declarations, with the default arguments
#include "cutrain/cuda/cudnn/plan_store.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

namespace detail {
// stats [B, H, Sq] as the [B, H, Sq, 1] tensor the SDPA nodes take.
inline std::pair<Shape, Strides> attention_stats_view(const Tensor<float>& stats) {
  const std::int64_t b = stats.dim(0), h = stats.dim(1), s = stats.dim(2);
  return {Shape{b, h, s, 1}, Strides{h * s, s, 1, 1}};
}

// The band's attributes: causal aligned as asked, then the window as the band's left bound.
template <class Attrs>
void attention_band(Attrs& attrs, AttentionBand band) {
  if (!band.causal) return;
  if (band.bottom_right)
    attrs.set_causal_mask_bottom_right(true);
  else
    attrs.set_causal_mask(true);
  if (band.window > 0)
    attrs.set_diagonal_band_left_bound(static_cast<int>(std::min<std::int64_t>(band.window, std::int64_t{1} << 30)));
}

inline std::string attention_band_text(AttentionBand band) {
  if (!band.causal) return "";
  return cutrain::detail::cat(band.bottom_right ? " causal bottom_right" : " causal",
                              band.window > 0 ? cutrain::detail::cat(" window ", band.window) : std::string());
}

inline TensorAttr attention_lengths(fe::graph::Graph& g, const char* name, std::int64_t b) {
  return tensor(g, name, Shape{b, 1, 1, 1}, Strides{1, 1, 1, 1}, fe::DataType_t::INT32);
}

// Dropout's Philox seed and offset: int32 [1, 1, 1, 1] each, on the device.
inline std::pair<TensorAttr, TensorAttr> attention_seed(fe::graph::Graph& g) {
  return {tensor(g, "seed", Shape{1, 1, 1, 1}, Strides{1, 1, 1, 1}, fe::DataType_t::INT32),
          tensor(g, "offset", Shape{1, 1, 1, 1}, Strides{1, 1, 1, 1}, fe::DataType_t::INT32)};
}

template <class T>
void attention_output(const TensorAttr& a, const Tensor<T>& t) {
  a->set_output(true).set_dim(t.shape().dims()).set_stride(t.strides()).set_data_type(fe_type<T>::value);
}

// Padded graphs are left to the heuristics (even under tune_all_graphs): the tuner's scratch
// lengths are zeros, and timing an attention over no keys says nothing.
inline autotune::Planner attention_planner(int dev, bool padded) {
  return padded ? autotune::Planner::heuristic() : autotune::Planner::for_graph(dev, autotune::GraphFamily::attention);
}

}  // namespace detail

// o and stats of softmax(scale q kᵀ, masked) v (an undefined stats: o only, the inference
// graph), with dropout on the probabilities where dropout > 0 (Philox seeded by seed_offset,
// int32 on the device: the seed at [0], the offset at [4]; rng_dump, if given, receives the keep
// mask [B, H, Sq, Skv] in f32: the tests' window on it).
// False: no engine (nothing ran).
template <GpuFloat T>
[[nodiscard]] bool attention_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                     const Tensor<std::int32_t>& q_len, const Tensor<std::int32_t>& kv_len,
                                     const Tensor<T>& bias, double scale, AttentionBand band, double dropout,
                                     const Tensor<std::int32_t>& seed_offset, Tensor<T>& o, Tensor<float>& stats,
                                     Tensor<float>* rng_dump) {
  constexpr std::string_view op = "scaled_dot_product_attention";
  const int dev = q.device().index;
  const bool padded = q_len.defined();
  const bool biased = bias.defined();
  const bool with_stats = stats.defined();
  const auto [ss, sst] = with_stats ? detail::attention_stats_view(stats) : std::pair<Shape, Strides>{};
  GraphKey key(GraphOp::attention_forward, dev);
  key.add(dtype_of<T>).add(scale).add(band.causal).add(band.bottom_right).add(band.window).add(padded).add(dropout);
  key.add(rng_dump != nullptr).add(with_stats).add(biased);
  key.add(q.shape(), q.strides()).add(k.shape(), k.strides()).add(v.shape(), v.strides()).add(o.shape(), o.strides());
  if (biased) key.add(bias.shape(), bias.strides());
  PlanStore& store = plan_store();
  bool failed = false;
  BuiltGraph* bg = store.find(key, failed);
  if (!bg && !failed) {
    const std::string text =
        cutrain::detail::cat("sdpa fwd ", dtype_of<T>, " scale ", scale, detail::attention_band_text(band),
                             padded ? " padded" : "",
                             dropout > 0 ? cutrain::detail::cat(" dropout ", dropout) : std::string(),
                             rng_dump ? " rng_dump" : "", with_stats ? "" : " inference",
                             signature(" q", q.shape(), q.strides()), signature(" k", k.shape(), k.strides()),
                             signature(" v", v.shape(), v.strides()), signature(" o", o.shape(), o.strides()),
                             biased ? signature(" bias", bias.shape(), bias.strides()) : std::string());
    bg = store.try_build(key, text, detail::attention_planner(dev, padded),
                         [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto Q = tensor(*g, "q", q), K = tensor(*g, "k", k), V = tensor(*g, "v", v);
      auto attrs = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(with_stats).set_attn_scale(
          static_cast<float>(scale));
      detail::attention_band(attrs, band);
      TensorAttr BIAS;
      if (biased) {
        BIAS = tensor(*g, "bias", bias);
        attrs.set_bias(BIAS);
      }
      TensorAttr SQ, SKV;
      if (padded) {
        SQ = detail::attention_lengths(*g, "seq_len_q", q.dim(0));
        SKV = detail::attention_lengths(*g, "seq_len_kv", q.dim(0));
        attrs.set_padding_mask(true).set_seq_len_q(SQ).set_seq_len_kv(SKV);
      }
      TensorAttr SEED, OFFSET, DUMP;
      if (dropout > 0) {
        std::tie(SEED, OFFSET) = detail::attention_seed(*g);
        attrs.set_dropout(static_cast<float>(dropout), SEED, OFFSET);
      }
      if (rng_dump) {
        DUMP = tensor(*g, "rng_dump", *rng_dump);
        DUMP->set_output(true);
        attrs.set_rng_dump(DUMP);
      }
      auto [O, STATS] = g->sdpa(Q, K, V, attrs);
      detail::attention_output(O, o);
      if (with_stats) STATS->set_output(true).set_dim(ss.dims()).set_stride(sst).set_data_type(fe::DataType_t::FLOAT);
      build(*g, handles(dev).cudnn, op, text, false, planner);
      std::vector<TensorAttr> ts{Q, K, V, O};
      if (with_stats) ts.push_back(STATS);
      if (padded) ts.insert(ts.end(), {SQ, SKV});
      if (dropout > 0) ts.insert(ts.end(), {SEED, OFFSET});
      if (rng_dump) ts.push_back(DUMP);
      if (biased) ts.push_back(BIAS);
      return BuiltGraph{g, std::move(ts), g->get_workspace_size()};
    });
  }
  if (!bg) return ++kernel_fallbacks(), false;
  std::vector<const void*> ptrs{q.data(), k.data(), v.data(), o.data()};
  if (with_stats) ptrs.push_back(stats.data());
  if (padded) ptrs.insert(ptrs.end(), {q_len.data(), kv_len.data()});
  if (dropout > 0) ptrs.insert(ptrs.end(), {seed_offset.data(), seed_offset.data() + 4});
  if (rng_dump) ptrs.push_back(rng_dump->data());
  if (biased) ptrs.push_back(bias.data());
  execute(*bg, dev, ptrs, op);
  return true;
}

// dq, dk, dv (and dbias, if given: the bias's gradient, of its shape) from the forward's o and
// stats. deterministic asks cuDNN for an engine without atomics. False: no engine (nothing ran).
template <GpuFloat T>
[[nodiscard]] bool attention_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& o,
                                      const Tensor<T>& dout, const Tensor<float>& stats,
                                      const Tensor<std::int32_t>& q_len, const Tensor<std::int32_t>& kv_len,
                                      const Tensor<T>& bias, double scale, AttentionBand band, bool deterministic,
                                      double dropout, const Tensor<std::int32_t>& seed_offset, Tensor<T>& dq,
                                      Tensor<T>& dk, Tensor<T>& dv, Tensor<T>* dbias) {
  constexpr std::string_view op = "scaled_dot_product_attention_backward";
  const int dev = q.device().index;
  const bool padded = q_len.defined();
  const bool biased = bias.defined(), with_dbias = biased && dbias != nullptr;
  const auto [ss, sst] = detail::attention_stats_view(stats);
  GraphKey key(GraphOp::attention_backward, dev);
  key.add(dtype_of<T>).add(scale).add(band.causal).add(band.bottom_right).add(band.window).add(padded);
  key.add(deterministic).add(dropout).add(biased).add(with_dbias);
  for (const Tensor<T>* t : std::initializer_list<const Tensor<T>*>{&q, &k, &v, &o, &dout, &dq, &dk, &dv})
    key.add(t->shape(), t->strides());
  if (biased) key.add(bias.shape(), bias.strides());
  if (with_dbias) key.add(dbias->shape(), dbias->strides());
  PlanStore& store = plan_store();
  bool failed = false;
  BuiltGraph* bg = store.find(key, failed);
  if (!bg && !failed) {
    const std::string text = cutrain::detail::cat(
        "sdpa bwd ", dtype_of<T>, " scale ", scale, detail::attention_band_text(band), padded ? " padded" : "",
        deterministic ? " deterministic" : "", dropout > 0 ? cutrain::detail::cat(" dropout ", dropout) : std::string(),
        signature(" q", q.shape(), q.strides()),
        signature(" k", k.shape(), k.strides()), signature(" v", v.shape(), v.strides()),
        signature(" o", o.shape(), o.strides()), signature(" do", dout.shape(), dout.strides()),
        signature(" dq", dq.shape(), dq.strides()), signature(" dk", dk.shape(), dk.strides()),
        signature(" dv", dv.shape(), dv.strides()),
        biased ? signature(" bias", bias.shape(), bias.strides()) : std::string(),
        with_dbias ? signature(" dbias", dbias->shape(), dbias->strides()) : std::string());
    bg = store.try_build(key, text, detail::attention_planner(dev, padded),
                         [&](autotune::Planner& planner) {
      auto g = detail::new_graph<T>();
      auto Q = tensor(*g, "q", q), K = tensor(*g, "k", k), V = tensor(*g, "v", v);
      auto O = tensor(*g, "o", o), DO = tensor(*g, "do", dout);
      auto STATS = tensor(*g, "stats", ss, sst, fe::DataType_t::FLOAT);
      auto attrs = fe::graph::SDPA_backward_attributes().set_name("sdpa_backward").set_attn_scale(
          static_cast<float>(scale));
      detail::attention_band(attrs, band);
      if (deterministic) attrs.set_deterministic_algorithm(true);
      TensorAttr BIAS, DBIAS;
      if (biased) {
        BIAS = tensor(*g, "bias", bias);
        attrs.set_bias(BIAS);
      }
      if (with_dbias) {
        DBIAS = tensor(*g, "dbias", *dbias);
        DBIAS->set_output(true);
        attrs.set_dbias(DBIAS);
      }
      TensorAttr SQ, SKV;
      if (padded) {
        SQ = detail::attention_lengths(*g, "seq_len_q", q.dim(0));
        SKV = detail::attention_lengths(*g, "seq_len_kv", q.dim(0));
        attrs.set_padding_mask(true).set_seq_len_q(SQ).set_seq_len_kv(SKV);
      }
      TensorAttr SEED, OFFSET;
      if (dropout > 0) {
        std::tie(SEED, OFFSET) = detail::attention_seed(*g);
        attrs.set_dropout(static_cast<float>(dropout), SEED, OFFSET);
      }
      auto [DQ, DK, DV] = g->sdpa_backward(Q, K, V, O, DO, STATS, attrs);
      detail::attention_output(DQ, dq);
      detail::attention_output(DK, dk);
      detail::attention_output(DV, dv);
      build(*g, handles(dev).cudnn, op, text, false, planner);
      std::vector<TensorAttr> ts{Q, K, V, O, DO, STATS, DQ, DK, DV};
      if (padded) ts.insert(ts.end(), {SQ, SKV});
      if (dropout > 0) ts.insert(ts.end(), {SEED, OFFSET});
      if (biased) ts.push_back(BIAS);
      if (with_dbias) ts.push_back(DBIAS);
      return BuiltGraph{g, std::move(ts), g->get_workspace_size()};
    });
  }
  if (!bg) return ++kernel_fallbacks(), false;
  std::vector<const void*> ptrs{q.data(),    k.data(),     v.data(),  o.data(), dout.data(),
                                stats.data(), dq.data(), dk.data(), dv.data()};
  if (padded) ptrs.insert(ptrs.end(), {q_len.data(), kv_len.data()});
  if (dropout > 0) ptrs.insert(ptrs.end(), {seed_offset.data(), seed_offset.data() + 4});
  if (biased) ptrs.push_back(bias.data());
  if (with_dbias) ptrs.push_back(dbias->data());
  execute(*bg, dev, ptrs, op);
  return true;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
