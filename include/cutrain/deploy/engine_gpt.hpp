// deploy::compile(gpt, Shape{N, S}, options): a trained nn::GPT as a forward-only engine over
// int32 tokens [n, S] (n from min_batch to N, S fixed) giving logits [n·S, vocab] in E. The
// token and position embeddings are looked up first (ops::index_select and a broadcast add);
// the blocks, the final layer norm and the head tied to the token embedding are an Engine<E>
// over [n, S, C] (engine.hpp): the linear layers on cuBLASLt (fc1's gelu in its epilogue),
// attention on cuDNN's SDPA in bf16 and f16, each batch size's forward one CUDA graph with
// cuda_graph. The head's weight is the token table the lookup reads (tied, stored once).
//
//   nn::GPT<float> gpt({.vocab = 65, .context = 128});   // trained
//   auto engine = deploy::compile<bfloat16>(gpt, Shape{8, 128}, {.device = Device::cuda(0), .cuda_graph = true});
//   Tensor<bfloat16> logits = engine(tokens);           // tokens int32 [n, 128] on the GPU -> [n·128, 65]
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "cutrain/deploy/engine.hpp"
#include "cutrain/nn/transformer.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/index.hpp"

namespace cutrain::inline CUTRAIN_ABI::deploy {

template <class E>
class GptEngine {
 public:
  // tokens int32 [n, S] (n in the compiled batch range, S the compiled length, values in
  // [0, vocab), on the engine's device) -> logits [n·S, vocab], as nn::GPT's forward in eval mode.
  Tensor<E> operator()(const Tensor<std::int32_t>& tokens) const {
    constexpr std::string_view op = "deploy::GptEngine";
    check::defined(op, tokens, "tokens");
    const Shape& in = body_.plan().shapes[0];  // [N, S, C]
    const std::int64_t lo = body_.options().min_batch;
    CUTRAIN_REQUIRE(tokens.rank() == 2 && tokens.dim(1) == in[1] && tokens.dim(0) >= lo && tokens.dim(0) <= in[0],
                    InvalidArgument, op, "tokens ", tokens.describe(), " do not fit the engine: int32 [n, ", in[1],
                    "] with n from ", lo, " to ", in[0]);
    CUTRAIN_REQUIRE(tokens.device() == body_.options().device, DeviceError, op, "tokens ", tokens.describe(),
                    " are not on the engine's device ", body_.options().device);
    const std::int64_t n = tokens.dim(0), s = in[1], c = in[2];
    const Tensor<std::int32_t> flat = tokens.contiguous(Layout::row_major).reshape(Shape{n * s});
    const Tensor<E> x = ops::add(ops::index_select(wte(), 0, flat).reshape(Shape{n, s, c}), wpe_);
    return body_(x).reshape(Shape{n * s, wte().dim(0)});
  }

  // The engine of the blocks, ln_f and the head, over [n, S, C].
  const Engine<E>& body() const { return body_; }
  // The embeddings, then the body's report (its steps, what was fused, the memory plan).
  std::string report() const {
    return cutrain::detail::cat("embeddings: wte ", wte().shape(), " (tied to the head), wpe ", wpe_.shape(), "\n") +
           body_.report();
  }

 private:
  template <class F, class T>
  friend GptEngine<F> compile(const nn::GPT<T>& model, const Shape& tokens_shape, const CompileOptions& o);
  GptEngine(Engine<E> body, Tensor<E> wpe) : body_(std::move(body)), wpe_(std::move(wpe)) {}

  // The token table [vocab, C]: the head's weight (the plan's last step), in E on the device.
  const Tensor<E>& wte() const { return body_.plan().steps.back().w; }

  Engine<E> body_;
  Tensor<E> wpe_;  // positions 0 .. S-1: [S, C]
};

// Compiles model (eval mode: no attention dropout) for tokens [N, S] (N the largest batch, S at
// most the model's context) on o.device in E. InvalidArgument for a bad shape or options.
template <class E, class T>
GptEngine<E> compile(const nn::GPT<T>& model, const Shape& tokens_shape, const CompileOptions& o = {}) {
  using detail::compile_op;
  const nn::GPTOptions& g = model.options();
  CUTRAIN_REQUIRE(tokens_shape.rank() == 2 && tokens_shape[0] > 0 && tokens_shape[1] >= 1 &&
                      tokens_shape[1] <= g.context,
                  InvalidArgument, compile_op, "tokens_shape must be [N, S] with N > 0 and 1 <= S <= context ",
                  g.context, ", got ", tokens_shape);
  detail::check_options<E>(compile_op, o, tokens_shape[0]);
  Plan<T> p;
  p.shapes.push_back(Shape{tokens_shape[0], tokens_shape[1], g.dim});
  p.output = detail::PlanLowering<T>(p).gpt_body(model, 0);
  const Tensor<T> wpe = detail::host_copy(model.wpe.weight.value()).slice(0, 0, tokens_shape[1]);
  return GptEngine<E>(detail::engine_from<E>(std::move(p), o), cast<E>(wpe).contiguous(Layout::row_major).to(o.device));
}

}  // namespace cutrain::inline CUTRAIN_ABI::deploy
