// deploy::export_onnx(model, path, example_shape): writes a trained nn::Sequential as a standard
// ONNX model (IR 8, opset 17) that ONNX Runtime and TensorRT run. The graph is the model in eval
// mode: batch norm with its running statistics (as a BatchNormalization node, not folded, so the
// file maps one to one onto the modules), dropout removed. Weights are f32 initializers named as
// in visit_params ("0.weight", "3.conv1.weight"); the input "input" and output "output" have
// the static shape that example_shape gives. Transformer blocks and attention (tokens [B, S, C])
// are written out in opset-17 ops (onnx_gpt.hpp exports a whole nn::GPT). See docs/deploy.md for
// the op mapping.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <numbers>
#include <string>
#include <typeinfo>
#include <vector>

#include "cutrain/core/files.hpp"
#include "cutrain/core/params/attention.hpp"
#include "cutrain/core/params/conv2d.hpp"
#include "cutrain/core/params/pool2d.hpp"
#include "cutrain/deploy/common.hpp"
#include "cutrain/deploy/onnx_graph.hpp"
#include "cutrain/nn/batch_norm.hpp"
#include "cutrain/nn/conv2d.hpp"
#include "cutrain/nn/layer_norm.hpp"
#include "cutrain/nn/layers.hpp"
#include "cutrain/nn/linear.hpp"
#include "cutrain/nn/residual.hpp"
#include "cutrain/nn/rms_norm.hpp"
#include "cutrain/nn/sequential.hpp"
#include "cutrain/nn/transformer.hpp"

namespace cutrain::inline CUTRAIN_ABI::deploy {

namespace detail {

inline constexpr std::string_view export_op = "deploy::export_onnx";

template <class T>
std::vector<float> floats_of(const Tensor<T>& t) {
  std::vector<float> out;
  for (const T v : t.to_vector()) out.push_back(static_cast<float>(v));
  return out;
}

// A value of the graph: its name and its (static) shape.
struct Value {
  std::string name;
  Shape shape;
};

// Lowers the modules of one Sequential<T> into an OnnxGraph, tracking shapes as it goes.
template <class T>
class Lowering {
 public:
  explicit Lowering(OnnxGraph& g) : g_(g) {}

  Value sequential(const nn::Sequential<T>& model, Value x) {
    for (std::size_t i = 0; i < model.size(); ++i) x = module(model, i, std::move(x));
    return x;
  }

 private:
  Value module(const nn::Sequential<T>& m, std::size_t i, Value x) {
    const std::string p = std::to_string(i);
    if (const auto* c = m.template get_if<nn::Conv2d<T>>(i)) return conv(*c, x, p, i);
    if (const auto* b = m.template get_if<nn::BatchNorm2d<T>>(i)) return batch_norm(*b, x, p, i);
    if (const auto* l = m.template get_if<nn::Linear<T>>(i)) return linear(*l, x, p, i);
    if (const auto* r = m.template get_if<nn::ResidualBlock<T>>(i)) return residual(*r, x, p, i);
    if (const auto* a = m.template get_if<nn::MultiheadAttention<T>>(i)) {
      require_tokens(x, a->options().dim, "MultiheadAttention", i);
      return attention(*a, x, p, i);
    }
    if (const auto* b = m.template get_if<nn::TransformerBlock<T>>(i)) {
      require_tokens(x, b->attn.options().dim, "TransformerBlock", i);
      return transformer_block(*b, x, p, i);
    }
    if (m.template get_if<nn::ReLU>(i)) return {g_.node("Relu", {x.name}), x.shape};
    if (const auto* a = m.template get_if<nn::Activation>(i)) return activation(a->params, x, i);
    if (const auto* mp = m.template get_if<nn::MaxPool2d>(i)) return pool(mp->params_for(x.shape), x, i);
    if (const auto* ap = m.template get_if<nn::AvgPool2d>(i)) return pool(ap->params_for(x.shape), x, i);
    if (m.template get_if<nn::AdaptiveAvgPool2d>(i)) {
      require_rank(x, 4, "AdaptiveAvgPool2d", i);
      return {g_.node("GlobalAveragePool", {x.name}), Shape{x.shape[0], x.shape[1], 1, 1}};
    }
    if (m.template get_if<nn::Flatten>(i)) {
      CUTRAIN_REQUIRE(x.shape.rank() >= 1, InvalidArgument, export_op, "module ", i, " (Flatten) gets a 0-d input");
      std::int64_t rest = 1;
      for (int d = 1; d < x.shape.rank(); ++d) rest *= x.shape[d];
      return {g_.node("Flatten", {x.name}, {attr_int("axis", 1)}), Shape{x.shape[0], rest}};
    }
    if (m.template get_if<nn::Dropout>(i)) return x;  // identity in eval mode
    if (const auto* ln = m.template get_if<nn::LayerNorm<T>>(i)) return layer_norm(*ln, x, p, i);
    if (const auto* rn = m.template get_if<nn::RMSNorm<T>>(i)) return rms_norm(*rn, x, p, i);
    if (const auto* sm = m.template get_if<nn::Softmax>(i)) {
      const int r = x.shape.rank(), axis = sm->axis < 0 ? sm->axis + r : sm->axis;
      CUTRAIN_REQUIRE(axis >= 0 && axis < r, InvalidArgument, export_op, "module ", i, " (Softmax): axis ", sm->axis,
                      " is outside a ", r, "-d input ", x.shape);
      return {g_.node("Softmax", {x.name}, {attr_int("axis", axis)}), x.shape};
    }
    throw NotImplemented(std::string(export_op),
                         cutrain::detail::cat("module ", i, " is a ", type_name(m.module_type(i)),
                                              ", which has no ONNX export (see docs/deploy.md for the modules that do)"));
  }

