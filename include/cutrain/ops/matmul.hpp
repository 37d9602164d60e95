// matmul, gemm and matmul_backward: matrix products with batch dims, broadcasting and transposed
// operands, dispatched on the tensors' device (CPU: Eigen on strided maps, cpu/matmul.hpp; CUDA:
// cuBLASLt strided batched, cuda/cublas/matmul.hpp). The semantics are torch.matmul's:
//   a [..., m, k] x b [..., k, n] -> [..., m, n], the batch dims (all but the last two)
//   broadcast by NumPy's rules; a 1-d a is a row [1, k] and a 1-d b a column [k, 1], the added
//   dim removed from the result again.
// gemm is alpha op(a) op(b) + beta c with op = identity or transpose of the last two dims.
// Backward: da = dy b^T, db = a^T dy (as matmuls of transposed views, no copies), summed over
// the batch dims a or b broadcast (sum_to).
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cutrain/core/view.hpp"
#include "cutrain/cpu/matmul.hpp"
#include "cutrain/ops/dispatch.hpp"
#include "cutrain/ops/sum_to.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/api.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI {

// Gradients of matmul; each is undefined when it was not asked for.
template <class T>
struct MatmulBackward {
  Tensor<T> da, db;
};

}  // namespace cutrain::inline CUTRAIN_ABI

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
inline constexpr std::string_view matmul_shapes = "a [..., m, k], b [..., k, n]";

// The operands of one product: a and b with rank-1 operands promoted and the batch dims
// broadcast (expanded views: stride 0 where broadcast), and the result's shapes.
template <class T>
struct MatmulOperands {
  Tensor<T> a, b;    // [B..., m, k] and [B..., k, n]
  Shape full;        // [B..., m, n]: what the backends compute
  Shape out;         // full without the dims of promoted rank-1 operands: what the op returns
  Shape a_promoted;  // a's shape with its rank-1 dim added (the target of da's sum_to)
  Shape b_promoted;
};

inline Shape broadcast_batch(std::string_view op, const Shape& a, const Shape& b, const std::string& a_desc,
                             const std::string& b_desc) {
  const int ra = a.rank() - 2, rb = b.rank() - 2, r = std::max(ra, rb);
  std::vector<std::int64_t> out(static_cast<std::size_t>(r));
  for (int i = 0; i < r; ++i) {
    const int da = i - (r - ra), db = i - (r - rb);
    const std::int64_t x = da >= 0 ? a[da] : 1, y = db >= 0 ? b[db] : 1;
    CUTRAIN_REQUIRE(x == y || x == 1 || y == 1, InvalidArgument, op, "batch dims of a ", a_desc, " and b ", b_desc,
                    " do not broadcast: ", x, " against ", y, " at batch dim ", i,
                    " (each pair, aligned from the right, must be equal or 1; ", matmul_shapes, ")");
    out[static_cast<std::size_t>(i)] = x == 1 ? y : x;
  }
  return Shape(std::move(out));
}

