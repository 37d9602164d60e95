// Batched matrix products on the CPU: y[i] = alpha a[i] b[i] + beta c[i] for every batch index
// i, with Eigen GEMM on strided maps (any strides, stride 0 included: transposed, sliced and
// broadcast views are read in place, no copies). The shapes and their broadcasting are settled
// by ops/matmul.hpp before this runs.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>

#include "cutrain/cpu/common.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

namespace detail {
template <class T>
using StridedMap = Eigen::Map<const MatrixRM<T>, 0, Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;

// The matrix of t ([..., r, c]) that starts `off` elements into it.
template <class T>
StridedMap<T> matrix_at(const Tensor<T>& t, std::int64_t off) {
  const int r = t.rank();
  const auto& s = t.strides();
  return StridedMap<T>(t.data() + off, t.dim(r - 2), t.dim(r - 1),
                       Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(s[static_cast<std::size_t>(r - 2)],
                                                                     s[static_cast<std::size_t>(r - 1)]));
}

// The offset of batch index i (row-major over the first rank - 2 dims of `shape`) in strides.
inline std::int64_t batch_offset(std::int64_t i, const Shape& shape, const Strides& strides) {
  std::int64_t off = 0;
  for (int d = shape.rank() - 3; d >= 0; --d) {
    off += (i % shape[d]) * strides[static_cast<std::size_t>(d)];
    i /= shape[d];
  }
  return off;
}
}  // namespace detail

// a [B..., m, k], b [B..., k, n], c [B..., m, n] or undefined (beta then ignored), y [B..., m, n]
// row-major; all four with the same batch dims B (broadcast views have stride 0 there).
// beta == 0 ignores c's values, as BLAS does.
template <CpuFloat T>
void gemm_into(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& c, T alpha, T beta, Tensor<T>& y) {
  const int r = y.rank();
  const std::int64_t m = y.dim(r - 2), n = y.dim(r - 1);
  const std::int64_t batches = m * n == 0 ? 0 : y.numel() / (m * n);
  const bool use_c = c.defined() && beta != T(0);
  for (std::int64_t i = 0; i < batches; ++i) {
    MapRM<T> Y(y.data() + i * m * n, m, n);
    Y.noalias() = detail::matrix_at(a, detail::batch_offset(i, a.shape(), a.strides())) *
                  detail::matrix_at(b, detail::batch_offset(i, b.shape(), b.strides()));
    if (alpha != T(1)) Y *= alpha;
    if (use_c) Y += beta * detail::matrix_at(c, detail::batch_offset(i, c.shape(), c.strides()));
  }
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