  // The lowering of each module, public for the exporters of other model types (onnx_gpt.hpp).
 public:
  static void require_rank(const Value& x, int rank, std::string_view what, std::size_t i) {
    CUTRAIN_REQUIRE(x.shape.rank() == rank, InvalidArgument, export_op, "module ", i, " (", what, ") needs a ", rank,
                    "-d input, got ", x.shape);
  }

  static void require_tokens(const Value& x, std::int64_t dim, std::string_view what, std::size_t i) {
    CUTRAIN_REQUIRE(x.shape.rank() == 3 && x.shape[2] == dim, InvalidArgument, export_op, "module ", i, " (", what,
                    " of dim ", dim, ") needs tokens [B, S, ", dim, "], got ", x.shape);
  }

  Value conv(const nn::Conv2d<T>& c, const Value& x, const std::string& p, std::size_t i) {
    require_rank(x, 4, "Conv2d", i);
    const Shape& ws = c.weight.shape();
    const Conv2dParams cp = c.params_for(x.shape);
    const Shape y = conv2d_output_shape(x.shape, ws, cp, export_op);
    std::vector<std::string> in{x.name, g_.initializer(p + ".weight", ws, floats_of(c.weight.value()))};
    if (c.bias.defined()) in.push_back(g_.initializer(p + ".bias", c.bias.shape(), floats_of(c.bias.value())));
    return {g_.node("Conv", in,
                    {attr_ints("kernel_shape", {ws[2], ws[3]}),
                     attr_ints("pads", {cp.pad_top, cp.pad_left, cp.pad_bottom, cp.pad_right}),
                     attr_ints("strides", {cp.stride_h, cp.stride_w}),
                     attr_ints("dilations", {cp.dilation_h, cp.dilation_w}), attr_int("group", cp.groups)}),
            y};
  }

  Value batch_norm(const nn::BatchNorm2d<T>& b, const Value& x, const std::string& p, std::size_t i) {
    const std::int64_t c = b.options().features;
    CUTRAIN_REQUIRE((x.shape.rank() == 4 || x.shape.rank() == 2) && x.shape[1] == c, InvalidArgument, export_op,
                    "module ", i, " (BatchNorm2d of ", c, " features) needs [N, ", c, ", H, W] or [N, ", c, "], got ",
                    x.shape);
    const Shape s{c};
    const std::vector<std::string> in{x.name, g_.initializer(p + ".weight", s, floats_of(b.weight.value())),
                                      g_.initializer(p + ".bias", s, floats_of(b.bias.value())),
                                      g_.initializer(p + ".running_mean", s, floats_of(b.running_mean)),
                                      g_.initializer(p + ".running_var", s, floats_of(b.running_var))};
    return {g_.node("BatchNormalization", in, {attr_float("epsilon", static_cast<float>(b.options().eps))}), x.shape};
  }