template <class T>
MatmulOperands<T> matmul_operands(std::string_view op, const Tensor<T>& a_in, const Tensor<T>& b_in) {
  check::defined(op, a_in, "a");
  check::defined(op, b_in, "b");
  CUTRAIN_REQUIRE(a_in.rank() >= 1 && b_in.rank() >= 1, InvalidArgument, op,
                  "operands must have rank >= 1 (a 0-d tensor is a scalar: use mul), got a ", a_in.describe(),
                  " and b ", b_in.describe());
  const Tensor<T> a = a_in.rank() == 1 ? cutrain::unsqueeze(a_in, 0) : a_in.view();
  const Tensor<T> b = b_in.rank() == 1 ? cutrain::unsqueeze(b_in, -1) : b_in.view();
  const std::int64_t m = a.dim(a.rank() - 2), k = a.dim(a.rank() - 1), n = b.dim(b.rank() - 1);
  CUTRAIN_REQUIRE(b.dim(b.rank() - 2) == k, InvalidArgument, op, "inner dims differ: a ", a_in.describe(),
                  " has k = ", k, " (its last dim) but b ", b_in.describe(), " has k = ", b.dim(b.rank() - 2),
                  b_in.rank() == 1 ? " (its only dim)" : " (its second-to-last dim)", " (", matmul_shapes, ")");
  const Shape batch = broadcast_batch(op, a.shape(), b.shape(), a_in.describe(), b_in.describe());
  std::vector<std::int64_t> full = batch.dims(), sa = batch.dims(), sb = batch.dims(), out = batch.dims();
  full.insert(full.end(), {m, n});
  sa.insert(sa.end(), {m, k});
  sb.insert(sb.end(), {k, n});
  if (a_in.rank() > 1) out.push_back(m);
  if (b_in.rank() > 1) out.push_back(n);
  MatmulOperands<T> o{cutrain::expand(a, Shape(sa)), cutrain::expand(b, Shape(sb)), Shape(full), Shape(out),
                      a.shape(), b.shape()};
  check_shape_valid(op, o.full, sizeof(T));
  return o;
}

// y (full shape) = alpha a b + beta c on the operands' device.
template <class T>
Tensor<T> run_matmul(std::string_view op, const MatmulOperands<T>& o, const Tensor<T>& c, double alpha, double beta) {
  return detail::dispatch<Tensor<T>>(
      op,
      [&](const auto& a, const auto& b, const auto& c) {
        using U = typename std::remove_cvref_t<decltype(a)>::value_type;
        Tensor<U> y(o.full);
        cpu::gemm_into(a, b, c, static_cast<U>(alpha), static_cast<U>(beta), y);
        return y;
      },
      CUTRAIN_IF_CUDA([&](const auto& a, const auto& b, const auto& c) {
        using U = typename std::remove_cvref_t<decltype(a)>::value_type;
        Tensor<U> y(o.full, {.device = a.device()});  // row-major, whatever a's layout
        cuda::cublas::matmul_into(a, b, c, static_cast<float>(alpha), static_cast<float>(beta), y, op);
        return y;
      }),
      o.a, o.b, c);
}
}  // namespace detail

// torch.matmul: a [..., m, k] x b [..., k, n] -> [..., m, n] with the batch dims broadcast; a
// 1-d a or b is promoted (row, column) and its dim removed from the result, so 1-d x 1-d is a
// 0-d dot product. Any strides: transposed views run without copies on both backends.
template <class T>
Tensor<T> matmul(const Tensor<T>& a, const Tensor<T>& b) {
  constexpr std::string_view op = "matmul";
  const auto o = detail::matmul_operands(op, a, b);
  Tensor<T> y = detail::run_matmul(op, o, Tensor<T>{}, 1.0, 0.0);
  return y.reshape(o.out);
}

