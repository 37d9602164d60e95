// A fusion graph's description: inputs (placeholders), nodes (convolution forward, backward data
// and backward filter, matmul, pointwise binary ops, scale, activations and their backward, sums
// down to a shape; batch, layer and RMS norm, in training with their statistics, and their
// backward) and outputs, independent of dtype and device. Its shapes come from the tensors it is
// run on (fusion_shapes.hpp). ops/fusion.hpp runs it: as one cuDNN graph on the GPU
// (cuda/cudnn/fusion.hpp), as the composition of cutrain's ops on the CPU.
#pragma once

#include "cutrain/core/abi.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/params/activation.hpp"
#include "cutrain/core/params/conv2d.hpp"
#include "cutrain/core/params/elementwise.hpp"
#include "cutrain/core/shape.hpp"
#include "cutrain/core/view.hpp"

namespace cutrain::inline CUTRAIN_ABI::fusion {

enum class NodeKind : std::uint8_t {
  input, conv2d, matmul, binary, scale, activation,
  conv2d_dgrad, conv2d_wgrad, activation_backward, sum_to,
  layer_norm, rms_norm,
  batch_norm, layer_norm_train, rms_norm_train, batch_norm_backward, layer_norm_backward, rms_norm_backward,
  part,  // new kinds go last: key_text numbers them
};

// A norm node: its y (or dx) is the node's value, its other results are `part` nodes.
constexpr bool is_norm(NodeKind k) { return k >= NodeKind::layer_norm && k < NodeKind::part; }
// The operand where a norm's f32 parameters and statistics start (gamma, beta, running or saved
// statistics); what comes before is x (and dy) in the graph's dtype.
constexpr int norm_param_slot(NodeKind k) { return k >= NodeKind::batch_norm_backward ? 2 : 1; }
// How many results a node has: its value and its parts.
constexpr int results(NodeKind k) {
  switch (k) {
    case NodeKind::batch_norm: return 5;
    case NodeKind::layer_norm_train: case NodeKind::batch_norm_backward: case NodeKind::layer_norm_backward: return 3;
    case NodeKind::rms_norm_train: case NodeKind::rms_norm_backward: return 2;
    default: return 1;
  }
}
// A node kind's name in messages and describe().
inline const char* kind_name(NodeKind k) {
  static constexpr std::array<const char*, 19> names{
      "input", "conv2d", "matmul", "binary", "scale", "activation", "conv2d_dgrad", "conv2d_wgrad",
      "activation_backward", "sum_to", "layer_norm", "rms_norm", "batch_norm", "layer_norm_train", "rms_norm_train",
      "batch_norm_backward", "layer_norm_backward", "rms_norm_backward", "part"};
  return names[static_cast<std::size_t>(k)];
}
// The name of result k of a node of kind k (0: its value).
inline std::string_view result_name(NodeKind kind, int k) {
  static constexpr std::array<std::string_view, 5> bn{"y", "mean", "inv_std", "running_mean", "running_var"};
  static constexpr std::array<std::string_view, 3> grads{"dx", "dgamma", "dbeta"};
  if (kind >= NodeKind::batch_norm_backward) return grads[static_cast<std::size_t>(k)];
  if (kind == NodeKind::rms_norm_train) return k ? "inv_rms" : "y";
  return bn[static_cast<std::size_t>(k)];
}

// A value of the graph: an input or a node's result (an index into Graph::nodes()).
struct Value {
  int id = -1;
  std::uint64_t graph = 0;  // the tag of the Graph that made it (a copy of a graph keeps the tag); 0: none
};

struct Node {
  NodeKind kind = NodeKind::input;
  int a = -1, b = -1, c = -1, d = -1, e = -1;  // operands (node ids); -1: none
  Conv2dParams conv{};
  BinaryOp binary = BinaryOp::add;
  ActivationParams act{};
  double alpha = 1.0;     // scale; norms: epsilon
  double momentum = 0.1;  // batch_norm: the running statistics' momentum
  int part = 0;           // part: which result of node a (1: the first after its value)
  Shape shape{};          // conv2d_dgrad: x's shape; conv2d_wgrad: w's shape; sum_to: the target
  std::string name{};     // inputs and outputs

