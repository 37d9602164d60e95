// Views: transpose, permute, view / reshape, slice with a step, squeeze / unsqueeze and expand.
// Each returns a Tensor sharing its input's storage with new shape, strides and offset (metadata
// only, every dtype, any device); only reshape of a tensor that no view can express, and
// contiguous(), copy (on the tensor's device). Dims may be negative, counted from the end as in
// Python. Bad arguments throw InvalidArgument naming the op, the tensor and the offending value.
// The differentiable versions on Var<T> are in autograd/functions/view.hpp.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/shape.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI {

// A stop for slice() meaning "to the end of the dim".
inline constexpr std::int64_t slice_end = std::numeric_limits<std::int64_t>::max();

namespace detail {
template <class T>
void check_view_input(std::string_view op, const Tensor<T>& t) {
  CUTRAIN_REQUIRE(t.defined(), InvalidArgument, op, "the tensor is undefined (default-constructed)");
}

// dim in [-rank, rank) as a dim in [0, rank).
inline int wrap_dim(std::string_view op, int dim, int rank, const Shape& shape) {
  CUTRAIN_REQUIRE(dim >= -rank && dim < rank, InvalidArgument, op, "dim ", dim, " out of range for shape ", shape,
                  " (rank ", rank, ": dims ", -rank, " to ", rank - 1, ")");
  return dim < 0 ? dim + rank : dim;
}

// The tensor's shape, strides and layout, for messages.
template <class T>
std::string geometry(const Tensor<T>& t) {
  return cat(t.describe(), " (strides ", strides_str(t.strides()), ")");
}

// shape with at most one -1 replaced by what makes its element count `numel`.
inline Shape infer_shape(std::string_view op, const Shape& shape, std::int64_t numel, const std::string& from) {
  int unknown = -1;
  std::int64_t known = 1;
  for (int d = 0; d < shape.rank(); ++d) {
    if (shape[d] == -1) {
      CUTRAIN_REQUIRE(unknown < 0, InvalidArgument, op, "shape ", shape, " has more than one -1");
      unknown = d;
      continue;
    }
    CUTRAIN_REQUIRE(shape[d] >= 0, InvalidArgument, op, "shape ", shape, " has a negative dimension other than -1");
    CUTRAIN_REQUIRE(!__builtin_mul_overflow(known, shape[d], &known), InvalidArgument, op, "shape ", shape,
                    " has more elements than an int64 counts");
  }
  Shape out = shape;
  if (unknown >= 0) {
    CUTRAIN_REQUIRE(known != 0 && numel % known == 0, InvalidArgument, op, "cannot infer the -1 of ", shape, " for ",
                    from, " of ", numel, " elements");
    out[unknown] = numel / known;
  }
  CUTRAIN_REQUIRE(out.numel() == numel, InvalidArgument, op, "cannot view ", from, " (", numel, " elements) as ", shape,
                  " (", known, " elements)");
  return out;
}

// Strides that give shape `to` over the elements of (from, strides) without moving any, or none
// when some dims to be merged are not laid out one after the other (PyTorch's computeStride).
inline std::optional<Strides> view_strides(const Shape& from, const Strides& strides, const Shape& to) {
  const int rf = from.rank(), rt = to.rank();
  Strides out(static_cast<std::size_t>(rt), 0);
  if (from.numel() == 0 || rf == 0) return contiguous_strides(to, Layout::row_major);
  int vd = rt - 1;
  std::int64_t chunk_stride = strides.back(), tensor_numel = 1, view_numel = 1;
  for (int td = rf - 1; td >= 0; --td) {
    tensor_numel *= from[td];
    const bool chunk_ends = td == 0 || (from[td - 1] != 1 && strides[static_cast<std::size_t>(td - 1)] != tensor_numel * chunk_stride);
    if (!chunk_ends) continue;
    while (vd >= 0 && (view_numel < tensor_numel || to[vd] == 1)) {
      out[static_cast<std::size_t>(vd)] = view_numel * chunk_stride;
      view_numel *= to[vd];
      --vd;
    }
    if (view_numel != tensor_numel) return std::nullopt;
    if (td > 0) {
      chunk_stride = strides[static_cast<std::size_t>(td - 1)];
      tensor_numel = view_numel = 1;
    }
  }
  if (vd != -1) return std::nullopt;
  return out;
}

// Which dims of `from` a sum down to `to` adds up (NumPy broadcasting read backwards: `to`
// aligned to the right, each of its dims equal to from's or 1; from's extra leading dims are
// summed). The check of ops::sum_to (ops/sum_to.hpp, expand's backward).
inline std::vector<bool> sum_to_dims(std::string_view op, const Shape& from, const Shape& to) {
  check_shape_valid(op, to);
  const int lead = from.rank() - to.rank();
  CUTRAIN_REQUIRE(lead >= 0, InvalidArgument, op, "cannot sum ", from, " down to ", to, ": the target has more dims");
  std::vector<bool> reduced(static_cast<std::size_t>(from.rank()), true);
  for (int d = lead; d < from.rank(); ++d) {
    const std::int64_t want = to[d - lead];
    CUTRAIN_REQUIRE(want == from[d] || want == 1, InvalidArgument, op, "cannot sum ", from, " down to ", to, ": dim ",
                    d - lead, " of the target is ", want, ", neither ", from[d], " nor 1");
    reduced[static_cast<std::size_t>(d)] = want != from[d];
  }
  return reduced;
}
}  // namespace detail

