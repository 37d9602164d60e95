// What deploy's two readers of a trained model (onnx.hpp's export, engine_plan.hpp's lowering)
// share: the check of the model and its example input, and a module type's readable name.
#pragma once

#include "cutrain/core/abi.hpp"

#include <string>
#include <string_view>
#include <typeinfo>
#if __has_include(<cxxabi.h>)
#include <cxxabi.h>
#include <cstdlib>
#endif

#include "cutrain/core/error.hpp"
#include "cutrain/core/shape.hpp"
#include "cutrain/nn/sequential.hpp"

namespace cutrain::inline CUTRAIN_ABI::deploy::detail {

inline std::string type_name(const std::type_info& t) {
#if __has_include(<cxxabi.h>)
  int status = 0;
  char* s = ::abi::__cxa_demangle(t.name(), nullptr, nullptr, &status);
  if (status == 0 && s) {
    std::string out(s);
    std::free(s);
    return out;
  }
#endif
  return t.name();
}

// A model with modules, and an example input [N, C, H, W], tokens [N, S, C] or [N, features]
// with no dim <= 0.
template <class T>
void check_model_input(std::string_view op, const nn::Sequential<T>& model, const Shape& example_shape) {
  CUTRAIN_REQUIRE(model.size() > 0, InvalidArgument, op, "the model has no modules");
  CUTRAIN_REQUIRE(example_shape.rank() >= 2 && example_shape.rank() <= 4, InvalidArgument, op,
                  "example_shape must be 4-d [N, C, H, W], 3-d tokens [N, S, C] or 2-d [N, features], got ",
                  example_shape);
  for (auto d : example_shape)
    CUTRAIN_REQUIRE(d > 0, InvalidArgument, op, "example_shape ", example_shape, " has a zero or negative dimension");
}

}  // namespace cutrain::inline CUTRAIN_ABI::deploy::detail
