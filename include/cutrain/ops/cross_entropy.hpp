// cross_entropy_forward / cross_entropy_backward (softmax + NLL from logits): dispatch on device.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <type_traits>

#include "cutrain/cpu/cross_entropy.hpp"
#include "cutrain/ops/dispatch.hpp"
#include "cutrain/ops/index_convert.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/cross_entropy.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
template <class T>
void check_cross_entropy(std::string_view op, const Tensor<T>& logits, const Tensor<std::int32_t>& labels,
                         const CrossEntropyParams& p) {
  check::rank(op, logits, 2, "logits");
  const auto N = logits.dim(0), C = logits.dim(1);
  CUTRAIN_REQUIRE(C > 0, InvalidArgument, op, "logits ", logits.describe(), " has no classes (C == 0)");
  check::defined(op, labels, "labels");
  CUTRAIN_REQUIRE(labels.shape() == Shape{N}, InvalidArgument, op, "labels must have shape [N] = ", Shape{N},
                  " to match logits ", logits.describe(), ", got ", labels.describe());
  CUTRAIN_REQUIRE(p.reduction == Reduction::mean || p.reduction == Reduction::sum, InvalidArgument, op,
                  "unknown reduction ", static_cast<int>(p.reduction));
  CUTRAIN_REQUIRE(p.reduction != Reduction::mean || N > 0, InvalidArgument, op,
                  "the mean over an empty batch is undefined: logits ", logits.describe());
  CUTRAIN_REQUIRE(p.label_smoothing >= 0.0 && p.label_smoothing < 1.0, InvalidArgument, op,
                  "label_smoothing must be in [0, 1), got ", p.label_smoothing);
  // Labels index the logits: an out-of-range one would read outside the row. Under CUDA graph
  // capture the host cannot read them; the kernel then turns a bad label into a NaN loss.
  if (!labels.device().is_cpu() && cutrain::detail::device_capturing()) return;
  const auto lab = labels.to_vector();
  for (std::size_t i = 0; i < lab.size(); ++i)
    CUTRAIN_REQUIRE(lab[i] >= 0 && lab[i] < C, InvalidArgument, op, "label ", lab[i], " at index ", i,
                    " is out of range [0, ", C, ") for logits ", logits.describe());
}
}  // namespace detail

// The loss, a tensor of shape {} (rank 0, one element).
template <class T>
Tensor<T> cross_entropy_forward(const Tensor<T>& logits, const Tensor<std::int32_t>& labels,
                                const CrossEntropyParams& p = {}) {
  constexpr std::string_view op = "cross_entropy_forward";
  detail::check_cross_entropy(op, logits, labels, p);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& logits, const auto& labels) { return cpu::cross_entropy_forward(logits, labels, p); },
      CUTRAIN_IF_CUDA([&](const auto& logits, const auto& labels) {
        Tensor<T> loss = detail::device_output<T>(Shape{}, logits);
        cuda::kernels::cross_entropy_forward(logits, labels, p, loss);
        return loss;
      }),
      logits, labels);
}

// dlogits [N, C] for an upstream gradient dloss of the scalar loss. T is deduced from the logits
// only, so a double literal works as dloss for float logits.
template <class T>
Tensor<T> cross_entropy_backward(const Tensor<T>& logits, const Tensor<std::int32_t>& labels,
                                 std::type_identity_t<T> dloss, const CrossEntropyParams& p = {}) {
  constexpr std::string_view op = "cross_entropy_backward";
  detail::check_cross_entropy(op, logits, labels, p);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& logits, const auto& labels) { return cpu::cross_entropy_backward(logits, labels, dloss, p); },
      CUTRAIN_IF_CUDA([&](const auto& logits, const auto& labels) {
        // Recomputes the softmax from the logits (the forward keeps no state).
        Tensor<T> dlogits = detail::device_output<T>(logits.shape(), logits);
        cuda::kernels::cross_entropy_backward(logits, labels, static_cast<double>(dloss), p, dlogits);
        return dlogits;
      }),
      logits, labels);
}

// The same with dloss as a one-element tensor on the logits' device: on the GPU the kernel reads
// it there, so backward needs no copy to the host (and can be captured in a CUDA graph).
template <class T>
Tensor<T> cross_entropy_backward(const Tensor<T>& logits, const Tensor<std::int32_t>& labels, const Tensor<T>& dloss,
                                 const CrossEntropyParams& p = {}) {
  constexpr std::string_view op = "cross_entropy_backward";
  check::defined(op, dloss, "dloss");
  CUTRAIN_REQUIRE(dloss.numel() == 1 && dloss.device() == logits.device(), InvalidArgument, op,
                  "dloss must be one element on the device of logits ", logits.describe(), ", got ", dloss.describe());
  detail::check_cross_entropy(op, logits, labels, p);
  return detail::dispatch<Tensor<T>>(
      op,
      [&](const auto& logits, const auto& labels) {
        return cpu::cross_entropy_backward(logits, labels, dloss.to_vector()[0], p);
      },
      CUTRAIN_IF_CUDA([&](const auto& logits, const auto& labels) {
        Tensor<T> dlogits = detail::device_output<T>(logits.shape(), logits);
        cuda::kernels::cross_entropy_backward(logits, labels, dloss, p, dlogits);
        return dlogits;
      }),
      logits, labels);
}

// The same with int64 labels (PyTorch's): converted to int32 on their device first
// (ops/index_convert.hpp; a label past int32 is out of range anyway).
template <class T>
Tensor<T> cross_entropy_forward(const Tensor<T>& logits, const Tensor<std::int64_t>& labels,
                                const CrossEntropyParams& p = {}) {
  return cross_entropy_forward(logits, detail::labels_as_i32("cross_entropy_forward", labels), p);
}
template <class T>
Tensor<T> cross_entropy_backward(const Tensor<T>& logits, const Tensor<std::int64_t>& labels,
                                 std::type_identity_t<T> dloss, const CrossEntropyParams& p = {}) {
  return cross_entropy_backward(logits, detail::labels_as_i32("cross_entropy_backward", labels), dloss, p);
}
template <class T>
Tensor<T> cross_entropy_backward(const Tensor<T>& logits, const Tensor<std::int64_t>& labels, const Tensor<T>& dloss,
                                 const CrossEntropyParams& p = {}) {
  return cross_entropy_backward(logits, detail::labels_as_i32("cross_entropy_backward", labels), dloss, p);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