// Dims a and b swapped.
template <class T>
Tensor<T> transpose(const Tensor<T>& t, int a, int b) {
  constexpr std::string_view op = "transpose";
  detail::check_view_input(op, t);
  a = detail::wrap_dim(op, a, t.rank(), t.shape());
  b = detail::wrap_dim(op, b, t.rank(), t.shape());
  Shape s = t.shape();
  Strides st = t.strides();
  std::swap(s[a], s[b]);
  std::swap(st[static_cast<std::size_t>(a)], st[static_cast<std::size_t>(b)]);
  return t.as_strided(s, st, t.offset());
}

// Dim i of the result is dim dims[i] of t; dims is a permutation of t's dims (negative allowed).
template <class T>
Tensor<T> permute(const Tensor<T>& t, const std::vector<int>& dims) {
  constexpr std::string_view op = "permute";
  detail::check_view_input(op, t);
  const int r = t.rank();
  CUTRAIN_REQUIRE(static_cast<int>(dims.size()) == r, InvalidArgument, op, "got ", dims.size(), " dims ",
                  Shape(std::vector<std::int64_t>(dims.begin(), dims.end())), " for the ", r, "-d ", t.describe());
  std::vector<bool> seen(static_cast<std::size_t>(r), false);
  std::vector<std::int64_t> s(static_cast<std::size_t>(r));
  Strides st(static_cast<std::size_t>(r));
  for (int i = 0; i < r; ++i) {
    const int d = detail::wrap_dim(op, dims[static_cast<std::size_t>(i)], r, t.shape());
    CUTRAIN_REQUIRE(!seen[static_cast<std::size_t>(d)], InvalidArgument, op, "dims ",
                    Shape(std::vector<std::int64_t>(dims.begin(), dims.end())), " name dim ", d, " twice for ",
                    t.describe());
    seen[static_cast<std::size_t>(d)] = true;
    s[static_cast<std::size_t>(i)] = t.dim(d);
    st[static_cast<std::size_t>(i)] = t.strides()[static_cast<std::size_t>(d)];
  }
  return t.as_strided(Shape(std::move(s)), st, t.offset());
}

