// Fully connected layer on the CPU: y = x w^T + b, with Eigen GEMM.
#pragma once

#include "cutrain/core/abi.hpp"

#include "cutrain/cpu/common.hpp"

namespace cutrain::inline CUTRAIN_ABI {

// Gradients of linear_forward; db is undefined when the layer has no bias.
template <class T>
struct LinearBackward {
  Tensor<T> dx, dw, db;
};

}  // namespace cutrain::inline CUTRAIN_ABI

namespace cutrain::inline CUTRAIN_ABI::cpu {

// x [N, in], w [out, in], bias [out] or undefined -> y [N, out].
template <CpuFloat T>
Tensor<T> linear_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias) {
  const auto N = x.dim(0), in = x.dim(1), out = w.dim(0);
  const Tensor<T> xs = row_major(x), ws = row_major(w);
  Tensor<T> y({N, out});
  MapRM<T> Y(y.data(), N, out);
  Y.noalias() = ConstMapRM<T>(xs.data(), N, in) * ConstMapRM<T>(ws.data(), out, in).transpose();
  if (bias.defined()) {
    const auto b = bias.to_vector();
    Y.rowwise() += Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>(b.data(), out);
  }
  return y;
}

template <CpuFloat T>
Tensor<T> linear_forward(const Tensor<T>& x, const Tensor<T>& w) {
  return linear_forward(x, w, Tensor<T>{});
}

// dx = dy w, dw = dy^T x, db = sum over the batch of dy.
template <CpuFloat T>
LinearBackward<T> linear_backward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& dy, bool has_bias = true) {
  const auto N = x.dim(0), in = x.dim(1), out = w.dim(0);
  const Tensor<T> xs = row_major(x), ws = row_major(w), dys = row_major(dy);
  const ConstMapRM<T> X(xs.data(), N, in), W(ws.data(), out, in), DY(dys.data(), N, out);
  LinearBackward<T> g{Tensor<T>({N, in}), Tensor<T>({out, in}), Tensor<T>{}};
  MapRM<T>(g.dx.data(), N, in).noalias() = DY * W;
  MapRM<T>(g.dw.data(), out, in).noalias() = DY.transpose() * X;
  if (has_bias) {
    g.db = Tensor<T>({out});
    Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>(g.db.data(), out) = DY.colwise().sum();
  }
  return g;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
