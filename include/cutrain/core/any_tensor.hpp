// AnyTensor: a Tensor<T> of any cutrain dtype, chosen at run time: what a weights file
// (core/safetensors.hpp, core/npy.hpp) holds, since its dtypes are only known once it is read.
// TensorMap: named AnyTensors, in name order.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

#include "cutrain/core/cast.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI {

class AnyTensor {
 public:
  using Variant = std::variant<Tensor<double>, Tensor<float>, Tensor<half>, Tensor<bfloat16>, Tensor<std::int32_t>,
                               Tensor<std::uint8_t>, Tensor<std::int64_t>>;

  AnyTensor() = default;
  // Takes t (a view shares t's storage: AnyTensor(t.view())).
  template <class T>
  AnyTensor(Tensor<T> t) : v_(std::move(t)) {}  // NOLINT: implicit, so that map.emplace(name, tensor) reads naturally

  bool defined() const {
    return std::visit([](const auto& t) { return t.defined(); }, v_);
  }
  DType dtype() const {
    return std::visit([](const auto& t) { return t.dtype(); }, v_);
  }
  const Shape& shape() const {
    return std::visit([](const auto& t) -> const Shape& { return t.shape(); }, v_);
  }
  std::string describe() const {
    return std::visit([](const auto& t) { return t.describe(); }, v_);
  }
  template <class T>
  bool holds() const {
    return std::holds_alternative<Tensor<T>>(v_);
  }

  // The tensor, which must be a Tensor<T> (InvalidArgument otherwise).
  template <class T>
  const Tensor<T>& get() const {
    CUTRAIN_REQUIRE(holds<T>(), InvalidArgument, "AnyTensor::get", "holds ", describe(), ", not ", dtype_of<T>);
    return std::get<Tensor<T>>(v_);
  }
  template <class T>
  Tensor<T>& get() {
    CUTRAIN_REQUIRE(holds<T>(), InvalidArgument, "AnyTensor::get", "holds ", describe(), ", not ", dtype_of<T>);
    return std::get<Tensor<T>>(v_);
  }

  // As a Tensor<T>: a view when it is one, else a converted copy on the same device (floating
  // types round to nearest even; integers convert as static_cast does).
  template <class T>
  Tensor<T> as() const {
    return std::visit(
        [](const auto& t) -> Tensor<T> {
          using U = typename std::remove_cvref_t<decltype(t)>::value_type;
          CUTRAIN_REQUIRE(t.defined(), InvalidArgument, "AnyTensor::as", "the tensor is undefined");
          if constexpr (std::is_same_v<U, T>) return t.view();
          else return cast<T>(t);
        },
        v_);
  }

  const Variant& variant() const { return v_; }
  Variant& variant() { return v_; }

 private:
  Variant v_;
};

using TensorMap = std::map<std::string, AnyTensor>;

// Calls fn(std::type_identity<T>{}) with the element type of d.
template <class Fn>
decltype(auto) visit_dtype(DType d, Fn&& fn) {
  switch (d) {
    case DType::f64: return fn(std::type_identity<double>{});
    case DType::f32: return fn(std::type_identity<float>{});
    case DType::f16: return fn(std::type_identity<half>{});
    case DType::bf16: return fn(std::type_identity<bfloat16>{});
    case DType::i32: return fn(std::type_identity<std::int32_t>{});
    case DType::i64: return fn(std::type_identity<std::int64_t>{});
    case DType::u8: break;
  }
  return fn(std::type_identity<std::uint8_t>{});
}

}  // namespace cutrain::inline CUTRAIN_ABI