// The same elements (logical row-major order) in `shape`, one dim of which may be -1, without a
// copy; throws when t's strides allow no such view (reshape() then copies).
template <class T>
Tensor<T> view(const Tensor<T>& t, const Shape& shape) {
  constexpr std::string_view op = "view";
  detail::check_view_input(op, t);
  const Shape to = detail::infer_shape(op, shape, t.numel(), t.describe());
  const auto st = detail::view_strides(t.shape(), t.strides(), to);
  CUTRAIN_REQUIRE(st.has_value(), InvalidArgument, op, "cannot view ", detail::geometry(t), " as ", to,
                  " without a copy: the dims to merge are not laid out one after another; use reshape() (copies) or "
                  "contiguous() first");
  return t.as_strided(to, *st, t.offset());
}

// view(t, shape) when t's strides allow one, else a row-major copy in `shape` on t's device.
template <class T>
Tensor<T> reshape(const Tensor<T>& t, const Shape& shape) {
  constexpr std::string_view op = "reshape";
  detail::check_view_input(op, t);
  const Shape to = detail::infer_shape(op, shape, t.numel(), t.describe());
  if (const auto st = detail::view_strides(t.shape(), t.strides(), to)) return t.as_strided(to, *st, t.offset());
  Tensor<T> c = t.contiguous(Layout::row_major);  // an nhwc t is contiguous, yet not in logical order
  return c.as_strided(to, contiguous_strides(to, Layout::row_major), c.offset());
}

// t itself (a view) when contiguous (row-major, nchw or nhwc), else a row-major copy on t's device.
template <class T>
Tensor<T> contiguous(const Tensor<T>& t) {
  detail::check_view_input("contiguous", t);
  return t.contiguous();
}

// Elements start, start + step, ... of dim `dim` up to (not including) stop, with Python's rules:
// negative start and stop count from the end. step > 0: both are then clamped to [0, size], and
// slice_end as stop means "to the end". step < 0 walks backwards (a reversed view, no copy:
// slice(t, d, -1, slice_end, -1) is t flipped along d): start and stop are clamped to
// [-1, size - 1], and slice_end as stop means "past the first element". An empty range gives a
// size-0 dim. step must not be 0.
template <class T>
Tensor<T> slice(const Tensor<T>& t, int dim, std::int64_t start, std::int64_t stop = slice_end, std::int64_t step = 1) {
  constexpr std::string_view op = "slice";
  detail::check_view_input(op, t);
  const int d = detail::wrap_dim(op, dim, t.rank(), t.shape());
  CUTRAIN_REQUIRE(step != 0 && step != std::numeric_limits<std::int64_t>::min(), InvalidArgument, op,
                  "step must be nonzero (and above -2^63), got ", step, " (dim ", d, " of ", t.describe(), ")");
  const std::int64_t n = t.dim(d);
  std::int64_t count = 0;
  if (step > 0) {
    const auto clamp = [n](std::int64_t i) {
      if (i < 0) i = i < -n ? 0 : i + n;
      return i > n ? n : i;
    };
    start = clamp(start);
    stop = clamp(stop);
    count = stop > start ? (stop - start - 1) / step + 1 : 0;
  } else {
    const auto clamp = [n](std::int64_t i) {
      if (i < 0) i = i < -n ? -1 : i + n;
      return i > n - 1 ? n - 1 : i;
    };
    start = clamp(start);
    stop = stop == slice_end ? -1 : clamp(stop);
    count = start > stop ? (start - stop - 1) / -step + 1 : 0;
  }
  Shape s = t.shape();
  Strides st = t.strides();
  const auto ud = static_cast<std::size_t>(d);
  s[d] = count;
  // An empty view starts where t does (its offset is never read), so it stays inside t's storage.
  const std::int64_t offset = t.offset() + (s.numel() > 0 ? start * st[ud] : 0);
  st[ud] *= step;
  return t.as_strided(s, st, offset);
}

