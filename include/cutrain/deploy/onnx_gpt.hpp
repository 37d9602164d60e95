// deploy::export_onnx(gpt, path, tokens_shape): writes a trained nn::GPT as a standard ONNX model
// (IR 8, opset 17, the same writer as the Sequential export) in eval mode: attention dropout off.
//
// The graph takes "tokens" (int32 [B, S], S <= context) and gives "logits" (f32 [B·S, vocab]), as
// nn::GPT's forward does. Embeddings are Gather nodes (positions 0 .. S-1 a constant); each block
// is LayerNormalization, the fused QKV Gemm viewed as [B, S, 3, H, D] and split by Gather, the
// attention as MatMul, Mul by the scale, Add of a causal mask (0 / -inf, when causal), Softmax
// and MatMul, then the output projection, residual Adds and the GELU (tanh form) MLP; the output
// head is a Gemm on the tied token embedding (one initializer, "wte.weight", read twice).
// opset 17 has no Attention op (it is opset 23's), so the attention is written out in opset-17
// ops. The shape is static: one file per [B, S].
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "cutrain/core/params/attention.hpp"
#include "cutrain/deploy/onnx.hpp"
#include "cutrain/nn/transformer.hpp"

namespace cutrain::inline CUTRAIN_ABI::deploy {

namespace detail {

// Lowers an nn::GPT into an OnnxGraph; the norms, Gemms and GELU are Lowering<T>'s.
template <class T>
class GptLowering {
 public:
  explicit GptLowering(OnnxGraph& g) : g_(g), base_(g) {}

  // tokens [B, S] -> logits [B·S, vocab].
  Value gpt(const nn::GPT<T>& m, const Value& tokens) {
    const std::int64_t b = tokens.shape[0], s = tokens.shape[1], c = m.options().dim;
    const auto wte = g_.initializer("wte.weight", m.wte.weight.shape(), floats_of(m.wte.weight.value()));
    const auto wpe = g_.initializer("wpe.weight", m.wpe.weight.shape(), floats_of(m.wpe.weight.value()));
    std::vector<std::int64_t> pos;
    for (std::int64_t i = 0; i < s; ++i) pos.push_back(i);
    const auto tok = g_.node("Gather", {wte, tokens.name}, {attr_int("axis", 0)});
    const auto pe = g_.node("Gather", {wpe, g_.int64_initializer(Shape{s}, pos)}, {attr_int("axis", 0)});
    Value x{g_.node("Add", {tok, pe}), Shape{b, s, c}};
    for (std::size_t i = 0; i < m.blocks.size(); ++i) x = block(m.blocks[i], x, "h." + std::to_string(i), i);
    const Value flat = reshape(base_.layer_norm(m.ln_f, x, "ln_f", m.blocks.size()), Shape{b * s, c});
    return {g_.node("Gemm", {flat.name, wte}, {attr_int("transB", 1)}), Shape{b * s, m.options().vocab}};
  }

 private:
  // x + attn(ln1(x)), then + fc2(gelu_tanh(fc1(ln2(x)))).
  Value block(const nn::TransformerBlock<T>& blk, const Value& x, const std::string& p, std::size_t i) {
    const std::int64_t b = x.shape[0], s = x.shape[1], c = x.shape[2];
    const Value a = attention(blk.attn, base_.layer_norm(blk.ln1, x, p + ".ln1", i), p + ".attn", i);
    const Value h{g_.node("Add", {x.name, a.name}), x.shape};
    Value f = reshape(base_.layer_norm(blk.ln2, h, p + ".ln2", i), Shape{b * s, c});
    f = base_.linear(blk.fc1, f, p + ".fc1", i);
    f = base_.activation(ActivationParams{.kind = Activation::gelu_tanh}, f, i);
    f = base_.linear(blk.fc2, f, p + ".fc2", i);
    return {g_.node("Add", {h.name, reshape(f, x.shape).name}), x.shape};
  }

  // softmax(q kᵀ · scale + mask) v over [B, H, S, D], q, k, v split from the fused projection.
  Value attention(const nn::MultiheadAttention<T>& mha, const Value& x, const std::string& p, std::size_t i) {
    const std::int64_t b = x.shape[0], s = x.shape[1], c = x.shape[2];
    const std::int64_t h = mha.options().heads, d = c / h;
    const Value qkv = base_.linear(mha.qkv, reshape(x, Shape{b * s, c}), p + ".qkv", i);
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
    const Value y = base_.linear(mha.proj, reshape({o, Shape{b, s, h, d}}, Shape{b * s, c}), p + ".proj", i);
    return reshape(y, x.shape);
  }

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

  Value reshape(const Value& x, const Shape& to) {
    return {g_.node("Reshape", {x.name, g_.int64_initializer(Shape{to.rank()}, dims_of(to))}), to};
  }

  OnnxGraph& g_;
  Lowering<T> base_;
  std::string mask_;
};

}  // namespace detail

// Writes model (in eval mode) to path as an ONNX model whose input "tokens" is int32 of the
// static shape tokens_shape = [B, S] (1 <= S <= context) and whose output "logits" is
// f32 [B·S, vocab]. Throws InvalidArgument for any other tokens shape.
template <class T>
OnnxExportInfo export_onnx(const nn::GPT<T>& model, const std::filesystem::path& path, const Shape& tokens_shape) {
  using detail::export_op;
  const std::int64_t context = model.options().context;
  CUTRAIN_REQUIRE(tokens_shape.rank() == 2 && tokens_shape[0] >= 1 && tokens_shape[1] >= 1 &&
                      tokens_shape[1] <= context,
                  InvalidArgument, export_op, "nn::GPT takes tokens [B, S] with B >= 1 and 1 <= S <= context ",
                  context, ", got ", tokens_shape);
  CUTRAIN_REQUIRE(shape_fits(tokens_shape, sizeof(std::int32_t)) &&
                      shape_fits(Shape{tokens_shape[0] * tokens_shape[1], model.options().vocab}, sizeof(float)),
                  InvalidArgument, export_op, "tokens ", tokens_shape, " give logits [B·S, ", model.options().vocab,
                  "] whose byte count overflows int64");
  detail::OnnxGraph g;
  g.input("tokens", tokens_shape, proto::data_type_int32);
  const detail::Value y = detail::GptLowering<T>(g).gpt(model, {"tokens", tokens_shape});
  g.rename(y.name, "logits");
  g.output("logits", y.shape);
  files::AtomicFile f(path, std::string(export_op));
  f.write(g.model_bytes("cutrain_gpt"));
  f.commit();
  return {g.op_types(), g.initializer_count(), y.shape};
}

}  // namespace cutrain::inline CUTRAIN_ABI::deploy
