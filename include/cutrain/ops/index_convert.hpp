// Index and label tensors as the int32 tensors the kernels read. cutrain's index ops, Embedding
// and the cross-entropies take int32 or int64 (what PyTorch and NumPy hand over); the backends
// index with int32, so an int64 tensor (or an int32 one under wrap_negative) becomes a dense
// int32 copy on its own device: on the CPU in one scan, on the GPU in one kernel
// (cuda::kernels::index_narrow) whose 24-byte report is read back (a stream synchronization).
// A value that does not fit is an error only because it is out of range anyway (dims and class
// counts are below 2^31). Under CUDA graph capture there is no read-back: a bad value becomes a
// fallback that is itself out of range, so the kernels give what they give for any bad index
// (NaN forward, nothing added backward, a NaN loss). docs/ops/shape_ops.md.
#pragma once

#include "cutrain/core/abi.hpp"

#include <concepts>
#include <cstdint>
#include <limits>
#include <string_view>
#include <utility>

#include "cutrain/core/check.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/index.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

// The element types an index or a label tensor may have.
template <class I>
concept IndexInt = std::same_as<I, std::int32_t> || std::same_as<I, std::int64_t>;

// index_select and gather: PyTorch's semantics by default (an index in [0, size)); with
// wrap_negative, NumPy's take and ONNX Gather's (an index in [-size, size), -1 the last).
struct IndexOptions {
  bool wrap_negative = false;
};

// How many index values are bad, the first one (in row-major order of the index) and its position
// there; position is -1 where the check does not know it (the GPU check of int32 indices, which
// reports any one bad value).
struct IndexRangeReport {
  std::int64_t bad = 0;
  std::int64_t value = 0;
  std::int64_t position = -1;
};

namespace detail {

// index as a dense int32 tensor of its shape on its device: each value v as w = v (+ wrap when
// v < 0 and wrap > 0); a w outside [lo, hi) is written as fallback and reported. Under CUDA graph
// capture the report stays empty (nothing is read back).
template <IndexInt I>
std::pair<Tensor<std::int32_t>, IndexRangeReport> narrow_index([[maybe_unused]] std::string_view op,
                                                               const Tensor<I>& index, std::int64_t lo, std::int64_t hi,
                                                               std::int64_t wrap, std::int32_t fallback) {
  Tensor<std::int32_t> out(index.shape(), {.device = index.device()});
  IndexRangeReport rep;
  if (index.numel() == 0) return {std::move(out), rep};
  if (index.device().is_cpu()) {
    std::int32_t* o = out.data();
    cutrain::detail::for_each_offset(index.shape(), index.strides(), 0, [&](std::int64_t i, std::int64_t off) {
      const std::int64_t v = index.data()[off];
      const std::int64_t w = v < 0 && wrap > 0 ? v + wrap : v;
      if (w >= lo && w < hi) {
        o[i] = static_cast<std::int32_t>(w);
        return;
      }
      o[i] = fallback;
      if (rep.bad++ == 0) {
        rep.value = v;
        rep.position = i;
      }
    });
    return {std::move(out), rep};
  }
#ifdef CUTRAIN_WITH_CUDA
  Tensor<std::int64_t> report(Shape{3}, {.device = index.device()});
  cuda::kernels::index_narrow(index, lo, hi, wrap, fallback, out, report);
  if (!cutrain::detail::device_capturing()) {
    const auto r = report.to_vector();
    rep = IndexRangeReport{r[0], r[1], r[2]};
  }
#else
  cutrain::detail::device_backend(op);  // throws: no backend for a device tensor
#endif
  return {std::move(out), rep};
}

// The int32 index an index op runs with: a view of index when it is int32 and nothing wraps
// (check_int32(index) checks it then), else a converted copy; every value checked against [0, size) ([-size, size) with
// wrap_negative) before any op runs: InvalidArgument naming the op, the first bad value, its
// position, dim d and its size. Under CUDA graph capture there is no check (see above).
template <IndexInt I, class CheckInt32>
Tensor<std::int32_t> index_as_i32(std::string_view op, const Tensor<I>& index, std::int64_t size, int d,
                                  const Shape& x_shape, const IndexOptions& o, CheckInt32&& check_int32) {
  if constexpr (std::same_as<I, std::int32_t>) {
    if (!o.wrap_negative) {
      check_int32(index);  // the int32 check of the caller, as before int64 existed
      return index.view();
    }
  }
  auto [out, r] = narrow_index(op, index, 0, size, o.wrap_negative ? size : 0, -1);
  const std::int64_t from = o.wrap_negative ? -size : 0;
  CUTRAIN_REQUIRE(r.bad == 0, InvalidArgument, op, "index value ", r.value, " at position ", r.position,
                  " of index ", index.describe(), " is out of range for dim ", d, " of size ", size, " (x shape ",
                  x_shape, "; ", r.bad, " of the ", index.numel(), " index values are outside [", from, ", ", size,
                  ")", o.wrap_negative ? "" : "; negative indices count from the end only with wrap_negative", ")");
  return std::move(out);
}

// int64 labels as int32: every value must fit int32 (else InvalidArgument naming the op, the
// value and its position: no class count reaches 2^31, so such a label is out of range anyway).
// Under CUDA graph capture a value that does not fit becomes -1 (-2 when ignore_index is -1):
// out of range, and not ignored, so the loss kernels turn it into NaN as any bad label.
inline Tensor<std::int32_t> labels_as_i32(std::string_view op, const Tensor<std::int64_t>& labels,
                                          std::int64_t ignore_index = -100) {
  check::defined(op, labels, "labels");
  constexpr std::int64_t lo = std::numeric_limits<std::int32_t>::min();
  constexpr std::int64_t hi = std::int64_t{std::numeric_limits<std::int32_t>::max()} + 1;
  auto [out, r] = narrow_index(op, labels, lo, hi, 0, ignore_index == -1 ? -2 : -1);
  CUTRAIN_REQUIRE(r.bad == 0, InvalidArgument, op, "label ", r.value, " at index ", r.position, " of labels ",
                  labels.describe(), " does not fit int32, so it is no class (", r.bad, " such labels)");
  return std::move(out);
}

}  // namespace detail
}  // namespace cutrain::inline CUTRAIN_ABI::ops
