// scaled_dot_product_attention forward and backward: validate, then dispatch on the tensors'
// device. CPU: cpu/attention.hpp. GPU: cuDNN's fused SDPA (cuda/cudnn/attention.hpp) in bf16 and
// f16, else (f32, soft-capping, or a signature cuDNN has no engine for) the composition of
// matmuls in ops/attention_composed.hpp. Bias and boolean mask: ops/attention_masks.hpp.
// docs/ops/attention.md.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

#include "cutrain/core/check.hpp"
#include "cutrain/core/params/attention.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/cpu/attention.hpp"
#include "cutrain/ops/attention_composed.hpp"
#include "cutrain/ops/attention_masks.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/api.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// One padding length tensor: int32 [B] on q's device, values in [1, limit]; read to the host.
inline std::vector<std::int32_t> attention_lengths(std::string_view op, const Tensor<std::int32_t>& len,
                                                   std::string_view name, std::int64_t b, std::int64_t limit,
                                                   Device dev) {
  if (!len.defined()) return {};
  CUTRAIN_REQUIRE(len.rank() == 1 && len.dim(0) == b, InvalidArgument, op, name, " must be int32 [", b,
                  "] (one length per batch element), got ", len.describe());
  CUTRAIN_REQUIRE(len.device() == dev, DeviceError, op, name, " is on ", len.device(), ", q on ", dev);
  std::vector<std::int32_t> v = len.to_vector();
  for (std::size_t i = 0; i < v.size(); ++i)
    CUTRAIN_REQUIRE(v[i] >= 1 && v[i] <= limit, InvalidArgument, op, name, "[", i, "] = ", v[i],
                    " is outside [1, ", limit, "]");
  return v;
}

// Checks q [B, H, Sq, D], k [B, Hk, Skv, D], v [B, Hk, Skv, Dv] (H a multiple of Hk), the
// parameters and the lengths; returns the geometry the backends take.
template <class T>
cpu::detail::AttentionGeometry attention_geometry(std::string_view op, const Tensor<T>& q, const Tensor<T>& k,
                                                  const Tensor<T>& v, const AttentionParams& p,
                                                  const AttentionLengths& lens) {
  check::rank(op, q, 4, "q [B, H, Sq, D]");
  check::rank(op, k, 4, "k [B, Hk, Skv, D]");
  check::rank(op, v, 4, "v [B, Hk, Skv, Dv]");
  check::non_empty(op, q, "q");
  check::non_empty(op, k, "k");
  check::non_empty(op, v, "v");
  const Device dev = check::same_device(op, q, k, v);
  cpu::detail::AttentionGeometry g;
  g.B = q.dim(0), g.H = q.dim(1), g.Sq = q.dim(2), g.D = q.dim(3);
  g.Hk = k.dim(1), g.Skv = k.dim(2), g.Dv = v.dim(3);
  CUTRAIN_REQUIRE(k.dim(0) == g.B && k.dim(3) == g.D, InvalidArgument, op, "k ", k.describe(),
                  " must be [B, Hk, Skv, D] with q's B and D (q ", q.describe(), ")");
  CUTRAIN_REQUIRE(v.dim(0) == g.B && v.dim(1) == g.Hk && v.dim(2) == g.Skv, InvalidArgument, op, "v ", v.describe(),
                  " must be [B, Hk, Skv, Dv] with k's B, Hk and Skv (k ", k.describe(), ")");
  CUTRAIN_REQUIRE(g.H % g.Hk == 0, InvalidArgument, op, "q's ", g.H, " heads must be a multiple of k's and v's ", g.Hk,
                  " (q ", q.describe(), ", k ", k.describe(), ")");
  g.scale = cutrain::detail::attention_scale(op, p, g.D);
  g.causal = p.causal;
  cutrain::detail::attention_check_band(op, p);
  g.bottom_right = p.align == CausalAlign::bottom_right;
  g.window = p.window;
  g.softcap = cutrain::detail::attention_softcap(op, p);
  g.dropout = cutrain::detail::attention_dropout(op, p);
  g.seed = p.seed;
  g.q_len = attention_lengths(op, lens.q, "lengths.q", g.B, g.Sq, dev);
  g.kv_len = attention_lengths(op, lens.kv, "lengths.kv", g.B, g.Skv, dev);
  return g;
}

