// A fusion graph (ops/fusion.hpp) as one differentiable op: the forward runs fused (one cuDNN
// graph on the GPU); the backward runs cutrain's unfused backward ops through the same graph,
// recomputing its intermediates from the saved inputs (no intermediate is kept between the two).
#pragma once

#include "cutrain/core/abi.hpp"

#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/broadcast.hpp"
#include "cutrain/autograd/functions/conv_pool.hpp"
#include "cutrain/autograd/functions/elementwise.hpp"
#include "cutrain/autograd/functions/matmul.hpp"
#include "cutrain/autograd/functions/norm_activation.hpp"
#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/ops/fusion.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

// The graph's output as the composition of autograd ops on `inputs` (the graph's only output).
template <class T>
Var<T> fusion_unfused(const fusion::Graph& g, const std::vector<Var<T>>& inputs) {
  std::vector<Var<T>> v(g.nodes().size());
  for (std::size_t i = 0; i < inputs.size(); ++i) v[static_cast<std::size_t>(g.inputs()[i])] = inputs[i];
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    const fusion::Node& n = g.nodes()[i];
    const auto at = [&](int id) -> const Var<T>& { return v[static_cast<std::size_t>(id)]; };
    switch (n.kind) {
      case fusion::NodeKind::input: break;
      case fusion::NodeKind::conv2d: v[i] = conv2d(at(n.a), at(n.b), n.conv); break;
      case fusion::NodeKind::matmul: v[i] = matmul(at(n.a), at(n.b)); break;
      case fusion::NodeKind::binary: v[i] = detail::binary_var(n.binary, "autograd::fused", at(n.a), at(n.b)); break;
      case fusion::NodeKind::scale: v[i] = scale(at(n.a), n.alpha); break;
      case fusion::NodeKind::activation: v[i] = activation(at(n.a), n.act); break;
    }
  }
  return v[static_cast<std::size_t>(g.outputs().front().first)];
}

template <class T>
struct FusionFn final : Node<T> {
  ops::Fusion f;
  std::vector<Tensor<T>> x;  // the inputs, saved for the backward's recomputation
  explicit FusionFn(ops::Fusion fusion) : f(std::move(fusion)), x(f.graph().inputs().size()) {}
  std::string_view name() const override { return "fused"; }
  Tensor<T> forward(const std::vector<Tensor<T>>& in) {
    Tensor<T> y = std::move(f(in)[0]);
    const auto& g = f.graph();
    for (std::size_t i = 0; i < in.size(); ++i)
      this->save(x[i], in[i], g.nodes()[static_cast<std::size_t>(g.inputs()[i])].name);
    return y;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    std::vector<Var<T>> leaves;
    for (std::size_t i = 0; i < x.size(); ++i) leaves.emplace_back(x[i].view(), this->needs_grad(i));
    fusion_unfused(f.graph(), leaves).backward(dy);
    std::vector<Tensor<T>> g(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
      if (this->needs_grad(i)) g[i] = std::move(leaves[i].grad());
    return g;
  }
  void release_saved() override {
    for (auto& t : x) t = {};
  }
};

// f's single output, differentiable in every input: fused forward, unfused backward.
template <class T>
Var<T> fused(const ops::Fusion& f, const std::vector<Var<T>>& inputs) {
  constexpr std::string_view op = "autograd::fused";
  const auto& g = f.graph();
  CUTRAIN_REQUIRE(g.outputs().size() == 1, NotImplemented, op, g.describe(), ": ", g.outputs().size(),
                  " outputs; a differentiable fusion has one");
  CUTRAIN_REQUIRE(inputs.size() == g.inputs().size(), InvalidArgument, op, g.describe(), ": takes ", g.inputs().size(),
                  " inputs, got ", inputs.size());
  std::vector<Tensor<T>> values;
  bool any = false;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    CUTRAIN_REQUIRE(inputs[i].defined(), InvalidArgument, op, "input '",
                    g.nodes()[static_cast<std::size_t>(g.inputs()[i])].name, "' is an undefined Var");
    values.push_back(inputs[i].value().view());
    any = any || inputs[i].requires_grad();
  }
  if (!any || !is_grad_enabled()) return Var<T>(std::move(f(values)[0]));
  auto fn = std::make_shared<FusionFn<T>>(f);
  Tensor<T> y = fn->forward(values);
  for (const auto& v : inputs) fn->inputs.push_back(v.impl());
  return Var<T>::from_node(std::move(y), std::move(fn));
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
