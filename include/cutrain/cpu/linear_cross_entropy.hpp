// The fused classifier on the CPU: softmax cross-entropy of x w^T against labels, and, when asked,
// its gradients with respect to x and w, a chunk of rows of logits at a time (never all of them).
// The reference the GPU's fused classifier is tested against.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "cutrain/core/params/loss.hpp"
#include "cutrain/cpu/common.hpp"

namespace cutrain::inline CUTRAIN_ABI {

// The type a classifier's loss and its weight gradient are kept in: f64 for f64 inputs, else f32.
template <class T>
using loss_float_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// What linear_cross_entropy returns: the loss (shape {}) and, when asked, dx [N, C] and dw [V, C]
// for an upstream gradient of 1.
template <class T>
struct LinearCrossEntropyResult {
  Tensor<loss_float_t<T>> loss;
  Tensor<T> dx;
  Tensor<loss_float_t<T>> dw;
};

namespace detail {
// Rows of logits whose bytes fit in `budget` (at least one row).
inline std::int64_t classifier_chunk_rows(const LinearCrossEntropyParams& p, std::int64_t rows, std::int64_t row_bytes,
                                          std::int64_t budget = std::int64_t{2} << 30) {
  const std::int64_t want = p.chunk_rows > 0 ? p.chunk_rows : budget / std::max<std::int64_t>(row_bytes, 1);
  return std::clamp<std::int64_t>(want, 1, std::max<std::int64_t>(rows, 1));
}
}  // namespace detail

}  // namespace cutrain::inline CUTRAIN_ABI

namespace cutrain::inline CUTRAIN_ABI::cpu {

// x [N, C], w [V, C], labels [N] in [0, V) or ignore_index (checked by ops/). The loss is summed
// in f64; the mean divides by the number of labels that are not ignore_index.
template <CpuFloat T>
LinearCrossEntropyResult<T> linear_cross_entropy(const Tensor<T>& x, const Tensor<T>& w,
                                                 const Tensor<std::int32_t>& labels, const LinearCrossEntropyParams& p,
                                                 bool grads) {
  const std::int64_t N = x.dim(0), C = x.dim(1), V = w.dim(0);
  const Tensor<T> xs = row_major(x), ws = row_major(w);
  const ConstMapRM<T> X(xs.data(), N, C), W(ws.data(), V, C);
  const std::vector<std::int32_t> lab = labels.to_vector();
  const auto count = std::count_if(lab.begin(), lab.end(), [&](std::int32_t l) { return l != p.ignore_index; });
  const bool mean = p.reduction == Reduction::mean;
  const double eps = p.label_smoothing, off = eps / static_cast<double>(V);
  const double scale = mean ? 1.0 / static_cast<double>(count) : 1.0;

  LinearCrossEntropyResult<T> r{Tensor<T>(Shape{}), {}, {}};
  if (grads) {
    r.dx = Tensor<T>(Shape{N, C});
    r.dw = Tensor<T>(Shape{V, C});
    MapRM<T>(r.dw.data(), V, C).setZero();
  }
  const std::int64_t chunk = cutrain::detail::classifier_chunk_rows(p, N, V * static_cast<std::int64_t>(sizeof(T)));
  Tensor<T> buf(Shape{std::min(chunk, N), V});
  double total = 0;
  for (std::int64_t r0 = 0; r0 < N; r0 += chunk) {
    const std::int64_t n = std::min(chunk, N - r0);
    MapRM<T> L(buf.data(), n, V);
    L.noalias() = X.middleRows(r0, n) * W.transpose();
    for (std::int64_t i = 0; i < n; ++i) {
      T* row = buf.data() + i * V;
      const std::int32_t label = lab[static_cast<std::size_t>(r0 + i)];
      if (label == p.ignore_index) {
        std::fill(row, row + V, T(0));
        continue;
      }
      double mx = -std::numeric_limits<double>::infinity(), sum_x = 0;
      for (std::int64_t c = 0; c < V; ++c) mx = std::max(mx, static_cast<double>(row[c]));
      double sum_exp = 0;
      for (std::int64_t c = 0; c < V; ++c) {
        sum_exp += std::exp(static_cast<double>(row[c]) - mx);
        sum_x += static_cast<double>(row[c]);
      }
      const double lse = mx + std::log(sum_exp);
      total -= (1 - eps) * (static_cast<double>(row[label]) - lse) + off * (sum_x - static_cast<double>(V) * lse);
      for (std::int64_t c = 0; c < V; ++c)
        row[c] = static_cast<T>((std::exp(static_cast<double>(row[c]) - lse) - off - (c == label ? 1 - eps : 0)) * scale);
    }
    if (grads) {
      MapRM<T>(r.dx.data() + r0 * C, n, C).noalias() = L * W;
      MapRM<T>(r.dw.data(), V, C).noalias() += L.transpose() * X.middleRows(r0, n);
    }
  }
  r.loss.data()[0] = static_cast<T>(mean ? total / static_cast<double>(count) : total);
  return r;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
