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

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cutrain/deploy/onnx.hpp"
#include "cutrain/nn/transformer.hpp"

namespace cutrain::inline CUTRAIN_ABI::deploy {

namespace detail {

// Lowers an nn::GPT into an OnnxGraph; the blocks, norms and Gemms are Lowering<T>'s.
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
    for (std::size_t i = 0; i < m.blocks.size(); ++i) x = base_.transformer_block(m.blocks[i], x, "h." + std::to_string(i), i);
    const Value flat = base_.reshape(base_.layer_norm(m.ln_f, x, "ln_f", m.blocks.size()), Shape{b * s, c});
    return {g_.node("Gemm", {flat.name, wte}, {attr_int("transB", 1)}), Shape{b * s, m.options().vocab}};
  }

 private:
  OnnxGraph& g_;
  Lowering<T> base_;
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