// With dropout the backward takes the forward's mask source: the generator that drew it must draw
// it again (cuDNN's only on the GPU's fused path; cutrain's on the CPU and the composed path).
inline void attention_check_mask(std::string_view op, const cpu::detail::AttentionGeometry& g, DropoutMask mask,
                                 Device dev) {
  if (g.dropout == 0) return;
  CUTRAIN_REQUIRE(mask != DropoutMask::none, InvalidArgument, op, "with dropout ", g.dropout,
                  " the backward needs the forward's AttentionForward::mask (which generator drew the mask)");
  CUTRAIN_REQUIRE(mask == DropoutMask::cutrain || dev.is_cuda(), InvalidArgument, op,
                  "the forward's dropout mask was drawn by cuDNN on the GPU; the backward on ", dev,
                  " cannot draw it again");
}

#ifdef CUTRAIN_WITH_CUDA
inline cuda::cudnn::AttentionBand attention_band(const cpu::detail::AttentionGeometry& g) {
  return {.causal = g.causal, .bottom_right = g.bottom_right, .window = g.window};
}

// t as cuDNN's SDPA takes it: last stride 1, the others multiples of 8 elements, 16-byte aligned
// data (a view where t is one, else a row-major copy).
template <class T>
bool attention_suits(const Tensor<T>& t) {
  bool ok = t.strides()[3] == 1 && reinterpret_cast<std::uintptr_t>(t.data()) % 16 == 0;
  for (int d = 0; d < 3; ++d) ok = ok && (t.dim(d) == 1 || t.strides()[d] % 8 == 0);
  return ok;
}

template <class T>
Tensor<T> attention_operand(const Tensor<T>& t) {
  return attention_suits(t) ? t.view() : contiguous_aligned(t, Layout::row_major);
}

// A new [B, heads, S, last] tensor laid out as like is: [B, S, heads, last] in memory (seen
// through a permute) when like is, else row-major.
template <class T>
Tensor<T> attention_like(const Tensor<T>& like, std::int64_t last) {
  const std::int64_t b = like.dim(0), h = like.dim(1), s = like.dim(2);
  if (h > 1 && s > 1 && like.strides()[1] < like.strides()[2])
    return cutrain::permute(Tensor<T>(Shape{b, s, h, last}, {.device = like.device()}), {0, 2, 1, 3});
  return Tensor<T>(Shape{b, h, s, last}, {.device = like.device()});
}

// u8 [B, 1, S, 1] on dev: 1 where position i < len[b]. cuDNN leaves the padded rows of o, dq and
// of dk, dv (keys past kv_len) unspecified; the op's promise is zeros there.
inline Tensor<std::uint8_t> attention_valid(const std::vector<std::int32_t>& len, std::int64_t b, std::int64_t s,
                                            Device dev) {
  std::vector<std::uint8_t> v(static_cast<std::size_t>(b * s), 0);
  for (std::int64_t i = 0; i < b; ++i)
    for (std::int64_t j = 0; j < len[static_cast<std::size_t>(i)]; ++j) v[static_cast<std::size_t>(i * s + j)] = 1;
  return Tensor<std::uint8_t>::from_vector(v, Shape{b, 1, s, 1}).to(dev);
}

template <class T>
Tensor<T> attention_zero_padded(const Tensor<T>& t, const std::vector<std::int32_t>& len) {
  if (len.empty()) return t.view();
  return ops::where(attention_valid(len, t.dim(0), t.dim(2), t.device()), t, Tensor<T>::zeros(Shape{1}, {.device = t.device()}));
}

