// Scaled dot-product attention: parameters, the optional padding lengths, the optional bias and
// boolean mask, and the results that forward hands to backward, shared by the CPU and CUDA
// backends (docs/ops/attention.md).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

#include "cutrain/core/error.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI {

// Where the causal diagonal sits when Sq != Skv: top_left (query i sees keys j <= i, as torch's
// is_causal) or bottom_right (query i sees keys j <= i + Skv - Sq: the last query sees every key,
// as when decoding with a cache; with padding lengths, per batch element from its lengths).
enum class CausalAlign { top_left, bottom_right };

inline const char* to_string(CausalAlign a) { return a == CausalAlign::top_left ? "top_left" : "bottom_right"; }

struct AttentionParams {
  bool causal = false;  // query i attends to keys j <= a_i, a_i its aligned position (align)
  CausalAlign align = CausalAlign::top_left;  // needs causal
  // A sliding window (needs causal): query i attends to keys a_i - window < j <= a_i; 0: none.
  std::int64_t window = 0;
  double scale = 0;     // multiplies Q Kᵀ; 0: 1 / sqrt(D)
  bool deterministic = false;  // the backward without atomics (cuDNN's deterministic engine)
  // Dropout on the attention probabilities: each p_ij is zeroed with probability `dropout` and
  // the rest scaled by 1 / (1 - dropout). The mask is a function of (seed, b, h, i, j): the
  // backward given the same parameters redraws the forward's. The CPU and the GPU's composed
  // path draw it from cutrain::uniform_at (the same mask on both); cuDNN from its Philox
  // generator (seed, offset 0): another mask of the same law. Pick a fresh seed per step.
  double dropout = 0;
  std::uint64_t seed = 0;
  // Logit soft-capping (Gemma 2's): the scaled scores s become softcap · tanh(s / softcap) before
  // the bias and the masks; 0: none.
  double softcap = 0;
  friend bool operator==(const AttentionParams&, const AttentionParams&) = default;
};

inline std::ostream& operator<<(std::ostream& os, const AttentionParams& p) {
  os << "{causal " << (p.causal ? "true" : "false");
  if (p.align != CausalAlign::top_left) os << " " << to_string(p.align);
  if (p.window > 0) os << ", window " << p.window;
  os << ", scale " << p.scale;
  if (p.softcap > 0) os << ", softcap " << p.softcap;
  if (p.dropout > 0) os << ", dropout " << p.dropout << " seed " << p.seed;
  return os << (p.deterministic ? ", deterministic" : "") << "}";
}

// Padding masks: int32 [B] tensors on q's device, or undefined (every position valid). Query
// rows i >= q[b] give zero output and zero gradients; keys j >= kv[b] are masked out. Values lie
// in [1, Sq] and [1, Skv].
struct AttentionLengths {
  Tensor<std::int32_t> q{}, kv{};
  bool any() const { return q.defined() || kv.defined(); }
  // Views of the same lengths (Tensors are not copied implicitly).
  AttentionLengths view() const {
    return {q.defined() ? q.view() : Tensor<std::int32_t>{}, kv.defined() ? kv.view() : Tensor<std::int32_t>{}};
  }
};

// An additive bias and a boolean mask of the scores, each [B or 1, H or 1, Sq, Skv] (broadcast
// over the batch and the query heads), on q's device, or undefined. bias: q's type, added after
// the scale and the soft-cap (ALiBi, relative positions, a -inf document mask); allowed: u8,
// nonzero where query i may attend to key j. A query row left with no key (every key masked,
// by allowed, a -inf bias, causal or padding) gives zero output and zero gradients.
template <class T>
struct AttentionMask {
  Tensor<T> bias{};
  Tensor<std::uint8_t> allowed{};
  bool any() const { return bias.defined() || allowed.defined(); }
  // Views of the same tensors (Tensors are not copied implicitly).
  AttentionMask view() const {
    return {bias.defined() ? bias.view() : Tensor<T>{}, allowed.defined() ? allowed.view() : Tensor<std::uint8_t>{}};
  }
};

// o: [B, H, Sq, Dv]; stats: [B, H, Sq], the log-sum-exp of each query row's scaled, masked
// scores (natural log), which the backward uses to rebuild the softmax. S is T on the CPU and
// float on the GPU. The statistic of a row with no key (padded, or every key masked) is
// unspecified.
// Which generator drew a forward's dropout mask: cutrain's (uniform_at: the CPU and the GPU's
// composed path) or cuDNN's Philox. The backward must draw the mask again with the same one, so
// with dropout it takes the forward's `mask` and refuses a path that would draw another.
enum class DropoutMask { none, cutrain, cudnn };

template <class T, class S = T>
struct AttentionForward {
  Tensor<T> o;
  Tensor<S> stats;
  DropoutMask mask = DropoutMask::none;
};

// The statistics' element type: f64 for f64 inputs (the CPU), else f32.
template <class T>
using AttentionStats = std::conditional_t<std::is_same_v<T, double>, double, float>;

// dbias: the bias's gradient, of the bias's shape (summed over its broadcast dims), where the
// backward was given a bias and asked for it; else undefined.
template <class T>
struct AttentionBackward {
  Tensor<T> dq, dk, dv, dbias{};
};

namespace detail {
// The scale an attention with head dim d uses.
inline double attention_scale(std::string_view op, const AttentionParams& p, std::int64_t d) {
  CUTRAIN_REQUIRE(std::isfinite(p.scale) && p.scale >= 0, InvalidArgument, op,
                  "scale must be finite and >= 0 (0: 1/sqrt(D)), got ", p.scale);
  return p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(d));
}

// The soft-cap, checked: finite and >= 0 (0: none).
inline double attention_softcap(std::string_view op, const AttentionParams& p) {
  CUTRAIN_REQUIRE(std::isfinite(p.softcap) && p.softcap >= 0, InvalidArgument, op,
                  "softcap must be finite and >= 0 (0: none), got ", p.softcap);
  return p.softcap;
}

// The window and the alignment, checked: both refine a causal mask.
inline void attention_check_band(std::string_view op, const AttentionParams& p) {
  CUTRAIN_REQUIRE(p.window >= 0, InvalidArgument, op, "window must be >= 0 (0: none), got ", p.window);
  CUTRAIN_REQUIRE(p.causal || (p.window == 0 && p.align == CausalAlign::top_left), InvalidArgument, op,
                  "a sliding window and the causal alignment take effect with causal = true, got ", p);
}

// The dropout probability, checked: [0, 1) (the negated test also rejects NaN).
inline double attention_dropout(std::string_view op, const AttentionParams& p) {
  CUTRAIN_REQUIRE(p.dropout >= 0.0 && p.dropout < 1.0, InvalidArgument, op, "dropout must be in [0, 1), got ",
                  p.dropout);
  return p.dropout;
}
}  // namespace detail

}  // namespace cutrain::inline CUTRAIN_ABI
