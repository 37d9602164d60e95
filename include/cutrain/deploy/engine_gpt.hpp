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
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
  // On the GPU the tokens' range is checked by a kernel queued with the forward and read back at
  // the end of the call (one synchronization, after all of the call's work is queued).
  Tensor<E> operator()(const Tensor<std::int32_t>& tokens) const {
    check::defined(op, tokens, "tokens");
    const Shape& in = body_.plan().shapes[0];  // [N, S, C]
    const std::int64_t lo = body_.options().min_batch;
    CUTRAIN_REQUIRE(tokens.rank() == 2 && tokens.dim(1) == in[1] && tokens.dim(0) >= lo && tokens.dim(0) <= in[0],
                    InvalidArgument, op, "tokens ", tokens.describe(), " do not fit the engine: int32 [n, ", in[1],
                    "] with n from ", lo, " to ", in[0]);
    CUTRAIN_REQUIRE(tokens.device() == body_.options().device, DeviceError, op, "tokens ", tokens.describe(),
                    " are not on the engine's device ", body_.options().device);
    const std::int64_t n = tokens.dim(0), s = in[1], c = in[2];
    const Shape logits{n * s, wte().dim(0)};
#ifdef CUTRAIN_WITH_CUDA
    if constexpr (cuda::GpuFloat<E>)
      if (gpu_) return gpu_call(tokens).reshape(logits);
#endif
    const Tensor<std::int32_t> flat = tokens.contiguous(Layout::row_major).reshape(Shape{n * s});
    Tensor<E> x;
    try {
      x = ops::index_select(wte(), 0, flat);
    } catch (const InvalidArgument& e) {  // the lookup's message names index_select: say whose tokens
      throw InvalidArgument(op, cutrain::detail::cat("tokens ", tokens.describe(), " must be ids in [0, ", wte().dim(0),
                                                     "): ", e.what()));
    }
    return body_(x.reshape(Shape{n, s, c})).reshape(logits);
  }

  // The engine of the position add, the blocks, ln_f and the head, over [n, S, C].
  const Engine<E>& body() const { return body_; }
  // The batch sizes captured as CUDA graphs so far (cuda_graph: the token lookup and the body in
  // one graph per batch size), with each graph's node count.
  std::vector<std::pair<std::int64_t, std::size_t>> captured() const {
#ifdef CUTRAIN_WITH_CUDA
    if (gpu_ && gpu_->replays) return gpu_->replays->captured();
#endif
    return {};
  }
  // The embeddings, then the body's report (its steps, what was fused, the memory plan), then the
  // captured graphs.
  std::string report() const {
    std::string r = cutrain::detail::cat("token lookup: wte ", wte().shape(), " (the head's weight)\n") + body_.report();
    for (const auto& [batch, nodes] : captured())
      r += cutrain::detail::cat("cuda graph: batch ", batch, ", ", nodes, " nodes (token lookup and body)\n");
    return r;
  }

 private:
  static constexpr std::string_view op = "deploy::GptEngine";

  template <class F, class T>
  friend GptEngine<F> compile(const nn::GPT<T>& model, const Shape& tokens_shape, const CompileOptions& o);
  template <class F>
  friend GptEngine<F> load_gpt_engine(const std::filesystem::path& path, std::optional<Device> device);
  explicit GptEngine(Engine<E> body) : body_(std::move(body)) {
#ifdef CUTRAIN_WITH_CUDA
    const CompileOptions& o = body_.options();
    if (!cuda::GpuFloat<E> || o.device.is_cpu()) return;
    gpu_ = std::make_shared<Gpu>();
    gpu_->report = Tensor<std::int32_t>(Shape{4}, {.device = o.device});
    if (o.cuda_graph) gpu_->replays = std::make_unique<detail::GraphReplays<std::int32_t, E>>(o.device.index);
#endif
  }

  // The token table [vocab, C]: the head's weight (the plan's last step), in E on the device.
  const Tensor<E>& wte() const { return body_.plan().steps.back().w; }

#ifdef CUTRAIN_WITH_CUDA
  struct Gpu {
    std::mutex m;                // a call's report is read before the next call's is queued
    Tensor<std::int32_t> report;  // cuda::kernels::index_range_count's, read at the end of each call
    std::unique_ptr<detail::GraphReplays<std::int32_t, E>> replays;  // cuda_graph
  };

  // The range count, the lookup with the position add (the body's first step: one kernel; a NaN
  // row for a token out of range) and the rest of the body on tokens [n, S]: all queued, nothing
  // read back (what the CUDA graph captures).
  Tensor<E> gpu_forward(const Tensor<std::int32_t>& tokens) const {
    const std::int64_t n = tokens.dim(0), s = tokens.dim(1), c = wte().dim(1);
    const Tensor<std::int32_t> flat = tokens.contiguous(Layout::row_major).reshape(Shape{n * s});
    Tensor<E> h(Shape{n * s, c}, {.device = tokens.device()});
    {
      profile::OpScope timed("embedding (token lookup, position add, range count)", tokens.device());
      cuda::kernels::index_range_count(flat, wte().dim(0), gpu_->report);
      cuda::kernels::embedding(wte(), flat, body_.plan().steps.front().w, h);
    }
    return body_.forward(h.reshape(Shape{n, s, c}), nullptr, 1);
  }

  Tensor<E> gpu_call(const Tensor<std::int32_t>& tokens) const {
    std::lock_guard lock(gpu_->m);
    // Inside a caller's own graph capture the forward is captured into it and nothing can be read:
    // an out-of-range token's logits are NaN.
    if (cutrain::detail::device_capturing()) return gpu_forward(tokens);
    Tensor<E> y = gpu_->replays ? gpu_->replays->replay(op, tokens, Layout::row_major,
                                                        [this](const Tensor<std::int32_t>& t) { return gpu_forward(t); })
                                : gpu_forward(tokens);
    const auto [bad, value] = cuda::kernels::read_index_report(gpu_->report);
    CUTRAIN_REQUIRE(bad == 0, InvalidArgument, op, "token ", value, " is out of range [0, ", wte().dim(0), ") (", bad,
                    " of the ", tokens.numel(), " tokens of ", tokens.describe(), ")");
    return y;
  }

  std::shared_ptr<Gpu> gpu_;  // shared: GptEngine moves
#endif

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
// position add on [N, S, C], the only reader of the input, its last the head, with no bias,
// writing the output).
template <class E>
GptEngine<E> load_gpt_engine(const std::filesystem::path& path, std::optional<Device> device = std::nullopt) {
  Engine<E> body = load_engine<E>(path, device);
  const Plan<E>& p = body.plan();
  const auto& in = p.shapes[0];
  const bool gpt = p.model == "gpt" && in.rank() == 3 && p.steps.size() >= 2 &&
                   p.steps.front().kind == StepKind::add_constant && p.steps.front().in == 0 &&
                   p.steps.back().kind == StepKind::linear && !p.steps.back().b.defined() &&
                   p.steps.back().act.kind == Activation::identity && p.steps.back().out == p.output &&
                   p.steps.back().w.dim(1) == in[2] && body.memory().life[0].second == 0;
  if (!gpt)
    throw IoError("load_gpt_engine", cutrain::detail::cat(path.string(), ": the engine in it is not a GPT's (model \"",
                                                          p.model, "\", input ", in, ")"));
  return GptEngine<E>(std::move(body));
}

}  // namespace cutrain::inline CUTRAIN_ABI::deploy
