// autograd::checkpoint: activation recomputation. checkpoint(f, x) runs f(x) without recording
// its graph, so that none of f's intermediate activations stay alive until backward; only x is
// kept. Backward runs f(x) again, this time recorded, and backpropagates through it: the
// gradients reach x and every parameter f reads (leaves) as without checkpointing, for one more
// forward pass of f. f must compute the same thing both times: no dropout whose mask changes
// between calls, no state it updates.
#pragma once

#include "cutrain/core/abi.hpp"

#include <functional>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

template <class X>
struct CheckpointFn final : Node<X> {
  std::function<Var<X>(const Var<X>&)> f;
  Tensor<X> x;
  std::string_view name() const override { return "checkpoint"; }
  std::vector<Tensor<X>> backward(const Tensor<X>& dy) override {
    struct RecordScope {  // backward may run under NoGradGuard; the recomputation must record
      bool previous = detail::grad_mode_flag();
      RecordScope() { detail::grad_mode_flag() = true; }
      ~RecordScope() { detail::grad_mode_flag() = previous; }
    } record;
    const Var<X> xi(x.view(), /*requires_grad=*/true);
    const Var<X> y = f(xi);
    CUTRAIN_REQUIRE(y.defined() && y.value().shape() == dy.shape(), InvalidArgument, "autograd::checkpoint",
                    "the recomputed output ", y.defined() ? y.value().describe() : std::string("(undefined)"),
                    " does not match the gradient ", dy.describe(), ": f must compute the same both times");
    if (y.requires_grad()) y.backward(dy);
    std::vector<Tensor<X>> g(1);
    if (xi.grad().defined()) g[0] = std::move(xi.grad());
    return g;
  }
  void release_saved() override {
    x = {};
    f = nullptr;
  }
};

// f(x), recomputed in backward instead of kept (see the top of this file). Under NoGradGuard, or
// when nothing needs a gradient, it is f(x).
template <class X>
Var<X> checkpoint(std::function<Var<X>(const Var<X>&)> f, const Var<X>& x) {
  detail::require_defined("autograd::checkpoint", {{x.defined(), "x"}});
  if (!is_grad_enabled()) return f(x);
  Var<X> y;
  {
    NoGradGuard no_record;
    y = f(x);
  }
  auto fn = std::make_shared<CheckpointFn<X>>();
  fn->f = std::move(f);
  fn->save(fn->x, x.value(), "x");
  // f's parameters are not the node's inputs: they are reached by the recomputed graph.
  return detail::finish<X>(std::move(y.value()), fn, {&x}, /*others_require_grad=*/true);
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