// alpha op(a) op(b) + beta c, op = identity, or the transpose of the last two dims when trans_a
// (trans_b) is set; a and b of rank >= 2 with batch dims broadcast as in matmul; c broadcasts to
// the result's shape [..., m, n] and is read only when beta != 0 (it may be undefined then).
// On CUDA the beta term is cuBLASLt's C input. Returns a new tensor; c is not written.
template <class T>
Tensor<T> gemm(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& c, double alpha = 1.0, double beta = 0.0,
               bool trans_a = false, bool trans_b = false) {
  constexpr std::string_view op = "gemm";
  check::defined(op, a, "a");
  check::defined(op, b, "b");
  CUTRAIN_REQUIRE(a.rank() >= 2 && b.rank() >= 2, InvalidArgument, op,
                  "a and b must have rank >= 2 (use matmul for 1-d operands), got a ", a.describe(), " and b ",
                  b.describe());
  const std::int64_t ka = trans_a ? a.dim(a.rank() - 2) : a.dim(a.rank() - 1);
  const std::int64_t kb = trans_b ? b.dim(b.rank() - 1) : b.dim(b.rank() - 2);
  CUTRAIN_REQUIRE(ka == kb, InvalidArgument, op, "inner dims differ: op(a) of a ", a.describe(),
                  trans_a ? " (transposed)" : "", " has k = ", ka, " but op(b) of b ", b.describe(),
                  trans_b ? " (transposed)" : "", " has k = ", kb, " (op(a) [..., m, k], op(b) [..., k, n])");
  const auto o = detail::matmul_operands(op, trans_a ? cutrain::transpose(a, -1, -2) : a.view(),
                                         trans_b ? cutrain::transpose(b, -1, -2) : b.view());
  Tensor<T> ce;
  if (beta != 0.0) {
    CUTRAIN_REQUIRE(c.defined(), InvalidArgument, op, "beta is ", beta, " but c is an undefined tensor");
    CUTRAIN_REQUIRE(c.rank() <= o.full.rank(), InvalidArgument, op, "c ", c.describe(),
                    " does not broadcast to the result ", o.full, " of a ", a.describe(), " and b ", b.describe());
    bool fits = true;
    for (int d = 0; d < c.rank(); ++d) {
      const std::int64_t want = o.full[o.full.rank() - c.rank() + d];
      fits = fits && (c.dim(d) == want || c.dim(d) == 1);
    }
    CUTRAIN_REQUIRE(fits, InvalidArgument, op, "c ", c.describe(), " does not broadcast to the result ", o.full,
                    " of a ", a.describe(), " and b ", b.describe());
    ce = cutrain::expand(c, o.full);
  }
  return detail::run_matmul(op, o, ce, alpha, beta);
}

// da = dy b^T and db = a^T dy, summed down to a's and b's shapes over the batch dims they
// broadcast; only those asked for are computed (the others are undefined).
template <class T>
MatmulBackward<T> matmul_backward(const Tensor<T>& a, const Tensor<T>& b, const Tensor<T>& dy, bool need_a = true,
                                  bool need_b = true) {
  constexpr std::string_view op = "matmul_backward";
  const auto o = detail::matmul_operands(op, a, b);
  check::shape(op, dy, o.out, "dy");
  const Tensor<T> dyf = cutrain::reshape(dy, o.full);
  const Tensor<T> ap = cutrain::reshape(a, o.a_promoted), bp = cutrain::reshape(b, o.b_promoted);
  const auto reduce = [](Tensor<T> g, const Shape& promoted, const Shape& shape) {
    if (g.shape() != promoted) g = ops::sum_to(g, promoted);
    return g.reshape(shape);
  };
  MatmulBackward<T> g;
  if (need_a) g.da = reduce(matmul(dyf, cutrain::transpose(bp, -1, -2)), o.a_promoted, a.shape());
  if (need_b) {
    const int r = o.full.rank();
    // b without batch dims against a batched a: the batch sums into the product itself,
    // db = a^T dy over all B * m rows, when a and dy are viewable as [B * m, .] matrices.
    std::optional<Strides> af, df;
    std::int64_t rows = 1;
    for (int d = 0; d < r - 1; ++d) rows *= o.full[d];
    const Shape a_rows{rows, o.a.dim(r - 1)};
    const Shape dy_rows{a_rows[0], o.full[r - 1]};
    if (r > 2 && bp.rank() == 2 && ap.shape() == o.a.shape() && o.full[r - 1] > 0) {
      af = cutrain::detail::view_strides(ap.shape(), ap.strides(), a_rows);
      df = cutrain::detail::view_strides(dyf.shape(), dyf.strides(), dy_rows);
    }
    if (af && df)
      g.db = reduce(matmul(cutrain::transpose(ap.as_strided(a_rows, *af, ap.offset()), -1, -2),
                           dyf.as_strided(dy_rows, *df, dyf.offset())),
                    o.b_promoted, b.shape());
    else
      g.db = reduce(matmul(cutrain::transpose(ap, -1, -2), dyf), o.b_promoted, b.shape());
  }
  return g;
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
