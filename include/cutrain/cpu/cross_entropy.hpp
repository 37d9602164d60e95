// Softmax cross-entropy from logits [N, C] and integer labels [N], with label smoothing, on the CPU.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>

#include "cutrain/core/params/loss.hpp"
#include "cutrain/cpu/softmax.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

// Target q = (1 - eps) onehot(label) + eps / C; loss_i = -sum_c q_c log_softmax(x)_ic;
// the result has shape {} (one element): the sum over i, divided by N for the mean.
template <CpuFloat T>
Tensor<T> cross_entropy_forward(const Tensor<T>& logits, const Tensor<std::int32_t>& labels,
                                const CrossEntropyParams& p) {
  const auto N = logits.dim(0), C = logits.dim(1);
  const Tensor<T> logp = log_softmax_forward(logits);
  const auto lab = labels.to_vector();
  const double eps = p.label_smoothing;
  // Summed in double: a float sum over a large batch would lose digits the oracle should keep.
  double total = 0;
  for (std::int64_t i = 0; i < N; ++i) {
    const T* lr = logp.data() + i * C;
    double row_sum = 0;
    for (std::int64_t c = 0; c < C; ++c) row_sum += static_cast<double>(lr[c]);
    const double picked = static_cast<double>(lr[lab[static_cast<std::size_t>(i)]]);
    total -= (1 - eps) * picked + eps / static_cast<double>(C) * row_sum;
  }
  if (p.reduction == Reduction::mean) total /= static_cast<double>(N);
  Tensor<T> loss(Shape{});
  loss.data()[0] = static_cast<T>(total);
  return loss;
}

// dlogits = (softmax(logits) - q) * dloss, divided by N for the mean.
template <CpuFloat T>
Tensor<T> cross_entropy_backward(const Tensor<T>& logits, const Tensor<std::int32_t>& labels, T dloss,
                                 const CrossEntropyParams& p) {
  const auto N = logits.dim(0), C = logits.dim(1);
  Tensor<T> d = softmax_forward(logits);
  const auto lab = labels.to_vector();
  const T eps = static_cast<T>(p.label_smoothing);
  const T off = eps / static_cast<T>(C);
  const T scale = p.reduction == Reduction::mean ? dloss / static_cast<T>(N) : dloss;
  for (std::int64_t i = 0; i < N; ++i) {
    T* dr = d.data() + i * C;
    for (std::int64_t c = 0; c < C; ++c) dr[c] -= off;
    dr[lab[static_cast<std::size_t>(i)]] -= T(1) - eps;
    for (std::int64_t c = 0; c < C; ++c) dr[c] *= scale;
  }
  return d;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
