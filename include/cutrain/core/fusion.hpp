// A fusion graph's description: inputs (placeholders), nodes (convolution forward, backward data
// and backward filter, matmul, pointwise binary ops, scale, activations and their backward, sums
// down to a shape, layer and RMS norm) and outputs, independent of dtype and device. Its shapes come
// from the tensors it is run on (infer_shapes). ops/fusion.hpp runs it: as one cuDNN graph on the
// GPU (cuda/cudnn/fusion.hpp), as the composition of cutrain's ops on the CPU.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
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
  layer_norm, rms_norm,  // new kinds go last: key_text numbers them
};

// A value of the graph: an input or a node's result (an index into Graph::nodes()).
struct Value {
  int id = -1;
};

struct Node {
  NodeKind kind = NodeKind::input;
  int a = -1, b = -1, c = -1;  // operands (node ids); -1: none
  Conv2dParams conv{};
  BinaryOp binary = BinaryOp::add;
  ActivationParams act{};
  double alpha = 1.0;  // scale; layer_norm, rms_norm: epsilon
  Shape shape{};       // conv2d_dgrad: x's shape; conv2d_wgrad: w's shape; sum_to: the target
  std::string name{};  // inputs and outputs
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
  // Whether every node has a derivative autograd::fused can take (no backward nodes).
  bool differentiable() const {
    return !has(NodeKind::conv2d_dgrad) && !has(NodeKind::conv2d_wgrad) && !has(NodeKind::activation_backward) &&
           !has(NodeKind::sum_to);
  }
  static bool is_norm(NodeKind k) { return k == NodeKind::layer_norm || k == NodeKind::rms_norm; }
  // Per input (g.inputs() order): whether it is a norm's gamma or beta, which the GPU takes in f32.
  std::vector<bool> norm_parameters() const {
    std::vector<bool> p(inputs_.size(), false);
    for (std::size_t i = 0; i < inputs_.size(); ++i)
      for (const Node& n : nodes_)
        if (is_norm(n.kind) && (n.b == inputs_[i] || n.c == inputs_[i])) p[i] = true;
    return p;
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
      if (n.c >= 0) s += detail::cat(",", n.c);
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
        case NodeKind::scale: case NodeKind::layer_norm: case NodeKind::rms_norm: s += "," + num(n.alpha); break;
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
      const Node& n = nodes_[static_cast<std::size_t>(i)];
      if (n.a >= 0) used[static_cast<std::size_t>(n.a)] = true;
      if (n.b >= 0) used[static_cast<std::size_t>(n.b)] = true;
      if (n.c >= 0) used[static_cast<std::size_t>(n.c)] = true;
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
    CUTRAIN_REQUIRE(!(has(NodeKind::matmul) && (has(NodeKind::layer_norm) || has(NodeKind::rms_norm))), NotImplemented,
                    op, describe(), ": a fusion graph with a norm takes 4-d tensors and no matmul");
    // A norm's gamma and beta are inputs the GPU passes in f32: they feed norms' parameters only.
    const auto params = norm_parameters();
    for (std::size_t i = 0; i < inputs_.size(); ++i) {
      if (!params[i]) continue;
      for (const Node& m : nodes_)
        CUTRAIN_REQUIRE(m.a != inputs_[i] && (is_norm(m.kind) || m.b != inputs_[i]), InvalidArgument, op, describe(),
                        ": '", nodes_[static_cast<std::size_t>(inputs_[i])].name,
                        "' is a norm's gamma or beta and so may feed norms' gamma and beta only");
    }
    for (const Node& m : nodes_)
      if (is_norm(m.kind))
        for (const int p : {m.b, m.c})
          CUTRAIN_REQUIRE(p < 0 || nodes_[static_cast<std::size_t>(p)].kind == NodeKind::input, InvalidArgument, op,
                          describe(), ": a norm's gamma and beta must be graph inputs");
  }

 private:
  Value push(Node n) {
    nodes_.push_back(std::move(n));
    return Value{static_cast<int>(nodes_.size()) - 1};
  }
  int arg(std::string_view what, Value v) const {
    CUTRAIN_REQUIRE(v.id >= 0 && v.id < static_cast<int>(nodes_.size()), InvalidArgument, "fusion::Graph", what,
                    ": value ", v.id, " is not of this graph (", nodes_.size(), " values)");
    return v.id;
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
    for (const Node& n : nodes_) {
      if (n.a >= 0) ++u[static_cast<std::size_t>(n.a)];
      if (n.b >= 0) ++u[static_cast<std::size_t>(n.b)];
      if (n.c >= 0) ++u[static_cast<std::size_t>(n.c)];
    }
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
    }
    return "?";
  }

  std::vector<Node> nodes_;
  std::vector<int> inputs_;
  std::vector<std::pair<int, std::string>> outputs_;
};

// The rank a GPU graph describes every tensor at: 4, or 3 with a matmul (cuDNN's batched
// [B, M, K] x [B, K, N]). No value may have a higher rank.
inline int described_rank(const Graph& g) { return g.has(NodeKind::matmul) ? 3 : 4; }

