// deploy::compile(gpt, Shape{N, S}, options): a trained nn::GPT as a forward-only engine over
// int32 tokens [n, S] (n from min_batch to N, S fixed) giving logits [n·S, vocab] in E. The
// tokens are looked up in the token table first (ops::index_select); the position embeddings'
// add, the blocks, the final layer norm and the head tied to the token table are an Engine<E>
// over [n, S, C] (engine.hpp): the linear layers on cuBLASLt (fc1's gelu in its epilogue),
// attention on cuDNN's SDPA in bf16 and f16, each batch size's forward one CUDA graph with
// cuda_graph. The head's weight is the token table the lookup reads (tied, stored once).
// save_engine / load_gpt_engine: an engine file of the body, its plan marked a GPT's.
//
//   nn::GPT<float> gpt({.vocab = 65, .context = 128});   // trained
//   auto engine = deploy::compile<bfloat16>(gpt, Shape{8, 128}, {.device = Device::cuda(0), .cuda_graph = true});
//   Tensor<bfloat16> logits = engine(tokens);           // tokens int32 [n, 128] on the GPU -> [n·128, 65]
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "cutrain/deploy/engine.hpp"
#include "cutrain/deploy/engine_file.hpp"
#include "cutrain/nn/transformer.hpp"
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
    return body_(ops::index_select(wte(), 0, flat).reshape(Shape{n, s, c})).reshape(Shape{n * s, wte().dim(0)});
  }

  // The engine of the position add, the blocks, ln_f and the head, over [n, S, C].
  const Engine<E>& body() const { return body_; }
  // The embeddings, then the body's report (its steps, what was fused, the memory plan).
  std::string report() const {
    return cutrain::detail::cat("token lookup: wte ", wte().shape(), " (the head's weight)\n") + body_.report();
  }

 private:
  template <class F, class T>
  friend GptEngine<F> compile(const nn::GPT<T>& model, const Shape& tokens_shape, const CompileOptions& o);
  template <class F>
  friend GptEngine<F> load_gpt_engine(const std::filesystem::path& path, std::optional<Device> device);
  explicit GptEngine(Engine<E> body) : body_(std::move(body)) {}

  // The token table [vocab, C]: the head's weight (the plan's last step), in E on the device.
  const Tensor<E>& wte() const { return body_.plan().steps.back().w; }

  Engine<E> body_;
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
  return GptEngine<E>(detail::engine_from<E>(std::move(p), o));
}

// Writes engine to path: an engine file (engine_file.hpp) of its body, marked a GPT's.
template <class E>
void save_engine(const GptEngine<E>& engine, const std::filesystem::path& path) {
  save_engine(engine.body(), path);
}

// The GptEngine in path (save_engine's), on device (default: the kind it was saved for). As
// load_engine; also IoError for an engine file that is not a GPT's body (its first step the
// position add on [N, S, C], its last the head, with no bias, writing the output).
template <class E>
GptEngine<E> load_gpt_engine(const std::filesystem::path& path, std::optional<Device> device = std::nullopt) {
  Engine<E> body = load_engine<E>(path, device);
  const Plan<E>& p = body.plan();
  const auto& in = p.shapes[0];
  const bool gpt = p.model == "gpt" && in.rank() == 3 && p.steps.size() >= 2 &&
                   p.steps.front().kind == StepKind::add_constant && p.steps.front().in == 0 &&
                   p.steps.back().kind == StepKind::linear && !p.steps.back().b.defined() &&
                   p.steps.back().act.kind == Activation::identity && p.steps.back().out == p.output &&
                   p.steps.back().w.dim(1) == in[2];
  if (!gpt)
    throw IoError("load_gpt_engine", cutrain::detail::cat(path.string(), ": the engine in it is not a GPT's (model \"",
                                                          p.model, "\", input ", in, ")"));
  return GptEngine<E>(std::move(body));
}

}  // namespace cutrain::inline CUTRAIN_ABI::deploy
