// Element type conversion of a whole tensor on the host (device tensors round-trip through the
// host; ops::cast converts them on the GPU). f16/bf16 round to nearest even; an integer to an
// integer converts as static_cast does (no detour through double, which would round an i64).
#pragma once

#include "cutrain/core/abi.hpp"

#include <type_traits>
#include <vector>

#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI {

template <class U, class T>
Tensor<U> cast(const Tensor<T>& t) {
  CUTRAIN_REQUIRE(t.defined(), InvalidArgument, "cast", "input is an empty (undefined) tensor");
  const auto v = t.to_vector();
  std::vector<U> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<U, half> || std::is_same_v<U, bfloat16>) out[i] = U(static_cast<float>(v[i]));
    else if constexpr (std::is_integral_v<U> && std::is_integral_v<T>) out[i] = static_cast<U>(v[i]);  // exact for i64
    else out[i] = static_cast<U>(static_cast<double>(v[i]));
  }
  const Layout l = is_channels_last(t.shape(), t.strides()) ? Layout::nhwc : Layout::row_major;
  return Tensor<U>::from_vector(out, t.shape(), {.layout = l, .device = t.device()});
}

}  // namespace cutrain::inline CUTRAIN_ABI
