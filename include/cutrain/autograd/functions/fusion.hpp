// A fusion graph (ops/fusion.hpp) as one differentiable op: the forward runs fused (one cuDNN
// graph on the GPU). The backward is either cutrain's unfused backward ops through the same
// graph, recomputing its intermediates from the saved inputs (no intermediate is kept between
// the two), or backward fusion graphs the user describes, run in turn and connected by name.
#pragma once

#include "cutrain/core/abi.hpp"

#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/autograd/functions/broadcast.hpp"
#include "cutrain/autograd/functions/conv_pool.hpp"
#include "cutrain/autograd/functions/elementwise.hpp"
#include "cutrain/autograd/functions/matmul.hpp"
#include "cutrain/autograd/functions/norm_activation.hpp"
#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/functions/view.hpp"
#include "cutrain/ops/fusion.hpp"

namespace cutrain::inline CUTRAIN_ABI::autograd {

// The graph's output as the composition of autograd ops on `inputs` (the graph's only output).
template <class T>
Var<T> fusion_unfused(const fusion::Graph& g, const std::vector<Var<T>>& inputs) {
  g.check_complete("autograd::fusion_unfused");
  CUTRAIN_REQUIRE(inputs.size() == g.inputs().size() && g.outputs().size() == 1, InvalidArgument,
                  "autograd::fusion_unfused", g.describe(), ": takes ", g.inputs().size(), " inputs and has ",
                  g.outputs().size(), " outputs; got ", inputs.size(), " inputs, and one output is needed");
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
      case fusion::NodeKind::layer_norm:
      case fusion::NodeKind::rms_norm: {
        using S = ops::detail::fusion_norm_param_t<T>;
        const auto& x = at(n.a).value();
        const Shape chw{x.dim(1), x.dim(2), x.dim(3)};  // gamma may be [1, C, H, W] (infer_shapes)
        const auto param = [&](int id) { return reshape(cast<S>(at(id)), chw); };
        v[i] = n.kind == fusion::NodeKind::layer_norm ? layer_norm(at(n.a), param(n.b), param(n.c), n.alpha)
                                                      : rms_norm(at(n.a), param(n.b), n.alpha);
        break;
      }
      case fusion::NodeKind::conv2d_dgrad:
      case fusion::NodeKind::conv2d_wgrad:
      case fusion::NodeKind::activation_backward:
      case fusion::NodeKind::sum_to:
      case fusion::NodeKind::batch_norm:
      case fusion::NodeKind::layer_norm_train:
      case fusion::NodeKind::rms_norm_train:
      case fusion::NodeKind::batch_norm_backward:
      case fusion::NodeKind::layer_norm_backward:
      case fusion::NodeKind::rms_norm_backward:
      case fusion::NodeKind::part:  // refused by fused(): these have no derivative here
        throw NotImplemented("autograd::fused",
                             g.describe() + ": backward nodes and norms' statistics are not differentiable");
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
    // The recomputation records a graph even where backward() runs under NoGradGuard.
    struct GradOn {
      bool previous = autograd::detail::grad_mode_flag();
      GradOn() { autograd::detail::grad_mode_flag() = true; }
      ~GradOn() { autograd::detail::grad_mode_flag() = previous; }
    } on;
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

namespace detail {
inline const std::string& input_name(const fusion::Graph& g, std::size_t i) {
  return g.nodes()[static_cast<std::size_t>(g.inputs()[i])].name;
}

// Every input of every backward graph is a name available when it runs: the forward's inputs,
// its output y, "d" + y (the output's gradient), or an earlier backward graph's output.
inline void check_backward_names(const fusion::Graph& f, const std::vector<ops::Fusion>& backward) {
  std::unordered_set<std::string> have;
  for (std::size_t i = 0; i < f.inputs().size(); ++i) have.insert(input_name(f, i));
  const std::string& y = f.outputs().front().second;
  have.insert(y);
  have.insert("d" + y);
  for (std::size_t k = 0; k < backward.size(); ++k) {
    const auto& b = backward[k].graph();
    for (std::size_t i = 0; i < b.inputs().size(); ++i)
      CUTRAIN_REQUIRE(have.contains(input_name(b, i)), InvalidArgument, "autograd::fused", "backward graph ", k, " (",
                      b.describe(), ") takes '", input_name(b, i), "', which is none of the forward's inputs, '", y,
                      "', 'd", y, "' or an earlier backward graph's output");
    for (const auto& o : b.outputs()) have.insert(o.second);
  }
}
}  // namespace detail

// The forward fused; the backward: the graphs of `backward` in turn, their inputs looked up by
// name (the forward's inputs and output, "d" + the output's name for its gradient, earlier
// backward outputs); "d" + an input's name is that input's gradient.
template <class T>
struct FusionUserBackwardFn final : Node<T> {
  ops::Fusion f;
  std::vector<ops::Fusion> bwd;
  std::vector<Tensor<T>> x;  // the inputs and
  Tensor<T> y;               // the output, saved for the backward graphs
  FusionUserBackwardFn(ops::Fusion fusion, std::vector<ops::Fusion> backward)
      : f(std::move(fusion)), bwd(std::move(backward)), x(f.graph().inputs().size()) {}
  std::string_view name() const override { return "fused"; }
  Tensor<T> forward(const std::vector<Tensor<T>>& in) {
    Tensor<T> out = std::move(f(in)[0]);
    for (std::size_t i = 0; i < in.size(); ++i) this->save(x[i], in[i], detail::input_name(f.graph(), i));
    this->save(y, out, f.graph().outputs().front().second);
    return out;
  }
  std::vector<Tensor<T>> backward(const Tensor<T>& dy) override {
    const auto& g = f.graph();
    const std::string& yn = g.outputs().front().second;
    std::unordered_map<std::string, Tensor<T>> env;
    for (std::size_t i = 0; i < x.size(); ++i) env[detail::input_name(g, i)] = x[i].view();
    env[yn] = y.view();
    env["d" + yn] = dy.view();
    for (const auto& b : bwd) {
      std::vector<Tensor<T>> in;
      for (std::size_t i = 0; i < b.graph().inputs().size(); ++i)
        in.push_back(env.at(detail::input_name(b.graph(), i)).view());
      auto out = b(in);
      for (std::size_t j = 0; j < out.size(); ++j) env[b.graph().outputs()[j].second] = std::move(out[j]);
    }
    std::vector<Tensor<T>> grads(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!this->needs_grad(i)) continue;
      const std::string d = "d" + detail::input_name(g, i);
      auto it = env.find(d);
      CUTRAIN_REQUIRE(it != env.end(), InvalidArgument, "autograd::fused", g.describe(), ": input '",
                      detail::input_name(g, i), "' needs a gradient and no backward graph outputs '", d, "'");
      grads[i] = std::move(it->second);
    }
    return grads;
  }
  void release_saved() override {
    for (auto& t : x) t = {};
    y = {};
  }
};

// f's single output, differentiable in every input: fused forward, and the unfused backward
// (no `backward` graphs) or the user's backward graphs.
template <class T>
Var<T> fused(const ops::Fusion& f, const std::vector<Var<T>>& inputs, const std::vector<ops::Fusion>& backward = {}) {
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
  if (backward.empty())
    CUTRAIN_REQUIRE(g.differentiable(), NotImplemented, op, g.describe(),
                    ": a graph of backward nodes has no unfused derivative here; give its backward graphs");
  else
    detail::check_backward_names(g, backward);
  if (!any || !is_grad_enabled()) return Var<T>(std::move(f(values)[0]));
  const auto record = [&](auto fn) {
    Tensor<T> y = fn->forward(values);
    for (const auto& v : inputs) fn->inputs.push_back(v.impl());
    return Var<T>::from_node(std::move(y), std::move(fn));
  };
  if (backward.empty()) return record(std::make_shared<FusionFn<T>>(f));
  return record(std::make_shared<FusionUserBackwardFn<T>>(f, backward));
}

}  // namespace cutrain::inline CUTRAIN_ABI::autograd
