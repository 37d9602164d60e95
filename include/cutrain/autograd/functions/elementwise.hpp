// Differentiable elementwise ops and element-type conversion on Var<T>: add, multiply (both
// broadcasting) and scale (with operator+ and operator*; sub, div, min/max, unary ops and where
// are in broadcast.hpp), dropout with a seeded mask, and cast<U> between element types
// for mixed precision, whose backward sends the gradient back converted to the input's type.
#pragma once

#include "cutrain/core/abi.hpp"

#include <concepts>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/core/backend.hpp"
#include "cutrain/ops/cast.hpp"
#include "cutrain/ops/dropout.hpp"
#include "cutrain/ops/elementwise.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/cuda_graph.hpp"
#include "cutrain/cuda/kernels/cast.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::autograd {

// ---- elementwise -------------------------------------------------------------------------

template <class T>
struct AddFn final : Node<T> {
  Shape a_shape, b_shape;
  std::string_view name() const override { return "add"; }
  Tensor<T> forward(const Tensor<T>& a, const Tensor<T>& b) {
    a_shape = a.shape();
    b_shape = b.shape();
    return ops::add(a, b);
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(2);
    if (a_shape != b_shape) {  // broadcast: each input's gradient summed back to its shape (new tensors)
      if (this->needs_grad(0)) g[0] = ops::sum_to(dy, a_shape);
      if (this->needs_grad(1)) g[1] = ops::sum_to(dy, b_shape);
    } else {
      // dy itself, to each input that needs it: no copies (a residual add's backward used to make
      // two, 0.58 ms of a GPT step). A leaf that gets a shared tensor copies it (engine.hpp).
      for (std::size_t i = 0; i < 2; ++i)
        if (this->needs_grad(i)) g[i] = dy.view();
    }
    return g;
  }
  void release_saved() override {}
};

template <class T>
Var<T> add(const Var<T>& a, const Var<T>& b) {
  detail::require_defined("autograd::add", {{a.defined(), "a"}, {b.defined(), "b"}});
  auto fn = std::make_shared<AddFn<T>>();
  Tensor<T> y = fn->forward(a.value(), b.value());
  return detail::finish<T>(std::move(y), fn, {&a, &b});
}

template <class T>
struct MultiplyFn final : Node<T> {
  Tensor<T> a, b;
  std::string_view name() const override { return "multiply"; }
  Tensor<T> forward(const Tensor<T>& a_, const Tensor<T>& b_) {
    Tensor<T> y = ops::multiply(a_, b_);
    this->save(a, a_, "a");
    this->save(b, b_, "b");
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(2);
    if (a.shape() != b.shape()) {  // broadcast
      BinaryBackward<T> r = ops::binary_backward(BinaryOp::mul, a, b, dy, this->needs_grad(0), this->needs_grad(1));
      g[0] = std::move(r.da);
      g[1] = std::move(r.db);
      return g;
    }
    if (this->needs_grad(0)) g[0] = ops::multiply(dy, b);
    if (this->needs_grad(1)) g[1] = ops::multiply(dy, a);
    return g;
  }
  void release_saved() override { a = {}; b = {}; }
};

// Elementwise a * b (shapes broadcast, NumPy rules).
template <class T>
Var<T> multiply(const Var<T>& a, const Var<T>& b) {
  detail::require_defined("autograd::multiply", {{a.defined(), "a"}, {b.defined(), "b"}});
  auto fn = std::make_shared<MultiplyFn<T>>();
  Tensor<T> y = fn->forward(a.value(), b.value());
  return detail::finish<T>(std::move(y), fn, {&a, &b});
}

template <class T>
struct ScaleFn final : Node<T> {
  double alpha;
  explicit ScaleFn(double a) : alpha(a) {}
  std::string_view name() const override { return "scale"; }
  Tensor<T> forward(const Tensor<T>& x) { return ops::scale(x, alpha); }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = ops::scale_backward(dy, alpha);
    return g;
  }
  void release_saved() override {}
};

template <class T>
Var<T> scale(const Var<T>& x, double alpha) {
  detail::require_defined("autograd::scale", {{x.defined(), "x"}});
  auto fn = std::make_shared<ScaleFn<T>>(alpha);
  Tensor<T> y = fn->forward(x.value());
  return detail::finish<T>(std::move(y), fn, {&x});
}

template <class T> Var<T> operator+(const Var<T>& a, const Var<T>& b) { return add(a, b); }
template <class T> Var<T> operator*(const Var<T>& a, const Var<T>& b) { return multiply(a, b); }
template <class T> Var<T> operator*(double alpha, const Var<T>& x) { return scale(x, alpha); }

template <class T>
struct DropoutFn final : Node<T> {
  Tensor<T> mask;
  std::string_view name() const override { return "dropout"; }
  Tensor<T> forward(const Tensor<T>& x, double p, std::uint64_t seed) {
    DropoutForward<T> r = ops::dropout_forward(x, p, seed);
    mask = std::move(r.mask);
    return std::move(r.y);
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0)) g[0] = ops::dropout_backward(dy, mask);
    return g;
  }
  void release_saved() override { mask = {}; }
};

