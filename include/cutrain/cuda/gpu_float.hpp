// The element types the CUDA backend computes in: f32, bf16 and f16 (f32 accumulation).
#pragma once

#include "cutrain/core/abi.hpp"

#include <concepts>

#include "cutrain/core/dtype.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda {

template <class T>
concept GpuFloat = std::same_as<T, float> || std::same_as<T, half> || std::same_as<T, bfloat16>;

}  // namespace cutrain::inline CUTRAIN_ABI::cuda
