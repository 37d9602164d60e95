// ops::cast<U>(x): element type conversion on x's device, rounding to nearest even (f16, bf16).
// CPU tensors convert on the host (cutrain::cast); GPU tensors with the NVRTC kernel of
// cuda/kernels/cast.hpp, between f32, bf16 and f16, so a cast can run inside a CUDA graph.
#pragma once

#include "cutrain/core/abi.hpp"

#include <concepts>

#include "cutrain/core/cast.hpp"
#include "cutrain/ops/dispatch.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/cast.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// Every pair of types on the CPU; f32, bf16 and f16 on the GPU.
template <class U, class T>
struct CastDtypes {
  static constexpr bool cpu = true, gpu = cuda::GpuFloat<T> && cuda::GpuFloat<U>;
  [[noreturn]] static void gpu_unsupported(std::string_view op, const Tensor<T>& x) {
    throw NotImplemented(op, cutrain::detail::cat("the CUDA backend casts between f32, bf16 and f16, not from ",
                                                  dtype_of<T>, " to ", dtype_of<U>, " (", x.describe(), ")"));
  }
};
}  // namespace detail

// x converted to U; nhwc when x is nhwc, else row-major. U == T gives a view of x (no copy).
template <class U, class T>
Tensor<U> cast(const Tensor<T>& x) {
  constexpr std::string_view op = "cast";
  check::defined(op, x, "x");
  if constexpr (std::same_as<U, T>) {
    return x.view();
  } else {
    return detail::dispatch<Tensor<U>, detail::CastDtypes<U, T>>(
        op, [](const auto& x) { return cutrain::cast<U>(x); },
        CUTRAIN_IF_CUDA([](const auto& x) { return cuda::kernels::cast<U>(x); }), x);
  }
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops
