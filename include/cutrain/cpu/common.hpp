// Helpers shared by the CPU ops: layout staging and Eigen views over tensors.
#pragma once

#include "cutrain/core/abi.hpp"

#include <Eigen/Core>

#include "cutrain/core/check.hpp"

namespace cutrain::inline CUTRAIN_ABI::cpu {

template <class T>
using MatrixRM = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MapRM = Eigen::Map<MatrixRM<T>>;
template <class T>
using ConstMapRM = Eigen::Map<const MatrixRM<T>>;

// The layout an op's output takes from its input: nhwc stays nhwc, all else is row-major/nchw.
template <class T>
Layout output_layout(const Tensor<T>& like) {
  return like.layout() == Layout::nhwc ? Layout::nhwc : Layout::row_major;
}

// A new host tensor of the given shape in the layout of `like`.
template <class T>
Tensor<T> empty_like_layout(const Shape& shape, const Tensor<T>& like) {
  Layout l = output_layout(like);
  if (shape.rank() != 4) l = Layout::row_major;
  return Tensor<T>(shape, {.layout = l});
}

// The tensor as a contiguous row-major (nchw) array: a view when it already is one.
template <class T>
Tensor<T> row_major(const Tensor<T>& t) {
  return t.contiguous(Layout::row_major);
}

// Stages a row-major result into a new tensor laid out like `like`.
template <class T>
Tensor<T> in_layout_of(Tensor<T> result, const Tensor<T>& like) {
  if (result.rank() != 4 || output_layout(like) != Layout::nhwc) return result;
  return result.contiguous(Layout::nhwc);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
