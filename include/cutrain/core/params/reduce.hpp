// Reductions over a set of axes (sum, mean, max, min, var, norm): the axes a caller names,
// checked and normalized once, and the split of the input's dimensions into kept and reduced
// ones that the CPU and CUDA backends both walk. Shared by cpu/reduce.hpp, cuda/kernels/reduce.hpp
// and ops/reduce.hpp, so that both backends accept exactly the same inputs.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/shape.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI {

// The axes to reduce over: negative ones count from the end (-1 is the last); empty means all.
using Axes = std::vector<int>;

// The highest rank a reduction takes (the GPU kernels' fixed-size index arrays).
inline constexpr int max_reduce_rank = 8;

// The values and the (int32) indices of a max or min: indices[o] is the position of the chosen
// element among output o's reduced elements, counted row-major over the reduced axes (for one
// axis, its coordinate along that axis).
template <class T>
struct ArgReduce {
  Tensor<T> values;
  Tensor<std::int32_t> indices;
};

// One reduction's geometry: which of the input's axes are reduced, and the output's shape.
struct ReducePlan {
  Shape in_shape;
  std::vector<bool> reduced;  // per input axis
  Shape out_shape;            // keepdim: 1 at each reduced axis; else the reduced axes removed
  bool keepdim = false;
  std::int64_t n_out = 1;  // output elements
  std::int64_t n_red = 1;  // input elements per output element
};

namespace detail {
inline std::string axes_str(const Axes& axes) {
  std::string s = "{";
  for (std::size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + std::to_string(axes[i]);
  return s + "}";
}
}  // namespace detail

// Checks the axes against the input's shape and makes the plan: InvalidArgument (naming op,
// the shape and the axes) for a rank above max_reduce_rank, an axis out of range or an axis
// named twice (also as i and i - rank).
inline ReducePlan make_reduce_plan(std::string_view op, const Shape& in, const Axes& axes, bool keepdim) {
  const int r = in.rank();
  CUTRAIN_REQUIRE(r <= max_reduce_rank, InvalidArgument, op, "takes tensors of rank at most ", max_reduce_rank,
                  ", got shape ", in);
  ReducePlan p;
  p.in_shape = in;
  p.keepdim = keepdim;
  p.reduced.assign(static_cast<std::size_t>(r), axes.empty());
  if (!axes.empty()) {
    for (int a : axes) {
      CUTRAIN_REQUIRE(a >= -r && a < r, InvalidArgument, op, "axis ", a, " is out of range for shape ", in, " (rank ", r,
                      ", axes ", detail::axes_str(axes), ")");
      const auto k = static_cast<std::size_t>(a < 0 ? a + r : a);
      CUTRAIN_REQUIRE(!p.reduced[k], InvalidArgument, op, "axis ", k, " is named twice in axes ", detail::axes_str(axes),
                      " for shape ", in);
      p.reduced[k] = true;
    }
  }
  std::vector<std::int64_t> out;
  for (int d = 0; d < r; ++d) {
    if (p.reduced[static_cast<std::size_t>(d)]) {
      p.n_red *= in[d];
      if (keepdim) out.push_back(1);
    } else {
      p.n_out *= in[d];
      out.push_back(in[d]);
    }
  }
  p.out_shape = Shape(std::move(out));
  return p;
}

// The strides at which a tensor of the plan's output shape (strides `out`) is read at the
// input's coordinates: its own stride at each kept axis, 0 at each reduced one.
inline Strides broadcast_strides(const ReducePlan& p, const Strides& out) {
  const int r = p.in_shape.rank();
  Strides s(static_cast<std::size_t>(r), 0);
  std::size_t k = 0;
  for (int d = 0; d < r; ++d) {
    const auto ud = static_cast<std::size_t>(d);
    if (!p.reduced[ud]) s[ud] = out[k++];
    else if (p.keepdim) ++k;
  }
  return s;
}

// Per input axis, the weight of its coordinate in the row-major index over the reduced axes
// (what ArgReduce::indices holds); 0 at kept axes.
inline Strides reduced_index_strides(const ReducePlan& p) {
  const int r = p.in_shape.rank();
  Strides s(static_cast<std::size_t>(r), 0);
  std::int64_t w = 1;
  for (int d = r - 1; d >= 0; --d) {
    if (!p.reduced[static_cast<std::size_t>(d)]) continue;
    s[static_cast<std::size_t>(d)] = w;
    w *= p.in_shape[d];
  }
  return s;
}

// The kept (reduced == false) or reduced axes of x: their sizes and x's strides, in axis order.
template <class T>
void split_axes(const ReducePlan& p, const Tensor<T>& x, bool reduced, std::vector<std::int64_t>& sizes,
                Strides& strides) {
  sizes.clear();
  strides.clear();
  for (int d = 0; d < x.rank(); ++d) {
    if (p.reduced[static_cast<std::size_t>(d)] != reduced) continue;
    sizes.push_back(x.dim(d));
    strides.push_back(x.strides()[static_cast<std::size_t>(d)]);
  }
}

}  // namespace cutrain::inline CUTRAIN_ABI