  Value linear(const nn::Linear<T>& l, const Value& x, const std::string& p, std::size_t i) {
    const std::int64_t in_f = l.options().in, out_f = l.options().out;
    CUTRAIN_REQUIRE(x.shape.rank() == 2 && x.shape[1] == in_f, NotImplemented, export_op, "module ", i, " (Linear ",
                    in_f, " -> ", out_f, ") is exported as Gemm, which needs a [N, ", in_f, "] input, got ", x.shape);
    std::vector<std::string> in{x.name, g_.initializer(p + ".weight", l.weight.shape(), floats_of(l.weight.value()))};
    if (l.bias.defined()) in.push_back(g_.initializer(p + ".bias", l.bias.shape(), floats_of(l.bias.value())));
    return {g_.node("Gemm", in, {attr_int("transB", 1)}), Shape{x.shape[0], out_f}};
  }

  // The first normalized axis of x for a norm over its trailing dims `dims`.
  static std::int64_t norm_axis(const Value& x, const Shape& dims, std::string_view what, std::size_t i) {
    const int r = x.shape.rank(), k = dims.rank();
    bool ok = k <= r - 1;
    for (int d = 0; ok && d < k; ++d) ok = x.shape[r - k + d] == dims[d];
    CUTRAIN_REQUIRE(ok, InvalidArgument, export_op, "module ", i, " (", what, " over ", dims, ") does not take ", x.shape);
    return r - k;
  }

  Value layer_norm(const nn::LayerNorm<T>& ln, const Value& x, const std::string& p, std::size_t i) {
    const Shape& s = ln.weight.shape();
    const std::int64_t axis = norm_axis(x, s, "LayerNorm", i);
    const std::vector<std::string> in{x.name, g_.initializer(p + ".weight", s, floats_of(ln.weight.value())),
                                      g_.initializer(p + ".bias", s, floats_of(ln.bias.value()))};
    return {g_.node("LayerNormalization", in,
                    {attr_int("axis", axis), attr_float("epsilon", static_cast<float>(ln.options().eps))}),
            x.shape};
  }

  // opset 17 has no RMSNormalization (it is opset 23's): x / sqrt(mean(x^2) + eps) * weight.
  Value rms_norm(const nn::RMSNorm<T>& rn, const Value& x, const std::string& p, std::size_t i) {
    const Shape& s = rn.weight.shape();
    const std::int64_t axis = norm_axis(x, s, "RMSNorm", i);
    std::vector<std::int64_t> axes;
    for (std::int64_t d = axis; d < x.shape.rank(); ++d) axes.push_back(d);
    const auto ms = g_.node("ReduceMean", {g_.node("Mul", {x.name, x.name})}, {attr_ints("axes", axes), attr_int("keepdims", 1)});
    const auto rms = g_.node("Sqrt", {g_.node("Add", {ms, g_.scalar(static_cast<float>(rn.options().eps))})});
    const auto w = g_.initializer(p + ".weight", s, floats_of(rn.weight.value()));
    return {g_.node("Mul", {g_.node("Div", {x.name, rms}), w}), x.shape};
  }

  // relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))
  Value residual(const nn::ResidualBlock<T>& r, const Value& x, const std::string& p, std::size_t i) {
    Value h = conv(r.conv1, x, p + ".conv1", i);
    h = batch_norm(r.bn1, h, p + ".bn1", i);
    h = {g_.node("Relu", {h.name}), h.shape};
    h = conv(r.conv2, h, p + ".conv2", i);
    h = batch_norm(r.bn2, h, p + ".bn2", i);
    Value s = x;
    if (r.shortcut_conv) {
      s = conv(*r.shortcut_conv, x, p + ".shortcut.conv", i);
      s = batch_norm(*r.shortcut_bn, s, p + ".shortcut.bn", i);
    }
    CUTRAIN_REQUIRE(s.shape == h.shape, InvalidArgument, export_op, "module ", i, " (ResidualBlock): the shortcut ",
                    s.shape, " and the main path ", h.shape, " differ");
    const std::string sum = g_.node("Add", {h.name, s.name});
    return {g_.node("Relu", {sum}), h.shape};
  }