// Both lengths on the device for cuDNN (which takes both or neither): a missing one is full.
struct DeviceLengths {
  Tensor<std::int32_t> q, kv;
};
inline DeviceLengths attention_device_lengths(const cpu::detail::AttentionGeometry& g, const AttentionLengths& lens,
                                              Device dev) {
  if (!lens.any()) return {};
  const auto full = [&](std::int64_t s) {
    return Tensor<std::int32_t>::full(Shape{g.B}, static_cast<std::int32_t>(s), {.device = dev});
  };
  return {lens.q.defined() ? contiguous_aligned(lens.q, Layout::row_major) : full(g.Sq),
          lens.kv.defined() ? contiguous_aligned(lens.kv, Layout::row_major) : full(g.Skv)};
}
// Dropout's Philox seed and offset for cuDNN: int32 [8] on dev, seed at 0 and offset at 4
// (undefined without dropout).
// Copied from the host, so not inside a CUDA-graph capture.
inline Tensor<std::int32_t> attention_seed_offset(std::string_view op, const cpu::detail::AttentionGeometry& g,
                                                  Device dev) {
  if (g.dropout == 0) return {};
  CUTRAIN_REQUIRE(!cutrain::detail::device_capturing(), InvalidArgument, op,
                  "attention dropout copies its seed from the host and cannot be captured in a CUDA graph (dropout ",
                  g.dropout, "); capture with dropout 0");
  const auto seed = static_cast<std::int32_t>(static_cast<std::uint32_t>(splitmix64(g.seed)));
  // The seed at [0] and the offset (0) at [4]: each 16-byte aligned, as cuDNN's tensors are.
  return Tensor<std::int32_t>::from_vector({seed, 0, 0, 0, 0, 0, 0, 0}, Shape{8}).to(dev);
}

// The forward on cuDNN's SDPA (bf16, f16): false where it has no engine, and with a soft-cap
// (cuDNN takes one only as a score modifier, which excludes its masks). rng_dump, if given,
// receives cuDNN's dropout keep mask [B, H, Sq, Skv] (the GPU tests hand it to the CPU). Where a
// row may be left with no key the statistics are computed (stats or not) to find and zero it.
template <class T>
bool attention_forward_cudnn(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                             const cpu::detail::AttentionGeometry& g, const AttentionLengths& lens,
                             const AttentionMask<T>& masks, AttentionForward<T, float>& r,
                             Tensor<float>* rng_dump = nullptr, bool stats = true) {
  if (g.softcap > 0) return false;
  const bool may_empty = attention_rows_may_empty(g, masks.any(), lens.any());
  stats = stats || may_empty;
  const DeviceLengths dl = attention_device_lengths(g, lens, q.device());
  const Tensor<std::int32_t> seed = attention_seed_offset("scaled_dot_product_attention", g, q.device());
  const Tensor<T> bias = attention_fused_bias(masks, q.device());
  r = {attention_like(q, g.Dv), stats ? Tensor<float>(Shape{g.B, g.H, g.Sq}, {.device = q.device()}) : Tensor<float>()};
  if (!cuda::cudnn::attention_forward(attention_operand(q), attention_operand(k), attention_operand(v), dl.q, dl.kv,
                                      bias.defined() ? attention_operand(bias) : Tensor<T>{}, g.scale,
                                      attention_band(g), g.dropout, seed, r.o, r.stats, rng_dump))
    return false;
  r.o = attention_zero_padded(r.o, g.q_len);
  if (may_empty)
    r.o = ops::where(attention_rows_with_keys<T>(r.stats), r.o, Tensor<T>::zeros(Shape{1}, {.device = q.device()}));
  return true;
}

