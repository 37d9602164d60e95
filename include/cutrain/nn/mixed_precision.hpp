// Mixed precision: the parameters stay f32 (the master weights the optimizer updates, and batch
// norm's statistics), while the model computes in bf16 or f16 and the loss is taken in f32.
//
//   auto logits = nn::autocast<bfloat16>(net, x);   // Var<float>, computed in bf16
//   auto loss = nn::cross_entropy(logits, y);        // f32
//
// autocast converts x to C, runs net in C (Conv2d and Linear cast their weights on each call,
// BatchNorm2d keeps f32 parameters and statistics), and converts the output back. Gradients
// come back to the f32 parameters in f32. For f16, scale the loss (optim::GradScaler). The GPU
// runs bf16 and f16; the CPU backend computes in f32 and f64 only.
#pragma once

#include "cutrain/core/abi.hpp"

#include <optional>
#include <string_view>

#include "cutrain/autograd/functions.hpp"
#include "cutrain/core/dtype.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

enum class Precision { f32, bf16, f16 };

inline std::optional<Precision> parse_precision(std::string_view s) {
  if (s == "f32") return Precision::f32;
  if (s == "bf16") return Precision::bf16;
  if (s == "f16") return Precision::f16;
  return std::nullopt;
}
inline std::string_view to_string(Precision p) {
  return p == Precision::bf16 ? "bf16" : p == Precision::f16 ? "f16" : "f32";
}

// net(x) computed in C: x converted to C, the output converted back to T.
template <class C, class Net, class T>
autograd::Var<T> autocast(Net& net, const Tensor<T>& x) {
  return autograd::cast<T>(net(autograd::cast<C>(autograd::Var<T>(x.view()))));
}

// The same, with the compute type picked at run time.
template <class Net, class T>
autograd::Var<T> autocast(Precision p, Net& net, const Tensor<T>& x) {
  switch (p) {
    case Precision::bf16: return autocast<bfloat16>(net, x);
    case Precision::f16: return autocast<half>(net, x);
    case Precision::f32: break;
  }
  return net(autograd::Var<T>(x.view()));
}

}  // namespace cutrain::inline CUTRAIN_ABI::nn