// The shape of every value (indexed like g.nodes()) when the inputs have `inputs`' shapes, in
// g.inputs() order; InvalidArgument names the pattern, the node and the shapes.
inline std::vector<Shape> infer_shapes(const Graph& g, const std::vector<Shape>& inputs, std::string_view op) {
  CUTRAIN_REQUIRE(inputs.size() == g.inputs().size(), InvalidArgument, op, g.describe(), ": takes ",
                  g.inputs().size(), " inputs, got ", inputs.size());
  std::vector<Shape> s(g.nodes().size());
  for (std::size_t i = 0; i < inputs.size(); ++i) s[static_cast<std::size_t>(g.inputs()[i])] = inputs[i];
  const auto at = [&](int id) -> const Shape& { return s[static_cast<std::size_t>(id)]; };
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    try {
      switch (n.kind) {
        case NodeKind::input: break;
        case NodeKind::conv2d: s[i] = conv2d_output_shape(at(n.a), at(n.b), n.conv, "conv2d"); break;
        case NodeKind::matmul: {
          const Shape &a = at(n.a), &b = at(n.b);
          CUTRAIN_REQUIRE((a.rank() == 2 || a.rank() == 3) && (b.rank() == 2 || b.rank() == 3), InvalidArgument,
                          "matmul", "takes operands of rank 2 or 3, got ", a, " and ", b);
          const std::int64_t m = a[a.rank() - 2], k = a[a.rank() - 1], kb = b[b.rank() - 2], nn = b[b.rank() - 1];
          CUTRAIN_REQUIRE(k == kb, InvalidArgument, "matmul", a, " x ", b, ": inner dims ", k, " and ", kb, " differ");
          const std::int64_t ba = a.rank() == 3 ? a[0] : 1, bb = b.rank() == 3 ? b[0] : 1;
          CUTRAIN_REQUIRE(ba == bb || ba == 1 || bb == 1, InvalidArgument, "matmul", a, " x ", b, ": batches ", ba,
                          " and ", bb, " differ");
          s[i] = (a.rank() == 3 || b.rank() == 3) ? Shape{ba > bb ? ba : bb, m, nn} : Shape{m, nn};
          break;
        }
        case NodeKind::binary: s[i] = broadcast_shape(to_string(n.binary), at(n.a), at(n.b)); break;
        case NodeKind::scale:
        case NodeKind::activation: s[i] = at(n.a); break;
        case NodeKind::conv2d_dgrad: {
          const Shape y = conv2d_output_shape(n.shape, at(n.b), n.conv, "conv2d_dgrad");
          CUTRAIN_REQUIRE(at(n.a) == y, InvalidArgument, "conv2d_dgrad", "dy ", at(n.a), " is not the output shape ", y,
                          " of x ", n.shape, " and w ", at(n.b));
          s[i] = n.shape;
          break;
        }
        case NodeKind::conv2d_wgrad: {
          const Shape y = conv2d_output_shape(at(n.b), n.shape, n.conv, "conv2d_wgrad");
          CUTRAIN_REQUIRE(at(n.a) == y, InvalidArgument, "conv2d_wgrad", "dy ", at(n.a), " is not the output shape ", y,
                          " of x ", at(n.b), " and w ", n.shape);
          s[i] = n.shape;
          break;
        }
        case NodeKind::activation_backward:
          CUTRAIN_REQUIRE(at(n.a) == at(n.b), InvalidArgument, "activation_backward", "dy ", at(n.a), " and x ", at(n.b),
                          " differ in shape");
          s[i] = at(n.a);
          break;
        case NodeKind::sum_to:
          detail::sum_to_dims("sum_to", at(n.a), n.shape);
          s[i] = n.shape;
          break;
        case NodeKind::layer_norm:
        case NodeKind::rms_norm: {
          const char* what = n.kind == NodeKind::layer_norm ? "layer_norm" : "rms_norm";
          const Shape& x = at(n.a);
          CUTRAIN_REQUIRE(x.rank() == 4, InvalidArgument, what, "x ", x,
                          " must be 4-d [N, C, H, W], normalized over C, H, W (view [rows, D] as [rows, D, 1, 1])");
          const Shape p{x[1], x[2], x[3]};
          CUTRAIN_REQUIRE(at(n.b) == p, InvalidArgument, what, "gamma ", at(n.b), " must be x's [C, H, W] ", p, " (x ", x,
                          ")");
          CUTRAIN_REQUIRE(n.c < 0 || at(n.c) == p, InvalidArgument, what, "beta ", at(n.c), " must be x's [C, H, W] ", p,
                          " (x ", x, ")");
          s[i] = x;
          break;
        }
      }
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(op, detail::cat(g.describe(), ": node ", i, ": ", e.what()));
    }
    CUTRAIN_REQUIRE(s[i].rank() <= described_rank(g), NotImplemented, op, g.describe(), ": node ", i, " has shape ",
                    s[i], "; fusion graphs take tensors of rank <= 4 (<= 3 with a matmul)");
  }
  return s;
}

// s and st with leading dims of 1 up to rank r (the broadcasting alignment, from the right).
inline std::pair<Shape, Strides> at_rank(const Shape& s, const Strides& st, int r) {
  CUTRAIN_REQUIRE(s.rank() <= r, NotImplemented, "fusion", "shape ", s, " has rank above ", r);
  std::vector<std::int64_t> d(static_cast<std::size_t>(r), 1), t(static_cast<std::size_t>(r), 1);
  const int lead = r - s.rank();
  const std::int64_t outer = s.rank() == 0 ? 1 : s[0] * st[0];
  for (int i = 0; i < r; ++i) {
    t[static_cast<std::size_t>(i)] = i < lead ? outer : st[i - lead];
    d[static_cast<std::size_t>(i)] = i < lead ? 1 : s[i - lead];
  }
  return {Shape(std::move(d)), std::move(t)};
}

// Packed strides of s: NHWC order for a 4-d s when nhwc, else row-major.
inline Strides packed_strides(const Shape& s, bool nhwc) {
  if (nhwc && s.rank() == 4) return Strides{s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};
  std::vector<std::int64_t> st(static_cast<std::size_t>(s.rank()), 1);
  for (int i = s.rank() - 2; i >= 0; --i)
    st[static_cast<std::size_t>(i)] = st[static_cast<std::size_t>(i) + 1] * s[i + 1];
  return st;
}

}  // namespace cutrain::inline CUTRAIN_ABI::fusion
