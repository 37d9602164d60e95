// Indexing by int32 or int64 tensors: index_select (a 1-d index picks positions of one dim) and gather
// (torch.gather: an index of x's rank picks, at each of its positions, the position along one
// dim), and their backwards (dy added into zeros of x's shape). Dispatch on the tensors' device;
// index values are checked before any op runs: on the CPU by a scan, on the GPU by a small
// kernel that counts the bad values, whose 8-byte result is read back (a stream synchronization).
// Under CUDA graph capture there is no check: the forward kernels write NaN for an out-of-range
// index, and the backward adds nothing for it. An int64 index (or any index under
// IndexOptions::wrap_negative) is first converted to int32 on its device, checked in the same
// pass (ops/index_convert.hpp). docs/ops/shape_ops.md.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <limits>
#include <string_view>

#include "cutrain/core/check.hpp"
#include "cutrain/cpu/index.hpp"
#include "cutrain/ops/dispatch.hpp"
#include "cutrain/ops/index_convert.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/index.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// The GPU kernels index with rank <= 8 arrays.
inline constexpr int max_index_rank = 8;

template <class T, IndexInt I>
int index_dim(std::string_view op, const Tensor<T>& x_like, const Shape& x_shape, int dim, const Tensor<I>& index) {
  check::defined(op, index, "index");
  CUTRAIN_REQUIRE(x_shape.rank() >= 1, InvalidArgument, op, "x must have at least one dim, got shape ", x_shape);
  CUTRAIN_REQUIRE(x_like.device().is_cpu() || x_shape.rank() <= max_index_rank, NotImplemented, op,
                  "the CUDA kernels take rank 1 to ", max_index_rank, ", got x of shape ", x_shape);
  check::same_device(op, x_like, index);
  return cutrain::detail::wrap_dim(op, dim, x_shape.rank(), x_shape);
}

// Every value of index lies in [0, size): else InvalidArgument naming the op, a bad value, how
// many there are, and dim d and its size.
inline void require_indices_in_range(std::string_view op, const Tensor<std::int32_t>& index, std::int64_t size, int d,
                                     const Shape& x_shape) {
  if (index.numel() == 0) return;
  // Under CUDA graph capture the host cannot read the check's result: the forward kernels then
  // write NaN for an out-of-range index (never reading outside x), as cross_entropy's labels do.
  if (!index.device().is_cpu() && cutrain::detail::device_capturing()) return;
  const IndexRangeReport r = dispatch<IndexRangeReport, AnyDtype>(
      op,
      [&](const auto& idx) {
        IndexRangeReport rep;
        cutrain::detail::for_each_offset(idx.shape(), idx.strides(), 0, [&](std::int64_t i, std::int64_t off) {
          const std::int64_t v = idx.data()[off];
          if (v >= 0 && v < size) return;
          if (rep.bad++ == 0) {
            rep.value = v;
            rep.position = i;
          }
        });
        return rep;
      },
      CUTRAIN_IF_CUDA([&](const auto& idx) {
        const auto [bad, value] = cuda::kernels::index_range_check(idx, size);
        return IndexRangeReport{bad, value, -1};
      }),
      index);
  CUTRAIN_REQUIRE(r.bad == 0, InvalidArgument, op, "index value ", r.value,
                  r.position >= 0 ? cutrain::detail::cat(" at position ", r.position) : std::string(),
                  " is out of range for dim ", d, " of size ", size, " (x shape ", x_shape, "; ", r.bad, " of the ",
                  index.numel(), " index values are outside [0, ", size, "))");
}

// The int32 index the kernels run with, its values checked (see index_as_i32).
template <IndexInt I>
Tensor<std::int32_t> checked_index(std::string_view op, const Tensor<I>& index, std::int64_t size, int d,
                                   const Shape& x_shape, const IndexOptions& o) {
  return index_as_i32(op, index, size, d, x_shape, o,
                      [&](const auto& i32) { require_indices_in_range(op, i32, size, d, x_shape); });
}

template <IndexInt I>
void require_index_1d(std::string_view op, const Tensor<I>& index) {
  CUTRAIN_REQUIRE(index.rank() == 1, InvalidArgument, op, "index must be 1-d, got ", index.describe());
}

template <IndexInt I>
void require_gather_index(std::string_view op, const Shape& x_shape, int d, const Tensor<I>& index) {
  CUTRAIN_REQUIRE(index.rank() == x_shape.rank(), InvalidArgument, op, "index must have x's rank ", x_shape.rank(),
                  " (x shape ", x_shape, "), got ", index.describe());
  for (int k = 0; k < x_shape.rank(); ++k)
    CUTRAIN_REQUIRE(k == d || index.dim(k) <= x_shape[k], InvalidArgument, op, "index ", index.shape(),
                    " is larger than x ", x_shape, " in dim ", k, " (only dim ", d, ", the gathered one, may be)");
}

