// Argument checks shared by every op: each throws an Error that names the op and the tensors.
#pragma once

#include "cutrain/core/abi.hpp"

#include <initializer_list>
#include <string_view>

#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI::check {

template <class T>
void defined(std::string_view op, const Tensor<T>& t, std::string_view name) {
  CUTRAIN_REQUIRE(t.defined(), InvalidArgument, op, name, " is an empty (undefined) tensor");
}

template <class T>
void rank(std::string_view op, const Tensor<T>& t, int r, std::string_view name) {
  defined(op, t, name);
  CUTRAIN_REQUIRE(t.rank() == r, InvalidArgument, op, name, " must be ", r, "-d, got ", t.describe());
}

template <class T>
void shape(std::string_view op, const Tensor<T>& t, const Shape& want, std::string_view name) {
  defined(op, t, name);
  CUTRAIN_REQUIRE(t.shape() == want, InvalidArgument, op, name, " must have shape ", want, ", got ", t.describe());
}

template <class T>
void non_empty(std::string_view op, const Tensor<T>& t, std::string_view name) {
  defined(op, t, name);
  CUTRAIN_REQUIRE(t.numel() > 0, InvalidArgument, op, name, " has no elements: ", t.describe());
}

// All tensors on one device; returns it.
template <class T, class... Rest>
Device same_device(std::string_view op, const Tensor<T>& first, const Rest&... rest) {
  const Device d = first.device();
  [[maybe_unused]] auto one = [&](const auto& t) {
    CUTRAIN_REQUIRE(t.device() == d, DeviceError, op, "tensors on different devices: ", first.describe(), " and ",
                    t.describe());
  };
  (one(rest), ...);
  return d;
}

inline void positive(std::string_view op, std::int64_t v, std::string_view name) {
  CUTRAIN_REQUIRE(v > 0, InvalidArgument, op, name, " must be positive, got ", v);
}
inline void non_negative(std::string_view op, std::int64_t v, std::string_view name) {
  CUTRAIN_REQUIRE(v >= 0, InvalidArgument, op, name, " must be non-negative, got ", v);
}

}  // namespace cutrain::inline CUTRAIN_ABI::check
