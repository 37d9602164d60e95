// What every differentiable op in autograd/functions/ shares: whether an op records a node
// (detail::records), wrapping an op's output as the output of its node or as a leaf
// (detail::finish), and the check that a fused op's activation can be differentiated from the
// op's output alone (detail::require_grad_safe_activation).
#pragma once

#include "cutrain/core/abi.hpp"

#include <initializer_list>
#include <memory>
#include <string_view>
#include <utility>

#include "cutrain/autograd/var.hpp"
#include "cutrain/core/params/activation.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

namespace detail {
inline bool records(std::initializer_list<bool> requires_grad) {
  if (!is_grad_enabled()) return false;
  for (bool r : requires_grad)
    if (r) return true;
  return false;
}

// Wraps y as the output of fn when any input requires grad (and grad mode is on), else as a
// leaf that needs none; fn and what it saved are then dropped.
// others_require_grad: an input of another type, which fn sends its gradient itself, does.
template <class T>
Var<T> finish(Tensor<T> y, std::shared_ptr<Node<T>> fn, std::initializer_list<const Var<T>*> inputs,
              bool others_require_grad = false) {
  bool any = others_require_grad;
  for (const Var<T>* v : inputs) any = any || (v && v->requires_grad());
  if (!any || !is_grad_enabled()) return Var<T>(std::move(y));
  for (const Var<T>* v : inputs) fn->inputs.push_back(v && v->defined() ? v->impl() : nullptr);
  return Var<T>::from_node(std::move(y), std::move(fn));
}

// Every input an op needs is a defined Var: the error names the op and the input.
inline void require_defined(std::string_view op, std::initializer_list<std::pair<bool, std::string_view>> inputs) {
  for (const auto& [defined, name] : inputs)
    CUTRAIN_REQUIRE(defined, InvalidArgument, op, name, " is an undefined (default-constructed) Var");
}

inline void require_grad_safe_activation(std::string_view op, const ActivationParams& a) {
  CUTRAIN_REQUIRE(a.kind == Activation::relu || a.kind == Activation::identity, NotImplemented, op,
                  "the fused op keeps only its output, from which only relu's and identity's derivative can be "
                  "recovered; got ", a.kind, " (use the op and activation() separately)");
}
}  // namespace detail

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
