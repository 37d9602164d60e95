// Joining and splitting tensors along a dim: concat, stack (new contiguous row-major tensors),
// split and chunk (views of the input, no copy). Every dtype, either device: concat and stack
// copy each input into its slice of the output with Tensor::copy_from, which on the GPU is the
// strided copy kernel (cuda/kernels/copy.hpp) on the current stream, never the host
// (docs/ops/shape_ops.md). The differentiable versions are in autograd/functions/shape_ops.hpp.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/core/view.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/copy.hpp"  // installs the device path of Tensor::copy_from
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// Device copies go through the strided copy kernel, which takes rank 0 to 8.
inline constexpr int max_device_copy_rank = 8;

// The output shape of joining `tensors` along dim d (already wrapped): every tensor defined, of
// the first one's rank, device and shape save along d (or all along d too when `same_shape`).
template <class T>
Shape join_shape(std::string_view op, const std::vector<const Tensor<T>*>& tensors, int d, bool same_shape) {
  const Tensor<T>& first = *tensors.front();
  std::int64_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor<T>& t = *tensors[i];
    CUTRAIN_REQUIRE(t.defined(), InvalidArgument, op, "tensor ", i, " is undefined (default-constructed)");
    CUTRAIN_REQUIRE(t.device() == first.device(), DeviceError, op, "tensor ", i, " is ", t.describe(),
                    ", tensor 0 is ", first.describe(), ": all must be on one device");
    CUTRAIN_REQUIRE(t.rank() == first.rank(), InvalidArgument, op, "tensor ", i, " has shape ", t.shape(), " (rank ",
                    t.rank(), "), tensor 0 has shape ", first.shape(), " (rank ", first.rank(), ")");
    for (int k = 0; k < t.rank(); ++k) {
      if (k == d && !same_shape) continue;
      CUTRAIN_REQUIRE(t.dim(k) == first.dim(k), InvalidArgument, op, "tensor ", i, " has shape ", t.shape(),
                      ", tensor 0 has shape ", first.shape(), ": they differ in dim ", k,
                      same_shape ? " (all must have one shape)" : cutrain::detail::cat(" (only dim ", d, " may differ)"));
    }
    total += d < t.rank() ? t.dim(d) : 1;
  }
  std::vector<std::int64_t> s = first.shape().dims();
  if (same_shape) s.insert(s.begin() + d, static_cast<std::int64_t>(tensors.size()));
  else s[static_cast<std::size_t>(d)] = total;
  const Shape out(std::move(s));
  CUTRAIN_REQUIRE(first.device().is_cpu() || out.rank() <= max_device_copy_rank, NotImplemented, op,
                  "device copies take rank 0 to ", max_device_copy_rank, ", the output would have shape ", out);
  return out;
}

// The tensors of a list, checked to be there: at least one, none a null pointer.
template <class T>
std::vector<const Tensor<T>*> tensor_list(std::string_view op, std::vector<const Tensor<T>*> tensors) {
  CUTRAIN_REQUIRE(!tensors.empty(), InvalidArgument, op, "needs at least one tensor, got an empty list");
  for (std::size_t i = 0; i < tensors.size(); ++i)
    CUTRAIN_REQUIRE(tensors[i] != nullptr, InvalidArgument, op, "tensor ", i, " is a null pointer");
  CUTRAIN_REQUIRE(tensors.front()->defined(), InvalidArgument, op, "tensor 0 is undefined (default-constructed)");
  return tensors;
}

template <class T>
std::vector<const Tensor<T>*> pointers(const std::vector<Tensor<T>>& tensors) {
  std::vector<const Tensor<T>*> p;
  p.reserve(tensors.size());
  for (const Tensor<T>& t : tensors) p.push_back(&t);
  return p;
}

template <class T>
Tensor<T> concat(std::string_view op, const std::vector<const Tensor<T>*>& tensors, int dim) {
  const Tensor<T>& first = *tensors.front();
  CUTRAIN_REQUIRE(first.rank() > 0, InvalidArgument, op, "cannot concatenate 0-d tensors (tensor 0 is ",
                  first.describe(), "); use stack");
  const int d = cutrain::detail::wrap_dim(op, dim, first.rank(), first.shape());
  Tensor<T> out(join_shape(op, tensors, d, false), {.device = first.device()});
  std::int64_t at = 0;
  for (const Tensor<T>* t : tensors) {
    const std::int64_t n = t->dim(d);
    if (t->numel() > 0) out.slice(d, at, at + n).copy_from(*t);
    at += n;
  }
  return out;
}

template <class T>
Tensor<T> stack(std::string_view op, const std::vector<const Tensor<T>*>& tensors, int dim) {
  const Tensor<T>& first = *tensors.front();
  const int d = cutrain::detail::wrap_dim(op, dim, first.rank() + 1, first.shape());
  Tensor<T> out(join_shape(op, tensors, d, true), {.device = first.device()});
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto k = static_cast<std::int64_t>(i);
    if (tensors[i]->numel() > 0) cutrain::squeeze(out.slice(d, k, k + 1), d).copy_from(*tensors[i]);
  }
  return out;
}
}  // namespace detail