  Value activation(const ActivationParams& a, const Value& x, std::size_t i) {
    cutrain::detail::check_activation(export_op, a);
    const auto& n = x.name;
    const auto alpha = static_cast<float>(a.alpha);
    switch (a.kind) {
      case Activation::identity: return {g_.node("Identity", {n}), x.shape};
      case Activation::relu: return {g_.node("Relu", {n}), x.shape};
      case Activation::leaky_relu: return {g_.node("LeakyRelu", {n}, {attr_float("alpha", alpha)}), x.shape};
      case Activation::elu: return {g_.node("Elu", {n}, {attr_float("alpha", alpha)}), x.shape};
      case Activation::sigmoid: return {g_.node("Sigmoid", {n}), x.shape};
      case Activation::tanh: return {g_.node("Tanh", {n}), x.shape};
      case Activation::silu: return {g_.node("Mul", {n, g_.node("Sigmoid", {n})}), x.shape};
      case Activation::gelu_erf: {
        // opset 17 has no Gelu (it is opset 20's): 0.5 x (1 + erf(x / sqrt 2)).
        const auto e = g_.node("Erf", {g_.node("Div", {n, g_.scalar(std::numbers::sqrt2_v<float>)})});
        return {half_x_times_one_plus(n, e), x.shape};
      }
      case Activation::gelu_tanh: {
        // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), as the CPU backend computes it.
        const auto x3 = g_.node("Mul", {g_.node("Mul", {n, n}), n});
        const auto inner = g_.node("Add", {n, g_.node("Mul", {x3, g_.scalar(0.044715f)})});
        const float k = std::sqrt(2.0f / std::numbers::pi_v<float>);
        const auto t = g_.node("Tanh", {g_.node("Mul", {inner, g_.scalar(k)})});
        return {half_x_times_one_plus(n, t), x.shape};
      }
    }
    throw NotImplemented(std::string(export_op), cutrain::detail::cat("module ", i, ": activation ", a.kind));
  }
  std::string half_x_times_one_plus(const std::string& x, const std::string& e) {
    const auto onep = g_.node("Add", {e, g_.scalar(1.0f)});
    return g_.node("Mul", {g_.node("Mul", {x, onep}), g_.scalar(0.5f)});
  }

  Value pool(const Pool2dParams& pp, const Value& x, std::size_t i) {
    const bool max = pp.mode == PoolMode::max;
    require_rank(x, 4, max ? "MaxPool2d" : "AvgPool2d", i);
    const Shape y = pool2d_output_shape(x.shape, pp, export_op);
    std::vector<OnnxAttr> attrs{attr_ints("kernel_shape", {pp.kernel_h, pp.kernel_w}),
                                attr_ints("strides", {pp.effective_stride_h(), pp.effective_stride_w()}),
                                attr_ints("pads", {pp.pad_top, pp.pad_left, pp.pad_bottom, pp.pad_right}),
                                attr_int("ceil_mode", pp.ceil_mode ? 1 : 0)};
    if (max) {
      attrs.push_back(attr_ints("dilations", {pp.dilation_h, pp.dilation_w}));
      return {g_.node("MaxPool", {x.name}, attrs), y};
    }
    CUTRAIN_REQUIRE(pp.dilation_h == 1 && pp.dilation_w == 1, NotImplemented, export_op, "module ", i,
                    " (AvgPool2d with dilation ", pp.dilation_h, "x", pp.dilation_w,
                    "): AveragePool takes dilations only from opset 19; the export writes opset 17");
    attrs.push_back(attr_int("count_include_pad", pp.count_include_pad ? 1 : 0));
    return {g_.node("AveragePool", {x.name}, attrs), y};
  }

  // x + attn(ln1(x)), then + fc2(gelu_tanh(fc1(ln2(x)))), over tokens x [B, S, C].
  Value transformer_block(const nn::TransformerBlock<T>& blk, const Value& x, const std::string& p, std::size_t i) {
    const std::int64_t b = x.shape[0], s = x.shape[1], c = x.shape[2];
    const Value a = attention(blk.attn, layer_norm(blk.ln1, x, p + ".ln1", i), p + ".attn", i);
    const Value h{g_.node("Add", {x.name, a.name}), x.shape};
    Value f = reshape(layer_norm(blk.ln2, h, p + ".ln2", i), Shape{b * s, c});
    f = linear(blk.fc1, f, p + ".fc1", i);
    f = activation(ActivationParams{.kind = Activation::gelu_tanh}, f, i);
    f = linear(blk.fc2, f, p + ".fc2", i);
    return {g_.node("Add", {h.name, reshape(f, x.shape).name}), x.shape};
  }

