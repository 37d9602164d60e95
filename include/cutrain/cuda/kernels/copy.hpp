// Strided copies on the GPU (NVRTC kernel): Tensor::copy_from between two layouts of one device
// (NCHW to NHWC, a slice into a contiguous tensor, a strided view made contiguous) runs here,
// on the current stream, instead of through the host. Including this header adds it to the CUDA
// backend (cutrain::detail::DeviceBackend::strided_copy), where Tensor::copy_from finds it
// whatever the translation unit included; nvrtc.hpp, and so every kernel header, and cutrain.hpp
// include it.
#pragma once

#include "cutrain/core/abi.hpp"

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/ needs CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"  // programs::copy, the kernels of copy.cuh

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
// StridedCopy::Dims goes to the kernel as its cutrain_copy_args: three arrays of 8 long long, then
// an int (padded to 8 bytes).
static_assert(sizeof(cutrain::detail::StridedCopy::Dims) == 3 * 8 * sizeof(long long) + 8 &&
              sizeof(std::int64_t) == sizeof(long long));

inline const Program& copy_program() {
  static const Program p = programs::copy();
  return p;
}

inline void strided_copy(const cutrain::detail::StridedCopy& c) {
  constexpr std::string_view op = "Tensor::copy_from";
  const auto& dims = c.dims;
  CUTRAIN_REQUIRE(dims.rank >= 0 && dims.rank <= 8, InvalidArgument, op, "a device copy takes rank 0 to 8, got ",
                  dims.rank);
  const char* kernel = c.elem_bytes == 1   ? "cutrain_copy_1"
                       : c.elem_bytes == 2 ? "cutrain_copy_2"
                       : c.elem_bytes == 4 ? "cutrain_copy_4"
                       : c.elem_bytes == 8 ? "cutrain_copy_8"
                                           : nullptr;
  CUTRAIN_REQUIRE(kernel, NotImplemented, op, "no device copy for ", c.elem_bytes, "-byte elements");
  long long n = 1;
  for (int d = 0; d < dims.rank; ++d) n *= dims.shape[d];
  if (n == 0) return;
  DeviceScope scope(c.device);
  launch(function(c.device, copy_program(), kernel), grid_for(n), 256, op, c.dst, c.src, n, dims);
}

inline const bool strided_copy_installed = (cutrain::detail::device_backend_slot().strided_copy = &strided_copy, true);
}  // namespace detail

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