  std::array<int, 5> operands() const { return {a, b, c, d, e}; }
};

// The results of a node with several; a result the node does not have is Value{-1}.
struct BatchNormResults {
  Value y, mean, inv_std, running_mean, running_var;
};
struct NormTrainResults {
  Value y, mean, inv_std;  // rms_norm_train: inv_std is inv_rms, mean has none
};
struct NormGradResults {
  Value dx, dgamma, dbeta;  // rms_norm_backward: no dbeta
};

class Graph {
 public:
  // Inputs and outputs the GPU's variant pack takes: cuDNN graphs here take at most 16 tensors.
  static constexpr int max_tensors = 16;

  // A placeholder; tensors are passed in the order of input() calls. Declare inputs in their own
  // statements (auto x = g.input("x"), w = g.input("w");), not inside another call's arguments,
  // whose order of evaluation C++ leaves unspecified.
  Value input(std::string name) {
    check_name("input", name);
    Value v = push(Node{.kind = NodeKind::input, .name = std::move(name)});
    inputs_.push_back(v.id);
    return v;
  }
  // conv2d(x [N, C, H, W], w [K, C/groups, R, S]) -> [N, K, Ho, Wo], as ops::conv2d_forward.
  Value conv2d(Value x, Value w, const Conv2dParams& p = {}) {
    return push(Node{.kind = NodeKind::conv2d, .a = arg("conv2d", x), .b = arg("conv2d", w), .conv = p});
  }
  // a [M, K] or [B, M, K] x b [K, N] or [B, K, N] -> [M, N] or [B, M, N] (a batch of 1 broadcasts).
  Value matmul(Value a, Value b) {
    return push(Node{.kind = NodeKind::matmul, .a = arg("matmul", a), .b = arg("matmul", b)});
  }
  // NumPy-broadcasting a op b: a bias is an add of a [1, K, 1, 1] (or [K, 1, 1]) tensor.
  Value binary(BinaryOp op, Value a, Value b) {
    return push(Node{.kind = NodeKind::binary, .a = arg(to_string(op), a), .b = arg(to_string(op), b), .binary = op});
  }
  Value add(Value a, Value b) { return binary(BinaryOp::add, a, b); }
  Value sub(Value a, Value b) { return binary(BinaryOp::sub, a, b); }
  Value mul(Value a, Value b) { return binary(BinaryOp::mul, a, b); }
  Value div(Value a, Value b) { return binary(BinaryOp::div, a, b); }
  Value maximum(Value a, Value b) { return binary(BinaryOp::maximum, a, b); }
  Value minimum(Value a, Value b) { return binary(BinaryOp::minimum, a, b); }
  Value scale(Value a, double alpha) {
    CUTRAIN_REQUIRE(std::isfinite(alpha), InvalidArgument, "fusion::Graph", "scale: alpha must be finite, got ", alpha);
    return push(Node{.kind = NodeKind::scale, .a = arg("scale", a), .alpha = alpha});
  }
  Value activation(Value a, const ActivationParams& act) {
    detail::check_activation("fusion activation", act);
    return push(Node{.kind = NodeKind::activation, .a = arg("activation", a), .act = act});
  }
  // The backward of conv2d(x, w, p) for x of x_shape: dx from dy and w (ops::conv2d_backward_data).
  Value conv2d_dgrad(Value dy, Value w, const Conv2dParams& p, Shape x_shape) {
    return push(Node{.kind = NodeKind::conv2d_dgrad, .a = arg("conv2d_dgrad", dy), .b = arg("conv2d_dgrad", w),
                     .conv = p, .shape = std::move(x_shape)});
  }
  // dw of conv2d(x, w, p) for w of w_shape, from dy and x (ops::conv2d_backward_filter).
  Value conv2d_wgrad(Value dy, Value x, const Conv2dParams& p, Shape w_shape) {
    return push(Node{.kind = NodeKind::conv2d_wgrad, .a = arg("conv2d_wgrad", dy), .b = arg("conv2d_wgrad", x),
                     .conv = p, .shape = std::move(w_shape)});
  }
  // dy * act'(x), x the activation's input (relu's derivative reads the same from its output).
  Value activation_backward(Value dy, Value x, const ActivationParams& act) {
    detail::check_activation("fusion activation_backward", act);
    return push(Node{.kind = NodeKind::activation_backward, .a = arg("activation_backward", dy),
                     .b = arg("activation_backward", x), .act = act});
  }
  // v summed down to `shape` (NumPy broadcasting read backwards, as ops::sum_to): a bias's gradient.
  Value sum_to(Value v, Shape shape) {
    return push(Node{.kind = NodeKind::sum_to, .a = arg("sum_to", v), .shape = std::move(shape)});
  }
  // Layer norm of a 4-d x [N, C, H, W] over C, H, W per sample, gamma and beta of shape
  // [C, H, W] (as ops::layer_norm_forward with gamma of every dim of x but the first; view
  // [rows, D] as [rows, D, 1, 1]). gamma and beta are graph inputs used by norms only.
  Value layer_norm(Value x, Value gamma, Value beta, double eps = 1e-5) {
    check_eps("layer_norm", eps);
    return push(Node{.kind = NodeKind::layer_norm, .a = arg("layer_norm", x), .b = arg("layer_norm", gamma),
                     .c = arg("layer_norm", beta), .alpha = eps});
  }
  // RMS norm likewise (as ops::rms_norm_forward): gamma * x / sqrt(mean(x^2) + eps).
  Value rms_norm(Value x, Value gamma, double eps = 1e-5) {
    check_eps("rms_norm", eps);
    return push(Node{.kind = NodeKind::rms_norm, .a = arg("rms_norm", x), .b = arg("rms_norm", gamma), .alpha = eps});
  }
  // Training-phase norms with their statistics, and their backward (as ops::batch_norm_*,
  // ops::layer_norm_*, ops::rms_norm_*). x and dy are 4-d [N, C, H, W]; batch norm's gamma, beta
  // and running statistics are [C, 1, 1] (per channel, as a bias is), its mean and inv_std
  // likewise, running_mean and running_var the updated running statistics (unbiased variance);
  // layer and RMS norm's gamma and beta are [C, H, W] and their statistics [N, 1, 1, 1]. The
  // parameters and statistics are f32 on the GPU. Every result must reach an output: cuDNN's norm
  // nodes write them all.
  BatchNormResults batch_norm(Value x, Value gamma, Value beta, Value running_mean, Value running_var,
                              double eps = 1e-5, double momentum = 0.1) {
    check_eps("batch_norm", eps);
    CUTRAIN_REQUIRE(std::isfinite(momentum) && momentum >= 0 && momentum <= 1, InvalidArgument, "fusion::Graph",
                    "batch_norm: momentum must be in [0, 1], got ", momentum);
    const Value y = push(Node{.kind = NodeKind::batch_norm, .a = arg("batch_norm", x), .b = arg("batch_norm", gamma),
                              .c = arg("batch_norm", beta), .d = arg("batch_norm", running_mean),
                              .e = arg("batch_norm", running_var), .alpha = eps, .momentum = momentum});
    return {y, part(y, 1), part(y, 2), part(y, 3), part(y, 4)};
  }
  NormTrainResults layer_norm_train(Value x, Value gamma, Value beta, double eps = 1e-5) {
    check_eps("layer_norm_train", eps);
    const Value y = push(Node{.kind = NodeKind::layer_norm_train, .a = arg("layer_norm_train", x),
                              .b = arg("layer_norm_train", gamma), .c = arg("layer_norm_train", beta), .alpha = eps});
    return {y, part(y, 1), part(y, 2)};
  }
  NormTrainResults rms_norm_train(Value x, Value gamma, double eps = 1e-5) {
    check_eps("rms_norm_train", eps);
    const Value y = push(Node{.kind = NodeKind::rms_norm_train, .a = arg("rms_norm_train", x),
                              .b = arg("rms_norm_train", gamma), .alpha = eps});
    return {y, Value{}, part(y, 1)};
  }
  NormGradResults batch_norm_backward(Value dy, Value x, Value gamma, Value mean, Value inv_std) {
    return norm_backward(NodeKind::batch_norm_backward, "batch_norm_backward", dy, x, gamma, mean, inv_std);
  }
  NormGradResults layer_norm_backward(Value dy, Value x, Value gamma, Value mean, Value inv_std) {
    return norm_backward(NodeKind::layer_norm_backward, "layer_norm_backward", dy, x, gamma, mean, inv_std);
  }
  NormGradResults rms_norm_backward(Value dy, Value x, Value gamma, Value inv_rms) {
    const Value dx = push(Node{.kind = NodeKind::rms_norm_backward, .a = arg("rms_norm_backward", dy),
                               .b = arg("rms_norm_backward", x), .c = arg("rms_norm_backward", gamma),
                               .d = arg("rms_norm_backward", inv_rms)});
    return {dx, part(dx, 1), Value{}};
  }
  Value relu(Value a) { return activation(a, {.kind = Activation::relu}); }
  Value gelu(Value a) { return activation(a, {.kind = Activation::gelu_erf}); }
  Value gelu_tanh(Value a) { return activation(a, {.kind = Activation::gelu_tanh}); }
  Value silu(Value a) { return activation(a, {.kind = Activation::silu}); }
  Value sigmoid(Value a) { return activation(a, {.kind = Activation::sigmoid}); }
  Value tanh(Value a) { return activation(a, {.kind = Activation::tanh}); }

