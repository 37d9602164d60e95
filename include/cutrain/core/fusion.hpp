// A fusion graph's description: inputs (placeholders), nodes (convolution, matmul, pointwise
// binary ops, scale, activations) and outputs, independent of dtype and device. Its shapes come
// from the tensors it is run on (infer_shapes). ops/fusion.hpp runs it: as one cuDNN graph on the
// GPU (cuda/cudnn/fusion.hpp), as the composition of cutrain's ops on the CPU.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/params/activation.hpp"
#include "cutrain/core/params/conv2d.hpp"
#include "cutrain/core/params/elementwise.hpp"
#include "cutrain/core/shape.hpp"

namespace cutrain::inline CUTRAIN_ABI::fusion {

enum class NodeKind : std::uint8_t { input, conv2d, matmul, binary, scale, activation };

// A value of the graph: an input or a node's result (an index into Graph::nodes()).
struct Value {
  int id = -1;
};

struct Node {
  NodeKind kind = NodeKind::input;
  int a = -1, b = -1;  // operands (node ids); -1: none
  Conv2dParams conv{};
  BinaryOp binary = BinaryOp::add;
  ActivationParams act{};
  double alpha = 1.0;  // scale
  std::string name{};  // inputs and outputs
};

class Graph {
 public:
  // Inputs and outputs the GPU's variant pack takes: cuDNN graphs here take at most 16 tensors.
  static constexpr int max_tensors = 16;

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
    return push(Node{.kind = NodeKind::scale, .a = arg("scale", a), .alpha = alpha});
  }
  Value activation(Value a, const ActivationParams& act) {
    detail::check_activation("fusion activation", act);
    return push(Node{.kind = NodeKind::activation, .a = arg("activation", a), .act = act});
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

  // The pattern as text, for messages and plan keys: "y = relu(add(conv2d(x, w), bias))".
  std::string describe() const {
    std::string s;
    for (const auto& [id, name] : outputs_) s += (s.empty() ? "" : "; ") + name + " = " + expr(id);
    return s.empty() ? "(no outputs)" : s;
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
    }
    for (const int in : inputs_)
      CUTRAIN_REQUIRE(used[static_cast<std::size_t>(in)], InvalidArgument, op, describe(), ": input '",
                      nodes_[static_cast<std::size_t>(in)].name, "' reaches no output");
    const auto n = inputs_.size() + outputs_.size();
    CUTRAIN_REQUIRE(n <= static_cast<std::size_t>(max_tensors), NotImplemented, op, describe(), ": ", n,
                    " inputs and outputs; a fusion graph takes at most ", max_tensors);
    CUTRAIN_REQUIRE(!(has(NodeKind::conv2d) && has(NodeKind::matmul)), NotImplemented, op, describe(),
                    ": a fusion graph holds convolutions or matmuls, not both");
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
  void check_name(std::string_view what, const std::string& name) const {
    CUTRAIN_REQUIRE(!name.empty(), InvalidArgument, "fusion::Graph", what, " needs a name");
    for (const int i : inputs_)
      CUTRAIN_REQUIRE(nodes_[static_cast<std::size_t>(i)].name != name, InvalidArgument, "fusion::Graph", what,
                      " name '", name, "' is taken by an input");
  }
  std::string expr(int id) const {
    const Node& n = nodes_[static_cast<std::size_t>(id)];
    switch (n.kind) {
      case NodeKind::input: return n.name;
      case NodeKind::conv2d: return "conv2d(" + expr(n.a) + ", " + expr(n.b) + ")";
      case NodeKind::matmul: return "matmul(" + expr(n.a) + ", " + expr(n.b) + ")";
      case NodeKind::binary: return std::string(to_string(n.binary)) + "(" + expr(n.a) + ", " + expr(n.b) + ")";
      case NodeKind::scale: return detail::cat("scale(", expr(n.a), ", ", n.alpha, ")");
      case NodeKind::activation: return std::string(to_string(n.act.kind)) + "(" + expr(n.a) + ")";
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