  // softmax(q kᵀ · scale + mask) v over [B, H, S, D], q, k, v split from the fused projection;
  // tokens x [B, S, C]. opset 17 has no Attention op (it is opset 23's): written out in its ops.
  Value attention(const nn::MultiheadAttention<T>& mha, const Value& x, const std::string& p, std::size_t i) {
    const std::int64_t b = x.shape[0], s = x.shape[1], c = x.shape[2];
    const std::int64_t h = mha.options().heads, d = c / h;
    const Value qkv = linear(mha.qkv, reshape(x, Shape{b * s, c}), p + ".qkv", i);
    const Value r = reshape(qkv, Shape{b, s, 3, h, d});
    const auto part = [&](std::int64_t k, std::vector<std::int64_t> perm) {
      const auto one = g_.node("Gather", {r.name, g_.int64_initializer(Shape{}, {k})}, {attr_int("axis", 2)});
      return g_.node("Transpose", {one}, {attr_ints("perm", std::move(perm))});
    };
    const auto q = part(0, {0, 2, 1, 3}), kt = part(1, {0, 2, 3, 1}), v = part(2, {0, 2, 1, 3});
    const double scale = cutrain::detail::attention_scale(export_op, AttentionParams{}, d);
    std::string scores = g_.node("Mul", {g_.node("MatMul", {q, kt}), g_.scalar(static_cast<float>(scale))});
    if (mha.options().causal) scores = g_.node("Add", {scores, causal_mask(s)});
    const auto probs = g_.node("Softmax", {scores}, {attr_int("axis", 3)});
    const auto o = g_.node("Transpose", {g_.node("MatMul", {probs, v})}, {attr_ints("perm", {0, 2, 1, 3})});
    const Value y = linear(mha.proj, reshape({o, Shape{b, s, h, d}}, Shape{b * s, c}), p + ".proj", i);
    return reshape(y, x.shape);
  }

  Value reshape(const Value& x, const Shape& to) {
    return {g_.node("Reshape", {x.name, g_.int64_initializer(Shape{to.rank()}, dims_of(to))}), to};
  }

 private:
  // [S, S]: 0 where key j <= query i, -inf above the diagonal; one initializer, shared by the blocks.
  std::string causal_mask(std::int64_t s) {
    if (!mask_.empty()) return mask_;
    std::vector<float> m(static_cast<std::size_t>(s * s), 0.0f);
    for (std::int64_t i = 0; i < s; ++i)
      for (std::int64_t j = i + 1; j < s; ++j)
        m[static_cast<std::size_t>(i * s + j)] = -std::numeric_limits<float>::infinity();
    mask_ = g_.initializer("causal_mask", Shape{s, s}, m);
    return mask_;
  }

  OnnxGraph& g_;
  std::string mask_;
};

}  // namespace detail

// What export_onnx wrote: the op types of the nodes in order, and the initializer count.
struct OnnxExportInfo {
  std::vector<std::string> op_types;
  std::size_t initializers = 0;
  Shape output_shape;
};

// Writes model (evaluated as in eval mode) to path as an ONNX model with a static input of
// example_shape (NCHW for an image model, [N, features] for one that starts with Linear).
// Throws InvalidArgument for an empty model or a shape the modules do not take, and
// NotImplemented naming the module's type and index for a module with no ONNX form.
template <class T>
OnnxExportInfo export_onnx(const nn::Sequential<T>& model, const std::filesystem::path& path,
                           const Shape& example_shape) {
  using detail::export_op;
  detail::check_model_input(export_op, model, example_shape);
  detail::OnnxGraph g;
  g.input("input", example_shape);
  const detail::Value y = detail::Lowering<T>(g).sequential(model, {"input", example_shape});
  // A model of dropouts only passes the input through: the output still needs its own node.
  if (y.name == "input") g.rename(g.node("Identity", {y.name}), "output");
  else g.rename(y.name, "output");
  g.output("output", y.shape);
  files::AtomicFile f(path, std::string(export_op));
  f.write(g.model_bytes("cutrain"));
  f.commit();
  return {g.op_types(), g.initializer_count(), y.shape};
}

}  // namespace cutrain::inline CUTRAIN_ABI::deploy