template <class T>
void require_grad_shape(std::string_view op, const Tensor<T>& dy, const Shape& want) {
  check::defined(op, dy, "dy");
  CUTRAIN_REQUIRE(dy.shape() == want, InvalidArgument, op, "dy must have the output's shape ", want, ", got ",
                  dy.describe());
}

template <IndexInt I>
Shape index_select_shape(const Shape& x_shape, int d, const Tensor<I>& index) {
  Shape s = x_shape;
  s[d] = index.numel();
  return s;
}
}  // namespace detail

// y = x with position j of dim `dim` taken from position index[j]: index 1-d int32 or int64 on
// x's device, each value in [0, x.dim(dim)) ([-x.dim(dim), x.dim(dim)) with o.wrap_negative).
// y: x's shape with that dim index.numel().
template <class T, IndexInt I>
Tensor<T> index_select(const Tensor<T>& x, int dim, const Tensor<I>& index_in, const IndexOptions& o = {}) {
  constexpr std::string_view op = "index_select";
  check::defined(op, x, "x");
  const int d = detail::index_dim(op, x, x.shape(), dim, index_in);
  detail::require_index_1d(op, index_in);
  const Tensor<std::int32_t> index = detail::checked_index(op, index_in, x.dim(d), d, x.shape(), o);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& x) { return cpu::index_select(x, d, index); },
      CUTRAIN_IF_CUDA([&](const auto& x) {
        Tensor<T> y(detail::index_select_shape(x.shape(), d, index), {.device = x.device()});
        cuda::kernels::index_select(x, d, index, y);
        return y;
      }),
      x);
}

// dx (x_shape, row-major) = zeros, dx[.., index[j], ..] += dy[.., j, ..] (repeated indices add up).
template <class T, IndexInt I>
Tensor<T> index_select_backward(const Tensor<T>& dy, const Shape& x_shape, int dim, const Tensor<I>& index_in,
                                const IndexOptions& o = {}) {
  constexpr std::string_view op = "index_select_backward";
  check::defined(op, dy, "dy");
  check_shape_valid(op, x_shape);
  const int d = detail::index_dim(op, dy, x_shape, dim, index_in);
  detail::require_index_1d(op, index_in);
  detail::require_grad_shape(op, dy, detail::index_select_shape(x_shape, d, index_in));
  const Tensor<std::int32_t> index = detail::checked_index(op, index_in, x_shape[d], d, x_shape, o);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& dy) { return cpu::index_select_backward(dy, x_shape, d, index); },
      CUTRAIN_IF_CUDA([&](const auto& dy) {
        Tensor<T> dx(x_shape, {.device = dy.device()});
        cuda::kernels::index_select_backward(dy, d, index, dx);
        return dx;
      }),
      dy);
}

// torch.gather: y (index's shape) at c = x at c with coordinate `dim` replaced by index at c.
// index int32 or int64 of x's rank, no larger than x in any other dim, values in [0, x.dim(dim))
// ([-x.dim(dim), x.dim(dim)) with o.wrap_negative).
template <class T, IndexInt I>
Tensor<T> gather(const Tensor<T>& x, int dim, const Tensor<I>& index_in, const IndexOptions& o = {}) {
  constexpr std::string_view op = "gather";
  check::defined(op, x, "x");
  const int d = detail::index_dim(op, x, x.shape(), dim, index_in);
  detail::require_gather_index(op, x.shape(), d, index_in);
  const Tensor<std::int32_t> index = detail::checked_index(op, index_in, x.dim(d), d, x.shape(), o);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& x) { return cpu::gather(x, d, index); },
      CUTRAIN_IF_CUDA([&](const auto& x) {
        Tensor<T> y(index.shape(), {.device = x.device()});
        cuda::kernels::gather(x, d, index, y);
        return y;
      }),
      x);
}

// dx (x_shape, row-major) = zeros, dx at (c with coordinate dim = index at c) += dy at c.
template <class T, IndexInt I>
Tensor<T> gather_backward(const Tensor<T>& dy, const Shape& x_shape, int dim, const Tensor<I>& index_in,
                          const IndexOptions& o = {}) {
  constexpr std::string_view op = "gather_backward";
  check::defined(op, dy, "dy");
  check_shape_valid(op, x_shape);
  const int d = detail::index_dim(op, dy, x_shape, dim, index_in);
  detail::require_gather_index(op, x_shape, d, index_in);
  detail::require_grad_shape(op, dy, index_in.shape());
  const Tensor<std::int32_t> index = detail::checked_index(op, index_in, x_shape[d], d, x_shape, o);
  return detail::dispatch<Tensor<T>>(
      op, [&](const auto& dy) { return cpu::gather_backward(dy, x_shape, d, index); },
      CUTRAIN_IF_CUDA([&](const auto& dy) {
        Tensor<T> dx(x_shape, {.device = dy.device()});
        cuda::kernels::gather_backward(dy, d, index, dx);
        return dx;
      }),
      dy);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