// The backward on cuDNN's SDPA (bf16, f16) into r (dq, dk, dv laid out as q, k, v; dbias where
// asked): false where it has no engine, or with a soft-cap. Rows with no key get the statistic
// +inf (so p = 0 there: no gradient) and o zero.
template <class T>
bool attention_backward_cudnn(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& o,
                              const Tensor<T>& dout, const Tensor<float>& stats,
                              const cpu::detail::AttentionGeometry& g, const AttentionLengths& lens,
                              const AttentionMask<T>& masks, bool deterministic, bool dbias, AttentionBackward<T>& r) {
  constexpr std::string_view op = "scaled_dot_product_attention_backward";
  if (g.softcap > 0) return false;
  const Device dev = q.device();
  const DeviceLengths dl = attention_device_lengths(g, lens, dev);
  const Tensor<std::int32_t> seed = attention_seed_offset(op, g, dev);
  const Tensor<T> bias = attention_fused_bias(masks, dev);
  Tensor<float> st = contiguous_aligned(stats, Layout::row_major);
  Tensor<T> oo = o.view();
  if (attention_rows_may_empty(g, masks.any(), lens.any())) {
    const Tensor<std::uint8_t> rows = attention_rows_with_keys<T>(stats);
    const Tensor<float> inf = Tensor<float>::full(Shape{1}, std::numeric_limits<float>::infinity(), {.device = dev});
    st = cutrain::reshape(ops::where(rows, cutrain::reshape(st, Shape{g.B, g.H, g.Sq, 1}), inf), Shape{g.B, g.H, g.Sq});
    oo = ops::where(rows, o, Tensor<T>::zeros(Shape{1}, {.device = dev}));
  }
  r = {attention_like(q, g.D), attention_like(k, g.D), attention_like(v, g.Dv)};
  const bool with_dbias = dbias && masks.bias.defined();
  Tensor<T> dfb = with_dbias ? Tensor<T>(bias.shape(), {.device = dev}) : Tensor<T>{};
  if (!cuda::cudnn::attention_backward(attention_operand(q), attention_operand(k), attention_operand(v),
                                       attention_operand(oo), attention_operand(dout), st, dl.q, dl.kv,
                                       bias.defined() ? attention_operand(bias) : Tensor<T>{}, g.scale,
                                       attention_band(g), deterministic, g.dropout, seed, r.dq, r.dk, r.dv,
                                       with_dbias ? &dfb : nullptr))
    return false;
  r.dq = attention_zero_padded(r.dq, g.q_len);
  r.dk = attention_zero_padded(r.dk, g.kv_len);
  r.dv = attention_zero_padded(r.dv, g.kv_len);
  if (with_dbias) r.dbias = attention_dbias(dfb, masks.bias.shape());
  return true;
}
#endif
}  // namespace detail

// softmax(scale q kᵀ + mask) v over q [B, H, Sq, D], k [B, Hk, Skv, D], v [B, Hk, Skv, Dv]
// (H a multiple of Hk: grouped-query attention), any strides. Returns o [B, H, Sq, Dv] (on the
// GPU laid out as q is: [B, S, H, D] in memory for a permuted [B, S, H, D] q) and the log-sum-exp
// statistics [B, H, Sq] the backward takes (f32 on the GPU). Masks: p.causal, and padding
// lengths (read to the host to check them: not inside a CUDA-graph capture), p.window, and the
// bias and boolean mask `masks` (AttentionMask). Soft-capping: p.softcap. Dropout on the
// probabilities: p.dropout, p.seed (AttentionParams; not inside a capture either).
template <class T>
AttentionForward<T, AttentionStats<T>> scaled_dot_product_attention_forward(const Tensor<T>& q, const Tensor<T>& k,
                                                                            const Tensor<T>& v,
                                                                            const AttentionParams& p = {},
                                                                            const AttentionLengths& lens = {},
                                                                            const AttentionMask<T>& masks = {}) {
  constexpr std::string_view op = "scaled_dot_product_attention";
  const cpu::detail::AttentionGeometry g = detail::attention_geometry(op, q, k, v, p, lens);
  detail::attention_check_masks(op, g, masks, q.device());
  const DropoutMask drawn_here = g.dropout > 0 ? DropoutMask::cutrain : DropoutMask::none;
  return detail::dispatch<AttentionForward<T, AttentionStats<T>>>(
      op,
      [&](const auto& q, const auto& k, const auto& v) {
        auto r = cpu::attention_forward(q, k, v, g, masks);
        r.mask = drawn_here;
        return r;
      },
      CUTRAIN_IF_CUDA([&](const auto& q, const auto& k, const auto& v) -> AttentionForward<T, float> {
        if constexpr (!std::is_same_v<T, float>) {
          AttentionForward<T, float> r;
          if (detail::attention_forward_cudnn(q, k, v, g, lens, masks, r)) {
            r.mask = g.dropout > 0 ? DropoutMask::cudnn : DropoutMask::none;
            return r;
          }
        }
        auto r = detail::attention_forward_composed(q, k, v, g, masks);
        r.mask = drawn_here;
        return r;
      }),
      q, k, v);
}