// The tensors joined along dim (negative counts from the end), which must exist in each: all of
// one rank and device, equal in every other dim. A new row-major tensor on their device.
// Tensors are move-only: pass a vector of them (split's result, say), or their addresses,
// concat({&a, &b}, 1).
template <class T>
Tensor<T> concat(const std::vector<Tensor<T>>& tensors, int dim = 0) {
  return detail::concat("concat", detail::tensor_list("concat", detail::pointers(tensors)), dim);
}
template <class T>
Tensor<T> concat(std::initializer_list<const Tensor<T>*> tensors, int dim = 0) {
  return detail::concat("concat", detail::tensor_list<T>("concat", tensors), dim);
}

// The tensors, all of one shape and device, stacked along a new dim `dim` of the result (in
// [-rank-1, rank]). A new row-major tensor on their device. Lists as for concat.
template <class T>
Tensor<T> stack(const std::vector<Tensor<T>>& tensors, int dim = 0) {
  return detail::stack("stack", detail::tensor_list("stack", detail::pointers(tensors)), dim);
}
template <class T>
Tensor<T> stack(std::initializer_list<const Tensor<T>*> tensors, int dim = 0) {
  return detail::stack("stack", detail::tensor_list<T>("stack", tensors), dim);
}

// Views of x along dim, of the given sizes (each >= 0, summing to x's size in dim), in order.
template <class T>
std::vector<Tensor<T>> split(const Tensor<T>& x, const std::vector<std::int64_t>& sizes, int dim = 0) {
  constexpr std::string_view op = "split";
  CUTRAIN_REQUIRE(x.defined(), InvalidArgument, op, "x is undefined (default-constructed)");
  const int d = cutrain::detail::wrap_dim(op, dim, x.rank(), x.shape());
  CUTRAIN_REQUIRE(!sizes.empty(), InvalidArgument, op, "needs at least one size, got none for ", x.describe());
  std::int64_t total = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    CUTRAIN_REQUIRE(sizes[i] >= 0, InvalidArgument, op, "size ", i, " is ", sizes[i], ", must be >= 0 (x ",
                    x.describe(), ")");
    total += sizes[i];
  }
  CUTRAIN_REQUIRE(total == x.dim(d), InvalidArgument, op, "sizes ", Shape(sizes), " sum to ", total, ", but dim ", d,
                  " of ", x.describe(), " has size ", x.dim(d));
  std::vector<Tensor<T>> out;
  out.reserve(sizes.size());
  std::int64_t at = 0;
  for (const std::int64_t n : sizes) {
    out.push_back(x.slice(d, at, at + n));
    at += n;
  }
  return out;
}

// The sizes that split x's dim of size n into pieces of `size` (> 0), the last one smaller when
// size does not divide n; one empty piece when n is 0, as PyTorch.
inline std::vector<std::int64_t> split_sizes(std::string_view op, std::int64_t n, std::int64_t size) {
  CUTRAIN_REQUIRE(size > 0, InvalidArgument, op, "the piece size must be positive, got ", size);
  std::vector<std::int64_t> sizes;
  for (std::int64_t at = 0; at < n; at += size) sizes.push_back(std::min(size, n - at));
  if (sizes.empty()) sizes.push_back(0);
  return sizes;
}

// Views of x along dim, each of `size` elements but the last (PyTorch's split with an int).
template <class T>
std::vector<Tensor<T>> split(const Tensor<T>& x, std::int64_t size, int dim = 0) {
  constexpr std::string_view op = "split";
  CUTRAIN_REQUIRE(x.defined(), InvalidArgument, op, "x is undefined (default-constructed)");
  const int d = cutrain::detail::wrap_dim(op, dim, x.rank(), x.shape());
  return split(x, split_sizes(op, x.dim(d), size), d);
}

// At most n (> 0) views of x along dim, each of ceil(size / n) elements but the last (PyTorch's
// chunk: fewer than n when the pieces run out first).
template <class T>
std::vector<Tensor<T>> chunk(const Tensor<T>& x, std::int64_t n, int dim = 0) {
  constexpr std::string_view op = "chunk";
  CUTRAIN_REQUIRE(x.defined(), InvalidArgument, op, "x is undefined (default-constructed)");
  CUTRAIN_REQUIRE(n > 0, InvalidArgument, op, "the number of chunks must be positive, got ", n, " (x ", x.describe(), ")");
  const int d = cutrain::detail::wrap_dim(op, dim, x.rank(), x.shape());
  const std::int64_t size = x.dim(d) == 0 ? 1 : (x.dim(d) + n - 1) / n;
  return split(x, split_sizes(op, x.dim(d), size), d);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
