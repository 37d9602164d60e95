// deploy::detail::OnnxGraph: the nodes, initializers, inputs and outputs of one ONNX graph as it
// is built, encoded into a ModelProto at the end (deploy/onnx_proto.hpp has the wire format).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/shape.hpp"
#include "cutrain/deploy/onnx_proto.hpp"
#include "cutrain/version.hpp"

namespace cutrain::inline CUTRAIN_ABI::deploy::detail {

struct OnnxAttr {
  std::string name;
  proto::AttributeType type = proto::AttributeType::integer;
  std::int64_t i = 0;
  float f = 0;
  std::vector<std::int64_t> ints;
};
inline OnnxAttr attr_int(std::string name, std::int64_t v) {
  return {.name = std::move(name), .type = proto::AttributeType::integer, .i = v, .f = 0, .ints = {}};
}
inline OnnxAttr attr_float(std::string name, float v) {
  return {.name = std::move(name), .type = proto::AttributeType::floating, .i = 0, .f = v, .ints = {}};
}
inline OnnxAttr attr_ints(std::string name, std::vector<std::int64_t> v) {
  return {.name = std::move(name), .type = proto::AttributeType::ints, .ints = std::move(v)};
}

inline std::vector<std::int64_t> dims_of(const Shape& s) {
  std::vector<std::int64_t> d;
  for (int i = 0; i < s.rank(); ++i) d.push_back(s[i]);
  return d;
}

class OnnxGraph {
 public:
  // A float initializer; returns its name.
  std::string initializer(const std::string& name, const Shape& shape, const std::vector<float>& data) {
    namespace f = proto::field::tensor;
    proto::Writer t;
    t.ints_field(f::dims, dims_of(shape));
    t.int_field(f::data_type, proto::data_type_float);
    t.string_field(f::name, name);
    t.bytes_field(f::raw_data, proto::raw_floats(data));
    initializers_.push_back(std::move(t));
    ++initializer_count_;
    return name;
  }
  // An int64 initializer (shapes for Reshape, indices for Gather); returns its name.
  std::string int64_initializer(const Shape& shape, const std::vector<std::int64_t>& data) {
    namespace f = proto::field::tensor;
    const std::string name = "const_i" + std::to_string(int64_count_++);
    proto::Writer t;
    t.ints_field(f::dims, dims_of(shape));
    t.int_field(f::data_type, proto::data_type_int64);
    t.string_field(f::name, name);
    t.bytes_field(f::raw_data, proto::raw_int64s(data));
    initializers_.push_back(std::move(t));
    ++initializer_count_;
    return name;
  }
  // A scalar constant (one initializer per distinct value).
  std::string scalar(float v) {
    const auto it = scalars_.find(v);
    if (it != scalars_.end()) return it->second;
    const std::string name = initializer("const_" + std::to_string(scalars_.size()), Shape{}, {v});
    scalars_.emplace(v, name);
    return name;
  }

  // A node with one output; returns the output's name.
  std::string node(const std::string& op_type, const std::vector<std::string>& inputs,
                   const std::vector<OnnxAttr>& attrs = {}) {
    const std::string out = "t" + std::to_string(nodes_.size());
    nodes_.push_back({op_type, inputs, out, attrs});
    return out;
  }
  // Renames the value `from` (a node's output) to `to` wherever it appears.
  void rename(const std::string& from, const std::string& to) {
    for (auto& n : nodes_) {
      if (n.output == from) n.output = to;
      for (auto& in : n.inputs)
        if (in == from) in = to;
    }
  }

  void input(const std::string& name, const Shape& shape, std::int64_t elem_type = proto::data_type_float) {
    inputs_.push_back(value_info(name, shape, elem_type));
  }
  void output(const std::string& name, const Shape& shape) { outputs_.push_back(value_info(name, shape)); }

  std::vector<std::string> op_types() const {
    std::vector<std::string> out;
    for (const auto& n : nodes_) out.push_back(n.op_type);
    return out;
  }
  std::size_t initializer_count() const { return initializer_count_; }

  // The ModelProto bytes: IR version 8, the default domain at opset 17.
  std::string model_bytes(std::string_view graph_name) const {
    namespace g = proto::field::graph;
    namespace m = proto::field::model;
    proto::Writer graph;
    for (std::size_t i = 0; i < nodes_.size(); ++i) graph.message(g::node, encode(nodes_[i], i));
    graph.string_field(g::name, graph_name);
    for (const auto& t : initializers_) graph.message(g::initializer, t);
    for (const auto& v : inputs_) graph.message(g::input, v);
    for (const auto& v : outputs_) graph.message(g::output, v);
    proto::Writer opset;
    opset.string_field(proto::field::opset::domain, "");
    opset.int_field(proto::field::opset::version, 17);
    proto::Writer model;
    model.int_field(m::ir_version, proto::ir_version);
    model.string_field(m::producer_name, "cutrain");
    model.string_field(m::producer_version, cutrain::version_string);
    model.message(m::graph, graph);
    model.message(m::opset_import, opset);
    return model.bytes();
  }

 private:
  struct Node {
    std::string op_type;
    std::vector<std::string> inputs;
    std::string output;
    std::vector<OnnxAttr> attrs;
  };
  static proto::Writer encode(const Node& node, std::size_t index) {
    namespace f = proto::field::node;
    proto::Writer n;
    for (const auto& in : node.inputs) n.string_field(f::input, in);
    n.string_field(f::output, node.output);
    n.string_field(f::name, node.op_type + "_" + std::to_string(index));
    n.string_field(f::op_type, node.op_type);
    for (const auto& a : node.attrs) n.message(f::attribute, encode(a));
    return n;
  }
  static proto::Writer encode(const OnnxAttr& a) {
    namespace f = proto::field::attribute;
    proto::Writer w;
    w.string_field(f::name, a.name);
    switch (a.type) {
      case proto::AttributeType::integer: w.int_field(f::i, a.i); break;
      case proto::AttributeType::floating: w.float_field(f::f, a.f); break;
      case proto::AttributeType::ints: w.ints_field(f::ints, a.ints); break;
      default: break;
    }
    w.int_field(f::type, static_cast<std::int64_t>(a.type));
    return w;
  }
  static proto::Writer value_info(const std::string& name, const Shape& shape,
                                  std::int64_t elem_type = proto::data_type_float) {
    namespace t = proto::field::type_proto;
    proto::Writer dims;
    for (int i = 0; i < shape.rank(); ++i) {
      proto::Writer d;
      d.int_field(t::dim_value, shape[i]);
      dims.message(t::dim, d);
    }
    proto::Writer tensor;
    tensor.int_field(t::elem_type, elem_type);
    tensor.message(t::shape, dims);
    proto::Writer type;
    type.message(t::tensor_type, tensor);
    proto::Writer v;
    v.string_field(proto::field::value_info::name, name);
    v.message(proto::field::value_info::type, type);
    return v;
  }

  std::vector<Node> nodes_;
  std::vector<proto::Writer> initializers_, inputs_, outputs_;
  std::map<float, std::string> scalars_;
  std::size_t initializer_count_ = 0, int64_count_ = 0;
};

}  // namespace cutrain::inline CUTRAIN_ABI::deploy::detail