// o of scaled_dot_product_attention_forward without the statistics, for inference (no
// backward, no dropout: InvalidArgument): cuDNN's SDPA graph without its stats output in bf16 and
// f16 on the GPU; elsewhere the forward's o.
template <class T>
Tensor<T> scaled_dot_product_attention_inference(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                 const AttentionParams& p = {}, const AttentionLengths& lens = {},
                                                 const AttentionMask<T>& masks = {}) {
  CUTRAIN_REQUIRE(p.dropout == 0, InvalidArgument, "scaled_dot_product_attention_inference",
                  "inference takes no dropout, got ", p);
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double>) {
    if (q.defined() && q.device().is_cuda()) {
      constexpr std::string_view op = "scaled_dot_product_attention_inference";
      const cpu::detail::AttentionGeometry g = detail::attention_geometry(op, q, k, v, p, lens);
      detail::attention_check_masks(op, g, masks, q.device());
      AttentionForward<T, float> r;
      bool ran = false;
      {
        profile::OpScope timed("scaled_dot_product_attention", q.device());
        ran = detail::attention_forward_cudnn(q, k, v, g, lens, masks, r, nullptr, false);
      }
      if (ran) return std::move(r.o);
    }
  }
#endif
  return scaled_dot_product_attention_forward(q, k, v, p, lens, masks).o;
}

// dq, dk, dv (q's, k's and v's shapes; on the GPU laid out as they are) from the forward's o and
// stats, the output gradient dout, and the forward's parameters, lengths and masks; with dropout
// also the forward's `mask` (AttentionForward::mask), so that the same generator redraws it.
// dbias: also the bias's gradient (AttentionBackward::dbias, the bias's shape; needs masks.bias).
template <class T>
AttentionBackward<T> scaled_dot_product_attention_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                           const Tensor<T>& o, const Tensor<T>& dout,
                                                           const Tensor<AttentionStats<T>>& stats,
                                                           const AttentionParams& p = {},
                                                           const AttentionLengths& lens = {},
                                                           DropoutMask mask = DropoutMask::none,
                                                           const AttentionMask<T>& masks = {}, bool dbias = false) {
  constexpr std::string_view op = "scaled_dot_product_attention_backward";
  const cpu::detail::AttentionGeometry g = detail::attention_geometry(op, q, k, v, p, lens);
  detail::attention_check_masks(op, g, masks, q.device(), dbias);
  check::shape(op, o, Shape{g.B, g.H, g.Sq, g.Dv}, "o");
  check::shape(op, dout, Shape{g.B, g.H, g.Sq, g.Dv}, "dout");
  check::shape(op, stats, Shape{g.B, g.H, g.Sq}, "stats");
  detail::attention_check_mask(op, g, mask, q.device());
  return detail::dispatch<AttentionBackward<T>>(
      op,
      [&](const auto& q, const auto& k, const auto& v, const auto& o, const auto& dout, const auto& stats) {
        return cpu::attention_backward(q, k, v, o, dout, stats, g, masks, dbias);
      },
      CUTRAIN_IF_CUDA([&](const auto& q, const auto& k, const auto& v, const auto& o, const auto& dout,
                          const auto& stats) -> AttentionBackward<T> {
        if constexpr (!std::is_same_v<T, float>) {
          if (mask == DropoutMask::cutrain)
            return detail::attention_backward_composed(q, k, v, o, dout, stats, g, masks, dbias);
          AttentionBackward<T> r;
          if (detail::attention_backward_cudnn(q, k, v, o, dout, stats, g, lens, masks, p.deterministic, dbias, r))
            return r;
        }
        CUTRAIN_REQUIRE(mask != DropoutMask::cudnn, NotImplemented, op,
                        "cuDNN drew the forward's dropout mask but has no backward engine for this signature (q ",
                        q.describe(), ", ", p, "); the composed backward would draw another mask");
        return detail::attention_backward_composed(q, k, v, o, dout, stats, g, masks, dbias);
      }),
      q, k, v, o, dout, stats);
}

