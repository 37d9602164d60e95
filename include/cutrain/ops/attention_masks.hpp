// Attention's bias and boolean mask (AttentionMask, core/params/attention.hpp): their checks, and
// how the GPU's fused path hands them to cuDNN's SDPA, which takes an additive bias but no
// boolean mask and gives no defined result for a row with no key left (docs/ops/attention.md).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>

#include "cutrain/core/check.hpp"
#include "cutrain/core/params/attention.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/cpu/attention.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/sum_to.hpp"

namespace cutrain::inline CUTRAIN_ABI::ops::detail {

// One of the mask's tensors, if given: [B or 1, H or 1, Sq, Skv] on dev.
template <class U>
void attention_mask_tensor(std::string_view op, const Tensor<U>& t, std::string_view name,
                           const cpu::detail::AttentionGeometry& g, Device dev) {
  if (!t.defined()) return;
  CUTRAIN_REQUIRE(t.rank() == 4 && (t.dim(0) == g.B || t.dim(0) == 1) && (t.dim(1) == g.H || t.dim(1) == 1) &&
                      t.dim(2) == g.Sq && t.dim(3) == g.Skv,
                  InvalidArgument, op, name, " must be [B or 1, H or 1, Sq, Skv] = [", g.B, " or 1, ", g.H, " or 1, ",
                  g.Sq, ", ", g.Skv, "] (q's B, H, Sq and k's Skv), got ", t.describe());
  CUTRAIN_REQUIRE(t.device() == dev, DeviceError, op, name, " is on ", t.device(), ", q on ", dev);
}

// The bias and the boolean mask, checked against the geometry; dbias (the backward asked for the
// bias's gradient) needs a bias.
template <class T>
void attention_check_masks(std::string_view op, const cpu::detail::AttentionGeometry& g, const AttentionMask<T>& m,
                           Device dev, bool dbias = false) {
  attention_mask_tensor(op, m.bias, "mask.bias", g, dev);
  attention_mask_tensor(op, m.allowed, "mask.allowed", g, dev);
  CUTRAIN_REQUIRE(!dbias || m.bias.defined(), InvalidArgument, op,
                  "the bias's gradient was asked for, but no mask.bias was given");
}

// Whether a query row can be left with no key: a bias (-inf) or a boolean mask can empty any
// row; bottom-right alignment or a window can where a row's diagonal passes the last key.
inline bool attention_rows_may_empty(const cpu::detail::AttentionGeometry& g, bool masks, bool lengths) {
  return masks || (g.causal && (g.bottom_right || g.window > 0) && (lengths || g.Sq > g.Skv));
}

// The bias's gradient at its own shape from the gradient of a (broadcast) bias of another shape.
template <class T>
Tensor<T> attention_dbias(const Tensor<T>& d, const Shape& bias_shape) {
  return d.shape() == bias_shape ? d.view() : ops::sum_to(d, bias_shape);
}

// What cuDNN's bias gets where the boolean mask drops a key: T's lowest finite value. A row
// whose every key is dropped then gets a statistic near it (or NaN where cuDNN's exponent
// overflows) and finite probabilities, never NaN gradients for the other rows' keys.
template <class T>
inline constexpr float attention_masked_value = std::is_same_v<T, half> ? -65504.0f : -3.38953139e38f;

// The additive bias cuDNN's SDPA takes for the masks: the bias where the boolean mask allows a
// key, T's lowest elsewhere ([broadcast shape], row-major); the bias itself without a boolean
// mask; undefined without either.
template <class T>
Tensor<T> attention_fused_bias(const AttentionMask<T>& m, Device dev) {
  if (!m.allowed.defined()) return m.bias.defined() ? m.bias.view() : Tensor<T>{};
  const Tensor<T> masked = Tensor<T>::full(Shape{1}, static_cast<T>(attention_masked_value<T>), {.device = dev});
  return ops::where(m.allowed, m.bias.defined() ? m.bias.view() : Tensor<T>::zeros(Shape{1}, {.device = dev}), masked);
}

// u8 [B, H, Sq, 1]: 1 where a row's statistic [B, H, Sq] shows a key left (finite and above half
// of T's masked value; a row with none has a statistic near it, -inf, +inf or NaN).
template <class T>
Tensor<std::uint8_t> attention_rows_with_keys(const Tensor<float>& stats) {
  const Device dev = stats.device();
  const Tensor<float> s = cutrain::reshape(stats.contiguous(Layout::row_major),
                                           Shape{stats.dim(0), stats.dim(1), stats.dim(2), 1});
  const auto scalar = [&](float x) { return Tensor<float>::full(Shape{1}, x, {.device = dev}); };
  // s - s is 0 where s is finite and NaN at ±inf; the floor's test sends NaN and low rows to NaN.
  const Tensor<float> y = ops::where(ops::gt(s, scalar(attention_masked_value<T> / 2)), ops::sub(s, s),
                                     scalar(std::numeric_limits<float>::quiet_NaN()));
  return ops::eq(y, scalar(0.0f));
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops::detail
