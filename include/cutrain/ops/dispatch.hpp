// How ops/ chooses a backend: by the device of the tensors, at run time.
#pragma once

#include <string_view>

#include "cutrain/core/check.hpp"

namespace cutrain::ops::detail {

// Checks that all tensors share a device. Returns true for the CPU; for CUDA, throws until the
// op has a CUDA implementation (the CUDA backend replaces these calls op by op).
template <class T, class... Rest>
bool use_cpu(std::string_view op, const Tensor<T>& first, const Rest&... rest) {
  const Device d = check::same_device(op, first, rest...);
  if (d.is_cpu()) return true;
  if constexpr (!built_with_cuda) cutrain::detail::no_cuda(op);
  throw NotImplemented(op, cutrain::detail::cat("not implemented on CUDA yet (tensors on ", d, ")"));
}

// For ops with a CUDA implementation: checks that all tensors share a device and returns true
// for the CPU, false for CUDA (throwing when this build has no CUDA).
template <class T, class... Rest>
bool on_cpu(std::string_view op, const Tensor<T>& first, const Rest&... rest) {
  const Device d = check::same_device(op, first, rest...);
  if (d.is_cpu()) return true;
  if constexpr (!built_with_cuda) cutrain::detail::no_cuda(op);
  return false;
}

// A new output of `shape` on like's device, nhwc when `like` is nhwc (else row-major/nchw).
template <class T, class U>
Tensor<T> device_output(const Shape& shape, const Tensor<U>& like) {
  const Layout l = shape.rank() == 4 && like.layout() == Layout::nhwc ? Layout::nhwc : Layout::row_major;
  return Tensor<T>(shape, {.layout = l, .device = like.device()});
}

// The contiguous layout an elementwise op computes in: nhwc for an nhwc tensor, else row-major.
template <class T>
Layout elementwise_layout(const Tensor<T>& t) {
  return t.rank() == 4 && t.layout() == Layout::nhwc ? Layout::nhwc : Layout::row_major;
}

// The CUDA backend computes in f32, bf16 and f16.
template <class T>
[[noreturn]] void gpu_dtype_unsupported(std::string_view op) {
  throw NotImplemented(op, cutrain::detail::cat("the CUDA backend computes in f32, bf16 and f16, got ", dtype_of<T>));
}

// Normalization keeps its parameters and statistics in S: the CPU wants S == T, the GPU S == float.
template <class T, class S>
[[noreturn]] void norm_dtypes_unsupported(std::string_view op, Device d) {
  throw NotImplemented(op, cutrain::detail::cat("x in ", dtype_of<T>, " with parameters and statistics in ", dtype_of<S>,
                                                " on ", d, ": the CPU needs them in x's dtype (f32/f64), the GPU in f32"));
}

// The CPU backend computes in f32 and f64 only.
template <class T>
[[noreturn]] void cpu_dtype_unsupported(std::string_view op) {
  throw NotImplemented(op, cutrain::detail::cat("the CPU backend computes in f32 and f64, got ", dtype_of<T>));
}

}  // namespace cutrain::ops::detail