// The backward written into `into`: views of q's, k's and v's shapes on their device, any strides
// (a fused QKV projection's gradient seen as three heads, say). On the GPU cuDNN's SDPA writes
// them in place where it takes them as they are (bf16, f16, no padding lengths, no soft-cap,
// strides as attention_operand's); otherwise the gradients are computed as above and copied in.
template <class T>
void scaled_dot_product_attention_backward_into(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                                const Tensor<T>& o, const Tensor<T>& dout,
                                                const Tensor<AttentionStats<T>>& stats, const AttentionParams& p,
                                                const AttentionLengths& lens, DropoutMask mask,
                                                AttentionBackward<T>& into) {
  constexpr std::string_view op = "scaled_dot_product_attention_backward";
  const profile::OpScope timed(op, q.device());  // it reaches cuDNN without dispatch
  check::shape(op, into.dq, q.shape(), "into.dq");
  check::shape(op, into.dk, k.shape(), "into.dk");
  check::shape(op, into.dv, v.shape(), "into.dv");
  (void)check::same_device(op, q, into.dq, into.dk, into.dv);
#ifdef CUTRAIN_WITH_CUDA
  if constexpr (!std::is_same_v<T, float> && !std::is_same_v<T, double>) {
    if (q.device().is_cuda() && !lens.any() && mask != DropoutMask::cutrain && detail::attention_suits(into.dq) &&
        detail::attention_suits(into.dk) && detail::attention_suits(into.dv)) {
      const cpu::detail::AttentionGeometry g = detail::attention_geometry(op, q, k, v, p, lens);
      check::shape(op, o, Shape{g.B, g.H, g.Sq, g.Dv}, "o");
      check::shape(op, dout, Shape{g.B, g.H, g.Sq, g.Dv}, "dout");
      check::shape(op, stats, Shape{g.B, g.H, g.Sq}, "stats");
      (void)check::same_device(op, q, k, v, o, dout, stats);
      detail::attention_check_mask(op, g, mask, q.device());
      const Tensor<std::int32_t> seed = detail::attention_seed_offset(op, g, q.device());
      // No soft-cap, and no row left without a key (whose statistic the backward would have to fix).
      if (g.softcap == 0 && !detail::attention_rows_may_empty(g, false, false) &&
          cuda::cudnn::attention_backward(detail::attention_operand(q), detail::attention_operand(k),
                                          detail::attention_operand(v), detail::attention_operand(o),
                                          detail::attention_operand(dout),
                                          detail::contiguous_aligned(stats, Layout::row_major), {}, {}, {}, g.scale,
                                          detail::attention_band(g), p.deterministic, g.dropout, seed, into.dq,
                                          into.dk, into.dv)) {
        into.dq.bump_version();
        into.dk.bump_version();
        into.dv.bump_version();
        return;
      }
    }
  }
#endif
  AttentionBackward<T> r = scaled_dot_product_attention_backward(q, k, v, o, dout, stats, p, lens, mask);
  into.dq.copy_from(r.dq);
  into.dk.copy_from(r.dk);
  into.dv.copy_from(r.dv);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
