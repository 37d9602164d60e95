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

// The CPU backend computes in f32 and f64 only.
template <class T>
[[noreturn]] void cpu_dtype_unsupported(std::string_view op) {
  throw NotImplemented(op, cutrain::detail::cat("the CPU backend computes in f32 and f64, got ", dtype_of<T>));
}

}  // namespace cutrain::ops::detail