// Inverted dropout with a seeded mask; the caller picks a fresh seed per step.
template <class T>
Var<T> dropout(const Var<T>& x, double p, std::uint64_t seed) {
  detail::require_defined("autograd::dropout", {{x.defined(), "x"}});
  auto fn = std::make_shared<DropoutFn<T>>();
  Tensor<T> y = fn->forward(x.value(), p, seed);
  return detail::finish<T>(std::move(y), fn, {&x});
}

// ---- element type ------------------------------------------------------------------------

// The cast's graph holds Var<U>; its input is a Var<T>, which no Node<U> can list among its
// inputs, so backward sends the input its gradient itself (detail::send_gradient).
template <class U, class T>
struct CastFn final : Node<U> {
  std::shared_ptr<detail::VarImpl<T>> src;
  std::string_view name() const override { return "cast"; }
  std::vector<Tensor<U>> backward(const Tensor<U>& dy) override {
    detail::send_gradient(src, ops::cast<T>(dy));
    return {};
  }
  void release_saved() override { src.reset(); }
};

namespace detail {
// c made current for v: v converted into c's copy where it has v's form (so that a CUDA graph
// that reads the copy goes on reading the right memory), else into a new copy. Under capture the
// conversion is recorded, not run: the copy stays stale for later casts.
template <class U, class T>
void refresh_cast_copy(CastCopy<T, U>& c, const Tensor<T>& v) {
  if (c.copy.defined() && c.copy.shape() == v.shape() && c.copy.strides() == v.strides() &&
      c.copy.device() == v.device() && v.is_contiguous()) {
    c.copy.bump_version();  // autograd must not use a copy saved before this write
#ifdef CUTRAIN_WITH_CUDA
    if constexpr (cuda::GpuFloat<T> && cuda::GpuFloat<U>)
      if (!v.device().is_cpu()) cuda::kernels::cast_into(v, c.copy);
#endif
    if (v.device().is_cpu()) c.copy.copy_from(ops::cast<U>(v));
    c.set(c.copy.view(), v);
  } else {
    c.set(ops::cast<U>(v), v);
  }
  if (cutrain::detail::device_capturing()) c.invalidate();
}

// Whether x's kept cast, current now, may stand in for a conversion: always, except under CUDA
// graph capture not run by cuda::CudaGraph. Under a CudaGraph's capture the graph reads the copy
// without converting; a hook run before each replay keeps it right. At the first replay, a copy
// no longer current means the graph writes the parameter without writing the copy (an optimizer
// step of one launch per parameter), or the parameter was written after the capture: from then on
// every replay converts first and leaves the copy stale for eager casts. Otherwise it converts
// when the parameter was written between replays (averaged weights swapped in and out for an
// evaluation, a checkpoint load).
template <class U, class T>
bool kept_cast_usable(const std::shared_ptr<VarImpl<T>>& x) {
  if (x->value.device().is_cpu() || !cutrain::detail::device_capturing()) return true;
#ifdef CUTRAIN_WITH_CUDA
  if (cuda::CudaGraph* g = cuda::CudaGraph::capturing()) {
    g->on_replay([w = std::weak_ptr<VarImpl<T>>(x), first = true, every = false]() mutable {
      const auto p = w.lock();
      if (!p) return;
      auto& c = p->template cast_copy<U>();
      if (first) every = !c.current(p->value);
      first = false;
      if (every || !c.current(p->value)) refresh_cast_copy(c, p->value);
      if (every) c.invalidate();
    });
    return true;
  }
#endif
  return false;
}
}  // namespace detail

// x converted to element type U (mixed precision: f32 parameters into a bf16 or f16 model,
// its output back to f32 for the loss); the gradient comes back converted to T. The same type
// returns x itself, an undefined Var an undefined one. A Var with history may be cast once per
// backward; a leaf (a parameter) any number of times. A leaf that requires grad keeps its bf16
// or f16 cast (detail::CastCopy) and returns it again until its value or the copy is written in
// place (any write that bumps the version: optimizers, copy_from, fill, load_state_dict); then
// it converts into the same copy again.
template <class U, class T>
Var<U> cast(const Var<T>& x) {
  if constexpr (std::same_as<U, T>) {
    return x;
  } else {
    if (!x.defined()) return {};
    Tensor<U> y;
    if constexpr (std::same_as<U, bfloat16> || std::same_as<U, half>) {
      if (x.is_leaf() && x.requires_grad()) {
        auto& c = x.impl()->template cast_copy<U>();
        if (!c.current(x.value()) || !detail::kept_cast_usable<U>(x.impl())) detail::refresh_cast_copy(c, x.value());
        y = c.copy.view();
      }
    }
    if (!y.defined()) y = ops::cast<U>(x.value());
    if (!detail::records({x.requires_grad()})) return Var<U>(std::move(y));
    auto fn = std::make_shared<CastFn<U, T>>();
    fn->src = x.impl();
    return Var<U>::from_node(std::move(y), std::move(fn));
  }
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