  // Marks v (a node's result, not an input) as an output, in the order outputs are returned.
  void output(Value v, std::string name) {
    const int id = arg("output", v);
    CUTRAIN_REQUIRE(nodes_[id].kind != NodeKind::input, InvalidArgument, "fusion::Graph::output",
                    "an output must be computed by a node; '", nodes_[id].name, "' is an input");
    for (const auto& [o, n] : outputs_)
      CUTRAIN_REQUIRE(o != id && n != name, InvalidArgument, "fusion::Graph::output", "output '", name,
                      "' repeats a value or a name");
    check_name("output", name);
    outputs_.emplace_back(id, std::move(name));
  }

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int>& inputs() const { return inputs_; }
  const std::vector<std::pair<int, std::string>>& outputs() const { return outputs_; }
  bool has(NodeKind k) const {
    for (const Node& n : nodes_)
      if (n.kind == k) return true;
    return false;
  }
  // Whether the graph has a convolution node (forward or backward).
  bool has_conv() const { return has(NodeKind::conv2d) || has(NodeKind::conv2d_dgrad) || has(NodeKind::conv2d_wgrad); }
  bool has_norm() const {
    for (const Node& n : nodes_)
      if (is_norm(n.kind)) return true;
    return false;
  }
  // Whether every node has a derivative autograd::fused can take (no backward nodes, no norm
  // statistics).
  bool differentiable() const {
    for (const Node& n : nodes_)
      if ((n.kind >= NodeKind::conv2d_dgrad && n.kind <= NodeKind::sum_to) || n.kind >= NodeKind::batch_norm)
        return false;
    return true;
  }
  // Per value (g.nodes() order): whether the GPU has it in f32 (a norm's parameters and
  // statistics: inputs at a norm's parameter operands and the norm's parts), not in the dtype.
  std::vector<bool> f32_values() const {
    std::vector<bool> f(nodes_.size(), false);
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const Node& n = nodes_[i];
      if (n.kind == NodeKind::part) f[i] = true;
      if (!is_norm(n.kind)) continue;
      const auto ops = n.operands();
      for (int k = norm_param_slot(n.kind); k < 5; ++k)
        if (ops[static_cast<std::size_t>(k)] >= 0) f[static_cast<std::size_t>(ops[static_cast<std::size_t>(k)])] = true;
    }
    return f;
  }
  // Per input (g.inputs() order) and per output (g.outputs() order): f32_values() of each.
  std::vector<bool> f32_inputs() const {
    const auto f = f32_values();
    std::vector<bool> r;
    for (const int i : inputs_) r.push_back(f[static_cast<std::size_t>(i)]);
    return r;
  }
  std::vector<bool> f32_outputs() const {
    const auto f = f32_values();
    std::vector<bool> r;
    for (const auto& o : outputs_) r.push_back(f[static_cast<std::size_t>(o.first)]);
    return r;
  }

