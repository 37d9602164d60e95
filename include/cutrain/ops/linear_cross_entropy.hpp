// linear_cross_entropy / linear_cross_entropy_scale_grads: the fused classifier (a linear layer
// without bias, then softmax cross-entropy), dispatched on the tensors' device. The logits never
// exist as a whole: a chunk of rows at a time, their gradient written over them (cpu/ and
// cuda/kernels/linear_cross_entropy.hpp).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string_view>

#include "cutrain/core/params/loss.hpp"
#include "cutrain/cpu/linear_cross_entropy.hpp"
#include "cutrain/ops/dispatch.hpp"
#include "cutrain/ops/index_convert.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/api.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
template <class T>
void check_linear_cross_entropy(std::string_view op, const Tensor<T>& x, const Tensor<T>& w,
                                const Tensor<std::int32_t>& labels, const LinearCrossEntropyParams& p) {
  check::rank(op, x, 2, "x");
  check::rank(op, w, 2, "w");
  const std::int64_t N = x.dim(0), C = x.dim(1), V = w.dim(0);
  CUTRAIN_REQUIRE(w.dim(1) == C, InvalidArgument, op, "x ", x.describe(), " has ", C, " features but w ",
                  w.describe(), " expects ", w.dim(1), " (x [N, C], w [V, C], labels [N])");
  CUTRAIN_REQUIRE(N > 0 && C > 0 && V > 0, InvalidArgument, op, "x ", x.describe(), " and w ", w.describe(),
                  " must have rows, features and classes");
  check::defined(op, labels, "labels");
  CUTRAIN_REQUIRE(labels.shape() == Shape{N}, InvalidArgument, op, "labels must have shape [N] = ", Shape{N},
                  " to match x ", x.describe(), ", got ", labels.describe());
  CUTRAIN_REQUIRE(p.reduction == Reduction::mean || p.reduction == Reduction::sum, InvalidArgument, op,
                  "unknown reduction ", static_cast<int>(p.reduction));
  CUTRAIN_REQUIRE(p.label_smoothing >= 0.0 && p.label_smoothing < 1.0, InvalidArgument, op,
                  "label_smoothing must be in [0, 1), got ", p.label_smoothing);
  CUTRAIN_REQUIRE(p.chunk_rows >= 0 && p.pad_to >= 0 && p.pad_to <= 4096, InvalidArgument, op,
                  "chunk_rows must be >= 0 (0: automatic) and pad_to in [0, 4096], got ", p.chunk_rows, " and ",
                  p.pad_to);
  CUTRAIN_REQUIRE(shape_fits(Shape{V + std::max<std::int64_t>(p.pad_to, 1), C}, sizeof(T)), InvalidArgument, op,
                  "w ", w.describe(), " is too large: its byte count overflows int64");
  // Labels index the logits. Under CUDA graph capture the host cannot read them; the kernel then
  // turns a bad label into a NaN loss.
  if (!labels.device().is_cpu() && cutrain::detail::device_capturing()) return;
  const auto lab = labels.to_vector();
  for (std::size_t i = 0; i < lab.size(); ++i)
    CUTRAIN_REQUIRE(lab[i] == p.ignore_index || (lab[i] >= 0 && lab[i] < V), InvalidArgument, op, "label ", lab[i],
                    " at index ", i, " is out of range [0, ", V, ") and is not ignore_index ", p.ignore_index,
                    " for w ", w.describe());
}
}  // namespace detail

// The loss (shape {}, f32; f64 for f64 inputs) of softmax cross-entropy of x w^T against labels;
// with grads, also dx [N, C] and dw [V, C] (dw in the loss's type) for an upstream gradient of 1.
// x [N, C] and w [V, C] in one dtype; labels [N] int32, each in [0, V) or p.ignore_index.
template <class T>
LinearCrossEntropyResult<T> linear_cross_entropy(const Tensor<T>& x, const Tensor<T>& w,
                                                 const Tensor<std::int32_t>& labels,
                                                 const LinearCrossEntropyParams& p = {}, bool grads = false) {
  constexpr std::string_view op = "linear_cross_entropy";
  detail::check_linear_cross_entropy(op, x, w, labels, p);
  return detail::dispatch<LinearCrossEntropyResult<T>>(
      op, [&](const auto& x, const auto& w, const auto& labels) { return cpu::linear_cross_entropy(x, w, labels, p, grads); },
      CUTRAIN_IF_CUDA([&](const auto& x, const auto& w, const auto& labels) {
        return cuda::kernels::linear_cross_entropy(x, w, labels, p, grads);
      }),
      x, w, labels);
}

// The gradients of linear_cross_entropy scaled by dloss, a one-element tensor on their device (the
// upstream gradient of the loss: read there, so a backward pass needs no copy to the host).
template <class T>
void linear_cross_entropy_scale_grads(const Tensor<loss_float_t<T>>& dloss, Tensor<T>& dx,
                                      Tensor<loss_float_t<T>>& dw) {
  constexpr std::string_view op = "linear_cross_entropy_backward";
  check::defined(op, dloss, "dloss");
  CUTRAIN_REQUIRE(dloss.numel() == 1 && dloss.device() == dx.device() && dx.device() == dw.device(), InvalidArgument,
                  op, "dloss must be one element on the device of dx ", dx.describe(), " and dw ", dw.describe(),
                  ", got ", dloss.describe());
  detail::dispatch<int>(
      op,
      [&](const auto& dx_, const auto&) {
        const double s = static_cast<double>(dloss.to_vector()[0]);
        Tensor<T> sx = dx_.clone();
        Tensor<loss_float_t<T>> sw = dw.clone();
        for (std::int64_t i = 0; i < sx.numel(); ++i) sx.data()[i] = static_cast<T>(s * static_cast<double>(sx.data()[i]));
        for (std::int64_t i = 0; i < sw.numel(); ++i) sw.data()[i] = static_cast<loss_float_t<T>>(s * sw.data()[i]);
        dx = std::move(sx);
        dw = std::move(sw);
        return 0;
      },
      CUTRAIN_IF_CUDA([&](const auto&, const auto&) {
        if constexpr (cuda::GpuFloat<T>) cuda::kernels::scale_classifier_grads(dloss, dx, dw);
        return 0;
      }),
      dx, dw);
}

// The same with int64 labels (PyTorch's), converted to int32 on their device first
// (ops/index_convert.hpp); ignore_index keeps its meaning.
template <class T>
LinearCrossEntropyResult<T> linear_cross_entropy(const Tensor<T>& x, const Tensor<T>& w,
                                                 const Tensor<std::int64_t>& labels,
                                                 const LinearCrossEntropyParams& p = {}, bool grads = false) {
  return linear_cross_entropy(x, w, detail::labels_as_i32("linear_cross_entropy", labels, p.ignore_index), p, grads);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
