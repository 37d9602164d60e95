// How ops/ chooses a backend: by the device of the tensors, at run time. Every op checks its
// arguments, then ends in dispatch(), which checks that the tensors share a device and runs the
// op's CPU or CUDA implementation (or says why it cannot):
//
//   return detail::dispatch<Tensor<T>>(op,
//       [&](const auto& a, const auto& b) { return cpu::add(a, b); },
//       CUTRAIN_IF_CUDA([&](const auto& a, const auto& b) { ...cuda::kernels::add(a, b, y)... }),
//       a, b);
//
// Both implementations take the tensors as auto parameters, so that their bodies are compiled
// only for the element types the backend computes in.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>

#include <concepts>
#include <new>
#include <stdexcept>
#include <string_view>
#include <type_traits>

#include "cutrain/core/check.hpp"
#include "cutrain/core/profile.hpp"
#include "cutrain/cuda/gpu_float.hpp"

// The one place ops/ asks whether this translation unit has the CUDA backend: the CUDA
// implementation is compiled only then, and is otherwise replaced by a stand-in that throws.
#ifdef CUTRAIN_WITH_CUDA
#define CUTRAIN_IF_CUDA(...) __VA_ARGS__
#else
#define CUTRAIN_IF_CUDA(...) ::cutrain::ops::detail::NoCuda {}
#endif

