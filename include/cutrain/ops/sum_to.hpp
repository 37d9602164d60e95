// sum_to: x summed down to a shape that broadcasts to x's (NumPy rules read backwards: the
// target aligned to the right, each of its dims equal to x's or 1; x's extra leading dims are
// summed). expand's backward, and the reduction a broadcasting op's backward needs. It is
// ops::sum over those dims (keepdim), reshaped to the target: any layout in, on x's device, in
// the dtypes ops::sum computes in (CPU f32/f64, GPU f32/bf16/f16).
#pragma once

#include "cutrain/core/abi.hpp"

#include <vector>

#include "cutrain/core/view.hpp"
#include "cutrain/ops/reduce.hpp"

namespace cutrain::inline CUTRAIN_ABI::ops {

template <class T>
Tensor<T> sum_to(const Tensor<T>& x, const Shape& shape) {
  constexpr std::string_view op = "sum_to";
  check::defined(op, x, "x");
  const std::vector<bool> reduced = cutrain::detail::sum_to_dims(op, x.shape(), shape);
  Axes axes;
  for (int d = 0; d < x.rank(); ++d)
    if (reduced[static_cast<std::size_t>(d)]) axes.push_back(d);
  // Nothing to sum (ops::sum would read empty axes as "all"): a copy, as a sum would be.
  if (axes.empty()) return cutrain::reshape(x.clone(Layout::row_major), shape);
  return cutrain::reshape(ops::sum(x, axes, /*keepdim=*/true), shape);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