  // The pattern as text, for messages: "y = relu(add(conv2d(x, w), bias))"; a node used more
  // than once is written once, as "%3 = ...", and named %3 where it is used.
  std::string describe() const {
    const auto u = uses();
    std::string s;
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].kind != NodeKind::input && u[i] > 1)
        s += detail::cat(s.empty() ? "" : "; ", "%", i, " = ", expr(static_cast<int>(i), u, true));
    for (const auto& [id, name] : outputs_) s += (s.empty() ? "" : "; ") + name + " = " + expr(id, u, false);
    return outputs_.empty() ? "(no outputs)" : s;
  }

  // Every node with every parameter (alphas to 17 digits), one per value: the graph's identity
  // in plan files and the tuning cache, where describe() leaves parameters out.
  std::string key_text() const {
    std::string s;
    char buf[32];
    const auto num = [&](double v) {
      std::snprintf(buf, sizeof buf, "%.17g", v);
      return std::string(buf);
    };
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const Node& n = nodes_[i];
      s += detail::cat(i ? ";" : "", "%", i, "=", static_cast<int>(n.kind), "(", n.a, ",", n.b);
      for (const int o : {n.c, n.d, n.e})
        if (o >= 0) s += detail::cat(",", o);
      switch (n.kind) {
        case NodeKind::input: s += "," + n.name; break;
        case NodeKind::conv2d: case NodeKind::conv2d_dgrad: case NodeKind::conv2d_wgrad: {
          const Conv2dParams& p = n.conv;
          s += detail::cat(",s", p.stride_h, "x", p.stride_w, ",p", p.pad_top, ".", p.pad_bottom, ".", p.pad_left, ".",
                           p.pad_right, ",d", p.dilation_h, "x", p.dilation_w, ",g", p.groups);
          if (n.kind != NodeKind::conv2d) s += "," + n.shape.str();
          break;
        }
        case NodeKind::binary: s += detail::cat(",", static_cast<int>(n.binary)); break;
        case NodeKind::scale: case NodeKind::layer_norm: case NodeKind::rms_norm: case NodeKind::layer_norm_train:
        case NodeKind::rms_norm_train: s += "," + num(n.alpha); break;
        case NodeKind::batch_norm: s += "," + num(n.alpha) + "," + num(n.momentum); break;
        case NodeKind::part: s += detail::cat(",", n.part); break;
        case NodeKind::batch_norm_backward: case NodeKind::layer_norm_backward: case NodeKind::rms_norm_backward: break;
        case NodeKind::activation: case NodeKind::activation_backward:
          s += detail::cat(",", static_cast<int>(n.act.kind), ",") + num(n.act.alpha);
          break;
        case NodeKind::sum_to: s += "," + n.shape.str(); break;
        case NodeKind::matmul: break;
      }
      s += ")";
    }
    for (const auto& [id, name] : outputs_) s += detail::cat(";", name, "=%", id);
    return s;
  }

  // Throws unless the graph can run: it has outputs, every input feeds one, it fits a cuDNN graph.
  void check_complete(std::string_view op) const {
    CUTRAIN_REQUIRE(!outputs_.empty(), InvalidArgument, op, "the fusion graph has no outputs (Graph::output)");
    std::vector<bool> used(nodes_.size(), false);
    for (auto it = outputs_.rbegin(); it != outputs_.rend(); ++it) used[static_cast<std::size_t>(it->first)] = true;
    for (int i = static_cast<int>(nodes_.size()) - 1; i >= 0; --i) {
      if (!used[static_cast<std::size_t>(i)]) continue;
      for (const int o : nodes_[static_cast<std::size_t>(i)].operands())
        if (o >= 0) used[static_cast<std::size_t>(o)] = true;
    }
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      if (used[i]) continue;
      CUTRAIN_REQUIRE(nodes_[i].kind != NodeKind::input, InvalidArgument, op, describe(), ": input '", nodes_[i].name,
                      "' reaches no output");
      throw InvalidArgument(op, detail::cat(describe(), ": node ", i, " (", expr(static_cast<int>(i), uses(), true),
                                            ") reaches no output"));
    }
    const auto n = inputs_.size() + outputs_.size();
    CUTRAIN_REQUIRE(n <= static_cast<std::size_t>(max_tensors), NotImplemented, op, describe(), ": ", n,
                    " inputs and outputs; a fusion graph takes at most ", max_tensors);
    CUTRAIN_REQUIRE(!(has_conv() && has(NodeKind::matmul)), NotImplemented, op, describe(),
                    ": a fusion graph holds convolutions or matmuls, not both");
    CUTRAIN_REQUIRE(!(has(NodeKind::matmul) && has_norm()), NotImplemented, op, describe(),
                    ": a fusion graph with a norm takes 4-d tensors and no matmul");
    // A norm's parameters and statistics are f32 on the GPU: they are inputs or norms' results,
    // and feed norms' parameter operands only (or outputs).
    const auto f32 = f32_values();
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const Node& m = nodes_[i];
      if (m.kind == NodeKind::part) continue;
      const auto ops = m.operands();
      const int slot = is_norm(m.kind) ? norm_param_slot(m.kind) : 5;
      for (int k = 0; k < 5; ++k) {
        const int o = ops[static_cast<std::size_t>(k)];
        if (o < 0) continue;
        const Node& src = nodes_[static_cast<std::size_t>(o)];
        if (k >= slot)
          CUTRAIN_REQUIRE(src.kind == NodeKind::input || src.kind == NodeKind::part, InvalidArgument, op, describe(),
                          ": node ", i, ": a norm's parameters and statistics must be graph inputs or norms' results");
        else
          CUTRAIN_REQUIRE(!f32[static_cast<std::size_t>(o)], InvalidArgument, op, describe(), ": node ", i, " takes ",
                          expr(o, uses(), false),
                          ", a norm's parameter or statistic (f32 on the GPU), which may feed norms' parameters only");
      }
    }
  }

 private:
  Value part(Value of, int k) { return push(Node{.kind = NodeKind::part, .a = of.id, .part = k}); }
  NormGradResults norm_backward(NodeKind kind, std::string_view what, Value dy, Value x, Value gamma, Value mean,
                                Value inv_std) {
    const Value dx = push(Node{.kind = kind, .a = arg(what, dy), .b = arg(what, x), .c = arg(what, gamma),
                               .d = arg(what, mean), .e = arg(what, inv_std)});
    return {dx, part(dx, 1), part(dx, 2)};
  }
  Value push(Node n) {
    nodes_.push_back(std::move(n));
    return Value{static_cast<int>(nodes_.size()) - 1, tag_};
  }
  int arg(std::string_view what, Value v) const {
    CUTRAIN_REQUIRE(v.graph == tag_ && v.id >= 0 && v.id < static_cast<int>(nodes_.size()), InvalidArgument,
                    "fusion::Graph", what, ": value ", v.id, " is not of this graph (",
                    v.graph == tag_ ? "" : "another graph made it; ", nodes_.size(), " values)");
    return v.id;
  }
  // A random tag per graph, so that a Value of another graph is refused even where its id
  // exists here (a graph's copies share it: their values are the same nodes).
  static std::uint64_t fresh_tag() {
    std::random_device rd;
    const std::uint64_t t = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    return t == 0 ? 1 : t;
  }
  static void check_eps(std::string_view what, double eps) {
    CUTRAIN_REQUIRE(std::isfinite(eps) && eps > 0, InvalidArgument, "fusion::Graph", what,
                    ": eps must be finite and > 0, got ", eps);
  }
  void check_name(std::string_view what, const std::string& name) const {
    CUTRAIN_REQUIRE(!name.empty(), InvalidArgument, "fusion::Graph", what, " needs a name");
    for (const int i : inputs_)
      CUTRAIN_REQUIRE(nodes_[static_cast<std::size_t>(i)].name != name, InvalidArgument, "fusion::Graph", what,
                      " name '", name, "' is taken by an input");
  }
  // How many nodes and outputs use each value.
  std::vector<int> uses() const {
    std::vector<int> u(nodes_.size(), 0);
    for (const Node& n : nodes_)
      for (const int o : n.operands())
        if (o >= 0) ++u[static_cast<std::size_t>(o)];
    for (const auto& o : outputs_) ++u[static_cast<std::size_t>(o.first)];
    return u;
  }
  // Node id as text; a node used more than once is "%id", unless `whole` (its definition).
  std::string expr(int id, const std::vector<int>& u, bool whole) const {
    const Node& n = nodes_[static_cast<std::size_t>(id)];
    if (n.kind == NodeKind::input) return n.name;
    if (!whole && u[static_cast<std::size_t>(id)] > 1) return detail::cat("%", id);
    const auto e = [&](int v) { return expr(v, u, false); };
    switch (n.kind) {
      case NodeKind::input: return n.name;
      case NodeKind::conv2d: return "conv2d(" + e(n.a) + ", " + e(n.b) + ")";
      case NodeKind::matmul: return "matmul(" + e(n.a) + ", " + e(n.b) + ")";
      case NodeKind::binary: return std::string(to_string(n.binary)) + "(" + e(n.a) + ", " + e(n.b) + ")";
      case NodeKind::scale: return detail::cat("scale(", e(n.a), ", ", n.alpha, ")");
      case NodeKind::activation: return std::string(to_string(n.act.kind)) + "(" + e(n.a) + ")";
      case NodeKind::conv2d_dgrad: return "conv2d_dgrad(" + e(n.a) + ", " + e(n.b) + ")";
      case NodeKind::conv2d_wgrad: return "conv2d_wgrad(" + e(n.a) + ", " + e(n.b) + ")";
      case NodeKind::activation_backward:
        return std::string(to_string(n.act.kind)) + "_backward(" + e(n.a) + ", " + e(n.b) + ")";
      case NodeKind::sum_to: return detail::cat("sum_to(", e(n.a), ", ", n.shape, ")");
      case NodeKind::layer_norm: return "layer_norm(" + e(n.a) + ", " + e(n.b) + ", " + e(n.c) + ")";
      case NodeKind::rms_norm: return "rms_norm(" + e(n.a) + ", " + e(n.b) + ")";
      case NodeKind::part:
        return std::string(result_name(nodes_[static_cast<std::size_t>(n.a)].kind, n.part)) + "(" + e(n.a) + ")";
      case NodeKind::batch_norm: case NodeKind::layer_norm_train: case NodeKind::rms_norm_train:
      case NodeKind::batch_norm_backward: case NodeKind::layer_norm_backward: case NodeKind::rms_norm_backward: {
        std::string t = kind_name(n.kind);
        const char* sep = "(";
        for (const int o : n.operands())
          if (o >= 0) t += sep + e(o), sep = ", ";
        return t + ")";
      }
    }
    return "?";
  }

  std::uint64_t tag_ = fresh_tag();
  std::vector<Node> nodes_;
  std::vector<int> inputs_;
  std::vector<std::pair<int, std::string>> outputs_;
};

}  // namespace cutrain::inline CUTRAIN_ABI::fusion