namespace cutrain::inline CUTRAIN_ABI::ops::detail {

// A new output of `shape` on like's device, nhwc when `like` is nhwc (else row-major/nchw).
template <class T, class U>
Tensor<T> device_output(const Shape& shape, const Tensor<U>& like) {
  const Layout l = shape.rank() == 4 && like.layout() == Layout::nhwc ? Layout::nhwc : Layout::row_major;
  return Tensor<T>(shape, {.layout = l, .device = like.device()});
}

// t itself where its data is 16-byte aligned, else a copy in its own (aligned) storage: cuDNN's
// engines refuse a misaligned pointer (CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER at execute), and
// a view of a slice can start anywhere.
template <class T>
Tensor<T> aligned16(const Tensor<T>& t) {
  if (reinterpret_cast<std::uintptr_t>(t.data()) % 16 == 0) return t.view();
  return t.clone(t.is_contiguous() ? t.layout() : Layout::row_major);
}

// t contiguous in layout l, in 16-byte-aligned storage (see aligned16).
template <class T>
Tensor<T> contiguous_aligned(const Tensor<T>& t, Layout l) {
  Tensor<T> c = t.contiguous(l);
  if (reinterpret_cast<std::uintptr_t>(c.data()) % 16 == 0) return c;
  return c.clone(l);
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

// What element types each backend computes an op in, and what it throws for the others (given
// the op and the first tensor). Float is the default: f32 and f64 on the CPU, f32, bf16 and f16
// on the GPU.
template <class T>
struct FloatDtypes {
  static constexpr bool cpu = CpuFloat<T>, gpu = cuda::GpuFloat<T>;
  [[noreturn]] static void cpu_unsupported(std::string_view op, const auto&) { cpu_dtype_unsupported<T>(op); }
  [[noreturn]] static void gpu_unsupported(std::string_view op, const auto&) { gpu_dtype_unsupported<T>(op); }
};

// x in T, parameters and statistics in S: S == T on the CPU, S == float on the GPU.
template <class T, class S>
struct NormDtypes {
  static constexpr bool cpu = CpuFloat<T> && std::same_as<T, S>, gpu = cuda::GpuFloat<T> && std::same_as<S, float>;
  [[noreturn]] static void cpu_unsupported(std::string_view op, const auto& x) {
    norm_dtypes_unsupported<T, S>(op, x.device());
  }
  [[noreturn]] static void gpu_unsupported(std::string_view op, const auto& x) {
    norm_dtypes_unsupported<T, S>(op, x.device());
  }
};

// Data movement: every element type on both backends.
struct AnyDtype {
  static constexpr bool cpu = true, gpu = true;
};

// CUTRAIN_IF_CUDA's stand-in for a CUDA implementation in a translation unit without CUDA.
struct NoCuda {};

// The device of first, after checking that every other defined tensor is on it (an undefined
// one, such as an absent bias, is on no device).
template <class T, class... Rest>
Device common_device([[maybe_unused]] std::string_view op, const Tensor<T>& first, const Rest&... rest) {
  ((rest.defined() ? void(check::same_device(op, first, rest)) : void()), ...);
  return first.device();
}

// Whether t is a view with a negative stride (reversed: slice with a negative step, flip).
template <class T>
bool reversed(const Tensor<T>& t) {
  if (!t.defined()) return false;
  for (auto s : t.strides())
    if (s < 0) return true;
  return false;
}
// t, or for a reversed view a row-major copy: the backends (cuDNN, cuBLAS, oneDNN, the kernels)
// take non-negative strides.
template <class T>
Tensor<T> unreversed(const Tensor<T>& t) {
  return reversed(t) ? t.contiguous(Layout::row_major) : t.view();
}

// Runs cpu(tensors...) or gpu(tensors...) by the tensors' device (timed by core/profile.hpp while a
// profiling session records; reversed views passed as row-major copies), or throws: DeviceError for
// tensors on different devices or for CUDA tensors without the CUDA backend, NotImplemented for
// an element type the backend does not compute in (Dtypes; void means FloatDtypes of the first
// tensor's type); OutOfMemory, naming op, for memory either backend could not get.
template <class R, class Dtypes, class Cpu, class Gpu, class T, class... Rest>
R dispatch_to(std::string_view op, [[maybe_unused]] Cpu&& cpu, [[maybe_unused]] Gpu&& gpu, const Tensor<T>& first,
              const Rest&... rest) {
  using D = std::conditional_t<std::is_void_v<Dtypes>, FloatDtypes<T>, Dtypes>;
  const Device dev = common_device(op, first, rest...);
  [[maybe_unused]] const profile::OpScope timed(op, dev);  // while a profile::Session records
  if (dev.is_cpu()) {
    if constexpr (D::cpu) {
      // The CPU implementations' scratch buffers are std::vectors: what they throw for sizes the
      // host cannot hold becomes an Error naming the op.
      try {
        return cpu(first, rest...);
      } catch (const std::bad_alloc&) {
        throw OutOfMemory(op, cutrain::detail::cat("out of host memory computing on ", first.describe()));
      } catch (const std::length_error& e) {
        throw OutOfMemory(op, cutrain::detail::cat("a buffer for ", first.describe(), " is too large (", e.what(), ")"));
      }
    } else {
      D::cpu_unsupported(op, first);
    }
  } else if constexpr (std::same_as<std::remove_cvref_t<Gpu>, NoCuda>) {
    cutrain::detail::no_cuda(op);
  } else if constexpr (D::gpu) {
    // Device memory ran out (the caching allocator has freed its cache and retried): the error
    // names this op, and the process can go on (a smaller batch, say).
    try {
      return gpu(first, rest...);
    } catch (const OutOfMemory& e) {
      if (e.op() == op) throw;
      throw OutOfMemory(op, cutrain::detail::cat(cutrain::detail::reason_of(e), " (computing on ", first.describe(), ")"));
    }
  } else {
    D::gpu_unsupported(op, first);
  }
}

template <class R, class Dtypes = void, class Cpu, class Gpu, class T, class... Rest>
R dispatch(std::string_view op, Cpu&& cpu, Gpu&& gpu, const Tensor<T>& first, const Rest&... rest) {
  if ((reversed(first) || ... || reversed(rest)))
    return dispatch_to<R, Dtypes>(op, std::forward<Cpu>(cpu), std::forward<Gpu>(gpu), unreversed(first),
                                  unreversed(rest)...);
  return dispatch_to<R, Dtypes>(op, std::forward<Cpu>(cpu), std::forward<Gpu>(gpu), first, rest...);
}

}  // namespace cutrain::inline CUTRAIN_ABI::ops::detail