// t reversed along each of dims (a view with negative strides, no copy), as NumPy's flip.
template <class T>
Tensor<T> flip(const Tensor<T>& t, const std::vector<int>& dims) {
  Tensor<T> out = t.view();
  for (int d : dims) out = slice(out, d, -1, slice_end, -1);
  return out;
}

// Every size-1 dim removed.
template <class T>
Tensor<T> squeeze(const Tensor<T>& t) {
  detail::check_view_input("squeeze", t);
  std::vector<std::int64_t> s;
  Strides st;
  for (int d = 0; d < t.rank(); ++d) {
    if (t.dim(d) == 1) continue;
    s.push_back(t.dim(d));
    st.push_back(t.strides()[static_cast<std::size_t>(d)]);
  }
  return t.as_strided(Shape(std::move(s)), st, t.offset());
}

// Dim `dim` removed; it must have size 1 (unlike PyTorch, another size is an error, not a no-op).
template <class T>
Tensor<T> squeeze(const Tensor<T>& t, int dim) {
  constexpr std::string_view op = "squeeze";
  detail::check_view_input(op, t);
  const int d = detail::wrap_dim(op, dim, t.rank(), t.shape());
  CUTRAIN_REQUIRE(t.dim(d) == 1, InvalidArgument, op, "dim ", d, " of ", t.describe(), " has size ", t.dim(d),
                  ", not 1");
  std::vector<std::int64_t> s = t.shape().dims();
  Strides st = t.strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  return t.as_strided(Shape(std::move(s)), st, t.offset());
}

// A size-1 dim inserted so that it becomes dim `dim` of the result (in [-rank-1, rank]).
template <class T>
Tensor<T> unsqueeze(const Tensor<T>& t, int dim) {
  constexpr std::string_view op = "unsqueeze";
  detail::check_view_input(op, t);
  const int d = detail::wrap_dim(op, dim, t.rank() + 1, t.shape());
  std::vector<std::int64_t> s = t.shape().dims();
  Strides st = t.strides();
  const std::int64_t stride = d < t.rank() ? st[static_cast<std::size_t>(d)] * t.dim(d) : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, stride);
  return t.as_strided(Shape(std::move(s)), st, t.offset());
}

// t broadcast to `shape` (NumPy rules, dims aligned from the right): a size-1 dim of t, or a
// leading dim t lacks, takes any size with stride 0; -1 keeps t's size. Writing through the
// result writes one element many times: treat it as read-only.
template <class T>
Tensor<T> expand(const Tensor<T>& t, const Shape& shape) {
  constexpr std::string_view op = "expand";
  detail::check_view_input(op, t);
  const int r = shape.rank(), lead = r - t.rank();
  CUTRAIN_REQUIRE(lead >= 0, InvalidArgument, op, "cannot expand ", t.describe(), " to ", shape,
                  ": the target has fewer dims");
  std::vector<std::int64_t> s(static_cast<std::size_t>(r));
  Strides st(static_cast<std::size_t>(r), 0);
  for (int d = 0; d < r; ++d) {
    const std::int64_t want = shape[d];
    const auto ud = static_cast<std::size_t>(d);
    if (d < lead) {
      CUTRAIN_REQUIRE(want >= 0, InvalidArgument, op, "cannot expand ", t.describe(), " to ", shape, ": new leading dim ",
                      d, " must be non-negative, got ", want);
      s[ud] = want;
      continue;
    }
    const std::int64_t have = t.dim(d - lead);
    const std::int64_t size = want == -1 ? have : want;
    CUTRAIN_REQUIRE(size == have || (have == 1 && size >= 0), InvalidArgument, op, "cannot expand ", t.describe(),
                    " to ", shape, ": dim ", d, " has size ", have, " (only size-1 dims can grow), asked for ", want);
    s[ud] = size;
    st[ud] = size == have ? t.strides()[static_cast<std::size_t>(d - lead)] : 0;
  }
  return t.as_strided(Shape(std::move(s)), st, t.offset());
}

}  // namespace cutrain::inline CUTRAIN_ABI
