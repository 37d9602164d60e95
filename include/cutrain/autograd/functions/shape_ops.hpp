// Differentiable concat, stack, split, chunk, index_select and gather on Var<T> (ops/shape_ops.hpp,
// ops/index.hpp). A node has one output, so split and chunk return one slice view per piece,
// each its own node (autograd::slice): the gradients of the pieces used add up in x's gradient,
// and an unused piece contributes nothing (zeros), as one multi-output split node would. concat's
// backward hands each input its slice of dy, stack's each input its index along the new dim
// (made contiguous); index_select's and gather's add dy into zeros of x's shape.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/functions/view.hpp"
#include "cutrain/autograd/var.hpp"
#include "cutrain/ops/index.hpp"
#include "cutrain/ops/shape_ops.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

// concat and stack: input i gets dy's slice [offsets[i], offsets[i + 1]) of dim d (stack: the
// size-1 slice i, squeezed).
template <class T>
struct JoinFn final : Node<T> {
  bool is_stack = false;
  int d = 0;
  std::vector<std::int64_t> offsets;
  std::string_view name() const override { return is_stack ? "stack" : "concat"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(this->inputs.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      if (!this->needs_grad(i)) continue;
      Tensor<T> s = dy.slice(d, offsets[i], offsets[i + 1]);
      if (is_stack) s = cutrain::squeeze(s, d);
      g[i] = s.contiguous(Layout::row_major);
    }
    return g;
  }
  void release_saved() override {}
};

namespace detail {
template <class T>
std::vector<Tensor<T>> values_of(std::string_view op, const std::vector<Var<T>>& xs) {
  std::vector<Tensor<T>> v;
  v.reserve(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    CUTRAIN_REQUIRE(xs[i].defined(), InvalidArgument, op, "Var ", i, " is undefined (default-constructed)");
    v.push_back(xs[i].value().view());
  }
  return v;
}

// y as the output of a JoinFn over xs when any of them requires grad (and grad mode is on).
template <class T>
Var<T> finish_join(Tensor<T> y, const std::vector<Var<T>>& xs, bool is_stack, int d) {
  bool any = false;
  for (const Var<T>& x : xs) any = any || x.requires_grad();
  if (!any || !is_grad_enabled()) return Var<T>(std::move(y));
  auto fn = std::make_shared<JoinFn<T>>();
  fn->is_stack = is_stack;
  fn->d = d;
  fn->offsets.push_back(0);
  for (const Var<T>& x : xs) {
    fn->offsets.push_back(fn->offsets.back() + (is_stack ? 1 : x.value().dim(d)));
    fn->inputs.push_back(x.impl());
  }
  return Var<T>::from_node(std::move(y), std::move(fn));
}
}  // namespace detail

template <class T>
Var<T> concat(const std::vector<Var<T>>& xs, int dim = 0) {
  Tensor<T> y = ops::concat(detail::values_of("concat", xs), dim);  // checks everything
  const int d = dim < 0 ? dim + y.rank() : dim;
  return detail::finish_join(std::move(y), xs, false, d);
}

template <class T>
Var<T> stack(const std::vector<Var<T>>& xs, int dim = 0) {
  Tensor<T> y = ops::stack(detail::values_of("stack", xs), dim);
  const int d = dim < 0 ? dim + y.rank() : dim;
  return detail::finish_join(std::move(y), xs, true, d);
}

// One differentiable slice view per piece.
template <class T>
std::vector<Var<T>> split(const Var<T>& x, const std::vector<std::int64_t>& sizes, int dim = 0) {
  const Tensor<T>& v = detail::value_of("split", x);
  const std::vector<Tensor<T>> pieces = ops::split(v, sizes, dim);  // checks dim and sizes
  const int d = dim < 0 ? dim + v.rank() : dim;
  std::vector<Var<T>> out;
  out.reserve(pieces.size());
  std::int64_t at = 0;
  for (const Tensor<T>& p : pieces) {
    out.push_back(autograd::slice(x, d, at, at + p.dim(d)));
    at += p.dim(d);
  }
  return out;
}

template <class T>
std::vector<Var<T>> split(const Var<T>& x, std::int64_t size, int dim = 0) {
  const Tensor<T>& v = detail::value_of("split", x);
  const int d = cutrain::detail::wrap_dim("split", dim, v.rank(), v.shape());
  return split(x, ops::split_sizes("split", v.dim(d), size), d);
}

template <class T>
std::vector<Var<T>> chunk(const Var<T>& x, std::int64_t n, int dim = 0) {
  const Tensor<T>& v = detail::value_of("chunk", x);
  std::vector<std::int64_t> sizes;
  for (const Tensor<T>& p : ops::chunk(v, n, dim)) sizes.push_back(p.dim(dim < 0 ? dim + v.rank() : dim));
  return split(x, sizes, dim);
}

// index_select and gather: dy added into zeros of x's shape at the indexed positions. The index
// is kept as given (int32 or int64) and checked again by the backward op.
template <class T, ops::IndexInt I>
struct IndexFn final : Node<T> {
  bool is_gather = false;
  int d = 0;
  Shape x_shape;
  ops::IndexOptions opts;
  Tensor<I> index;
  std::string_view name() const override { return is_gather ? "gather" : "index_select"; }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Tensor<T>> g(1);
    if (this->needs_grad(0))
      g[0] = is_gather ? ops::gather_backward(dy, x_shape, d, index, opts)
                       : ops::index_select_backward(dy, x_shape, d, index, opts);
    return g;
  }
  void release_saved() override { index = {}; }
};

namespace detail {
template <class T, ops::IndexInt I>
Var<T> record_index(const Var<T>& x, Tensor<T> y, bool is_gather, int dim, const Tensor<I>& index,
                    const ops::IndexOptions& o) {
  if (!records({x.requires_grad()})) return Var<T>(std::move(y));
  auto fn = std::make_shared<IndexFn<T, I>>();
  fn->is_gather = is_gather;
  fn->d = dim < 0 ? dim + x.value().rank() : dim;
  fn->x_shape = x.shape();
  fn->opts = o;
  fn->save(fn->index, index, "index");
  return finish<T>(std::move(y), fn, {&x});
}
}  // namespace detail

// index int32 or int64 (ops::index_select).
template <class T, ops::IndexInt I>
Var<T> index_select(const Var<T>& x, int dim, const Tensor<I>& index, const ops::IndexOptions& o = {}) {
  const Tensor<T>& v = detail::value_of("index_select", x);
  return detail::record_index(x, ops::index_select(v, dim, index, o), false, dim, index, o);
}

// index int32 or int64 (ops::gather).
template <class T, ops::IndexInt I>
Var<T> gather(const Var<T>& x, int dim, const Tensor<I>& index, const ops::IndexOptions& o = {}) {
  const Tensor<T>& v = detail::value_of("gather", x);
  return detail::record_index(x, ops::gather(v, dim, index, o), true, dim, index, o);
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
