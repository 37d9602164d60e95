// deploy::compile(model, example_shape, options): a trained nn::Sequential as a forward-only
// inference engine in element type E, on the CPU or the GPU. The model's plan (engine_plan.hpp)
// has batch norms folded into convolutions, residual adds and activations fused into the
// convolutions before them (one cuDNN graph each on the GPU, through ops::Fusion), activations
// into linear layers' cuBLASLt epilogues, transformer blocks as linear and attention steps
// (engine_gpt.hpp compiles a whole nn::GPT), dropout removed; every weight is converted to E and
// laid out for the device once, at compile time. Each activation is released after its last
// reader (the memory plan's lifetimes), so the allocator reuses its memory for later ones. With
// cuda_graph, each batch size's forward is captured as one CUDA graph at its first call and
// replayed after (one launch instead of one per op).
//
//   auto engine = deploy::compile<bfloat16>(model, Shape{256, 1, 28, 28}, {.device = Device::cuda(0)});
//   Tensor<bfloat16> logits = engine(images);   // [N, 10], N <= 256
//   std::puts(engine.report().c_str());         // what was fused, the memory plan
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cutrain/core/cast.hpp"
#include "cutrain/core/fp8.hpp"
#include "cutrain/deploy/engine_onednn.hpp"
#include "cutrain/deploy/engine_plan.hpp"
#include "cutrain/autograd/functions/attention.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/cast.hpp"
#include "cutrain/ops/conv2d.hpp"
#include "cutrain/ops/flatten.hpp"
#include "cutrain/ops/fusion.hpp"
#include "cutrain/ops/layer_norm.hpp"
#include "cutrain/ops/linear.hpp"
#include "cutrain/ops/pool2d.hpp"
#include "cutrain/ops/rms_norm.hpp"
#include "cutrain/ops/softmax.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/deploy/graph_replay.hpp"
#include "cutrain/cuda/api.hpp"
#include "cutrain/cuda/kernels/quantize.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::deploy {

struct CompileOptions {
  Device device = Device::cpu();
  // The layout activations and convolution weights take: NHWC is what cuDNN's fastest bf16/f16
  // engines want; row-major (NCHW) is the CPU's.
  Layout layout = Layout::row_major;
  // Batch sizes the engine takes (TensorRT's optimization profile): from min_batch to the
  // example shape's batch, which the memory plan is made for.
  std::int64_t min_batch = 1;
  // false: the plan as lowered (no folding or fusion), for comparisons.
  bool fuse = true;
  // GPU only: each batch size's forward is captured as one CUDA graph at its first call (after
  // one warm-up run) and replayed at later calls, on a stream of the engine's own, ordered after
  // the caller's stream by events. A call copies x into the graph's input and its output out;
  // every captured batch size keeps its graph's activations (its own memory pool).
  bool cuda_graph = false;
};

// How deploy::quantize_e4m3 (engine_fp8.hpp) calibrates each convolution's input scale on real
// batches: the largest |x| seen, or the given percentile of |x| (a sample of up to 2^20 values per
// batch and convolution).
struct QuantizeOptions {
  Calibrator calibrator = Calibrator::max;
  double percentile = 99.99;  // Calibrator::percentile
  bool per_channel = true;    // w's scale per output channel; false: one per tensor (a scalar descale)
  // Each convolution is timed in both precisions at the first batch's size, and stays in the
  // engine's E where e4m3 is not faster (TensorRT's per-layer choice); false: e4m3 wherever
  // cuDNN has an engine for it.
  bool keep_faster = true;
};

namespace detail {
// Options an engine in E can run with, for inputs of up to max_batch (compile's and
// load_engine's check): E on o.device, min_batch within 1..max_batch, a row-major or NHWC layout,
// CUDA graphs only on a GPU.
template <class E>
void check_options(std::string_view op, const CompileOptions& o, std::int64_t max_batch) {
  const bool fits = o.device.is_cpu() ? (std::same_as<E, double> || std::same_as<E, float>)
                                      : (std::same_as<E, float> || std::same_as<E, bfloat16> || std::same_as<E, half>);
  CUTRAIN_REQUIRE(fits, InvalidArgument, op, "an engine in ", dtype_of<E>, " cannot run on ", o.device,
                  " (the CPU runs f64 and f32, the GPU f32, bf16 and f16)");
  CUTRAIN_REQUIRE(o.min_batch >= 1 && o.min_batch <= max_batch, InvalidArgument, op, "min_batch ", o.min_batch,
                  " must be 1 to the example batch ", max_batch);
  CUTRAIN_REQUIRE(o.layout == Layout::row_major || o.layout == Layout::nhwc, InvalidArgument, op,
                  "layout must be row_major or nhwc, got ", o.layout);
  CUTRAIN_REQUIRE(!o.cuda_graph || o.device.is_cuda(), InvalidArgument, op, "cuda_graph needs a GPU device, got ",
                  o.device);
}
}  // namespace detail

template <class E>
class Engine;
template <class E>
class GptEngine;
namespace detail {
template <class E, class T>
Engine<E> engine_from(Plan<T> p, const CompileOptions& o);
}  // namespace detail

template <class E>
class Engine {
 public:
  // y for x of the example shape's dims but the batch, which is within the compiled range.
  Tensor<E> operator()(const Tensor<E>& x) const {
    check_input("deploy::Engine", x);
#ifdef CUTRAIN_WITH_CUDA
    // Inside a caller's own graph capture the steps are captured into it (no graph in a graph).
    if (replays_ && !plan_.steps.empty() && !cutrain::detail::device_capturing()) return replay(x);
#endif
    return forward(x);
  }

  // x fits the engine's input (its dims but the batch, a batch in the compiled range, the engine's
  // device); else InvalidArgument or DeviceError from op.
  void check_input(std::string_view op, const Tensor<E>& x) const {
    check::defined(op, x, "x");
    const Shape& want = plan_.shapes[0];
    bool ok = x.rank() == want.rank() && x.dim(0) >= opt_.min_batch && x.dim(0) <= want[0];
    for (int d = 1; ok && d < want.rank(); ++d) ok = x.dim(d) == want[d];
    CUTRAIN_REQUIRE(ok, InvalidArgument, op, "x ", x.describe(), " does not fit the engine's input: ", want,
                    " with a batch of ", opt_.min_batch, " to ", want[0]);
    CUTRAIN_REQUIRE(x.device() == opt_.device, DeviceError, op, "x ", x.describe(), " is not on the engine's device ",
                    opt_.device);
  }

  const Plan<E>& plan() const { return plan_; }
  const MemoryPlan& memory() const { return memory_; }
  const CompileOptions& options() const { return opt_; }
  // How the engine was calibrated for 8-bit convolutions (deploy::quantize_e4m3); none: it was not.
  const std::optional<QuantizeOptions>& quantized() const { return quantized_; }
  // The oneDNN tactic step i's f32 CPU convolution runs ("winograd blocked", ...: what compile's
  // tuning chose, deploy/engine_onednn.hpp); "" for other steps and builds without cutrain::onednn.
  std::string cpu_tactic(std::size_t i) const { return onednn_.tactic(i); }

  // The batch sizes captured as CUDA graphs so far (cuda_graph), with each graph's node count.
  std::vector<std::pair<std::int64_t, std::size_t>> captured() const {
    std::vector<std::pair<std::int64_t, std::size_t>> r;
#ifdef CUTRAIN_WITH_CUDA
    if (replays_) r = replays_->captured();
#endif
    return r;
  }

  // One line per step (its kind, output shape, module and what was fused into it), the removed
  // modules, the memory plan's arena against the sum of all activations, and the captured graphs.
  std::string report() const {
    std::string r;
    for (std::size_t i = 0; i < plan_.steps.size(); ++i) {
      const auto& s = plan_.steps[i];
      r += cutrain::detail::cat(i, ": ", to_string(s.kind), " ", plan_.shapes[static_cast<std::size_t>(s.out)], " (",
                                to_string(s.kind), " ", s.module);
      for (const auto& m : s.merged) r += " + " + m;
      r += ")";
      if (quantized_ && s.kind == StepKind::conv) {
        const auto ms = [](float t) { return t < 0 ? std::string("not timed") : cutrain::detail::cat(t, " ms"); };
        r += s.x_scale > 0 ? cutrain::detail::cat(" [e4m3, x scale ", s.x_scale, ": ", ms(s.e4m3_ms), "; ", dtype_of<E>, " ",
                                                  ms(s.base_ms), "]")
             : s.e4m3_ms < 0 ? cutrain::detail::cat(" [", dtype_of<E>, ": no e4m3 engine]")
                             : cutrain::detail::cat(" [", dtype_of<E>, ": ", ms(s.base_ms), "; e4m3 ", ms(s.e4m3_ms), "]");
      }
      r += "\n";
      if (const std::string t = onednn_.describe(i); !t.empty()) r += "   oneDNN: " + t + "\n";
    }
    if (quantized_) {
      int convs = 0, eight = 0;
      for (const auto& s : plan_.steps) convs += s.kind == StepKind::conv, eight += s.x_scale > 0;
      r += cutrain::detail::cat("8-bit: ", eight, " of ", convs, " convolutions in e4m3 (", quantized_->calibrator,
                                quantized_->calibrator == Calibrator::percentile ? cutrain::detail::cat(" ", quantized_->percentile) : "",
                                " calibration, w scales per ", quantized_->per_channel ? "channel" : "tensor",
                                quantized_->keep_faster ? ", where faster" : "", "); the other steps in ", dtype_of<E>, "\n");
    }
    for (const auto& m : plan_.removed) r += "removed: " + m + "\n";
    r += cutrain::detail::cat("activations at batch ", plan_.shapes[0][0], ": ", memory_.arena, " bytes planned, ",
                              memory_.total, " bytes in all (", memory_.total ? 1.0 * memory_.arena / memory_.total : 0.0,
                              "x)\n");
    for (const auto& [batch, nodes] : captured())
      r += cutrain::detail::cat("cuda graph: batch ", batch, ", ", nodes, " nodes\n");
    return r;
  }

 private:
  template <class F, class T>
  friend Engine<F> detail::engine_from(Plan<T> p, const CompileOptions& o);
  template <class F>
  friend Engine<F> load_engine(const std::filesystem::path& path, std::optional<Device> device);  // engine_file.hpp
  template <class F>
  friend struct Quantizer;  // engine_fp8.hpp
  template <class F>
  friend class GptEngine;  // engine_gpt.hpp: its forward after the token lookup

  // The engine of a plan whose weights are in E on o.device, laid out for it (compile makes
  // them): the residual convolutions' fusion graphs, the memory plan, the
  // captured graphs' state.
  Engine(Plan<E> plan, const CompileOptions& o) : plan_(std::move(plan)), opt_(o) {
    fused_.resize(plan_.steps.size());
    onednn_.build(plan_, o.device, o.layout);  // the f32 CPU steps oneDNN runs (cutrain::onednn)
    for (std::size_t i = 0; i < plan_.steps.size(); ++i) {
      const auto& s = plan_.steps[i];
      // On the CPU a fusion graph runs as its separate ops anyway: run() calls them directly.
      if (s.kind != StepKind::conv || s.in2 < 0 || o.device.is_cpu()) continue;
      fusion::Graph g;
      auto x = g.input("x"), w = g.input("w"), b = g.input("bias"), r = g.input("residual");  // in call order
      auto y = g.add(g.add(g.conv2d(x, w, s.conv), b), r);
      if (s.act.kind != Activation::identity) y = g.activation(y, s.act);
      g.output(y, "y");
      // cuDNN may have no engine for the pattern at some shape or dtype: then cutrain's separate ops.
      fused_[i] = std::make_shared<const ops::Fusion>(std::move(g), ops::FusionOptions{.unfused_fallback = true});
    }
    std::vector<std::int64_t> bytes(plan_.shapes.size(), 0);
    const auto life = lifetimes(plan_);
    for (std::size_t v = 0; v < bytes.size(); ++v)
      if (life[v].first >= 0 || v == 0) {
        CUTRAIN_REQUIRE(shape_fits(plan_.shapes[v], sizeof(E)), InvalidArgument, "deploy::Engine", "value ", v, " ",
                        plan_.shapes[v], " is too large: its byte count overflows int64");
        bytes[v] = plan_.shapes[v].numel() * static_cast<std::int64_t>(sizeof(E));
      }
    memory_ = plan_memory(std::move(bytes), life);
#ifdef CUTRAIN_WITH_CUDA
    if (o.cuda_graph) replays_ = std::make_shared<detail::GraphReplays<E, E>>(o.device.index);
#endif
  }

  // The plan's steps on x, each activation released after its last reader; observe (if given)
  // sees each step's index and the values before it runs (the 8-bit calibration). first > 0: the
  // steps from `first` on, x the output of step first - 1 (which the caller computed; the input
  // must have no reader after it).
  template <class Observe = std::nullptr_t>
  Tensor<E> forward(const Tensor<E>& x, const Observe& observe = nullptr, std::size_t first = 0) const {
    // A model with no step (only dropout, which inference removes) is the identity: a copy of x.
    if (plan_.steps.empty() && first == 0) return x.clone();
    CUTRAIN_REQUIRE(first < plan_.steps.size(), InvalidArgument, "deploy::Engine", "no step ", first, " in a plan of ",
                    plan_.steps.size());
    std::vector<Tensor<E>> v(plan_.shapes.size());
    const auto in = static_cast<std::size_t>(first == 0 ? 0 : plan_.steps[first - 1].out);
    v[in] = x.rank() == 4 ? x.contiguous(opt_.layout) : x.rank() == 3 ? x.contiguous(Layout::row_major) : x.view();
    for (std::size_t i = first; i < plan_.steps.size(); ++i) {
      const auto& s = plan_.steps[i];
      if constexpr (!std::is_same_v<Observe, std::nullptr_t>) observe(i, std::as_const(v));
      v[static_cast<std::size_t>(s.out)] = run(i, v);
      for (const int u : {s.in, s.in2})  // released after its last reader
        if (u >= 0 && u != plan_.output && memory_.life[static_cast<std::size_t>(u)].second == static_cast<int>(i))
          v[static_cast<std::size_t>(u)] = {};
    }
    return std::move(v[static_cast<std::size_t>(plan_.output)]);
  }

#ifdef CUTRAIN_WITH_CUDA
  Tensor<E> replay(const Tensor<E>& x) const {
    return replays_->replay("deploy::Engine", x, x.rank() == 4 ? opt_.layout : Layout::row_major,
                            [this](const Tensor<E>& sx) { return forward(sx); });
  }
  // cuda_graph: the captured batch sizes (shared: Engine moves)
  std::shared_ptr<detail::GraphReplays<E, E>> replays_;
#endif

#ifdef CUTRAIN_WITH_CUDA
  // Convolution step i in e4m3 (x quantized with its scale, then one cuDNN graph); nullopt when
  // cuDNN builds no e4m3 graph for it at this batch. run() and quantize_e4m3's trial call it.
  std::optional<Tensor<E>> run_e4m3(std::size_t i, const std::vector<Tensor<E>>& v) const
    requires(std::same_as<E, bfloat16> || std::same_as<E, half>)
  {
    const auto& s = plan_.steps[i];
    const Tensor<E>& x = v[static_cast<std::size_t>(s.in)];
    Tensor<std::uint8_t> xq(x.shape(), {.layout = Layout::nhwc, .device = x.device()});
    {
      profile::OpScope timed("cast_e4m3 (quantize)", x.device());
      cuda::kernels::quantize_e4m3(x, s.x_scale, xq);
    }
    Tensor<E> y(conv2d_output_shape(x.shape(), s.w.shape(), s.conv, "deploy::Engine"),
                {.layout = Layout::nhwc, .device = x.device()});
    const Tensor<E> none;
    profile::OpScope timed("conv2d_fp8_forward", x.device());
    if (!cuda::cudnn::conv2d_fp8_forward(xq, s.wq, s.descale, s.b, s.in2 >= 0 ? v[static_cast<std::size_t>(s.in2)] : none,
                                         s.conv, s.act, y))
      return std::nullopt;
    return y;
  }
#endif

  Tensor<E> run(std::size_t i, const std::vector<Tensor<E>>& v) const {
    const auto& s = plan_.steps[i];
    const Tensor<E>& x = v[static_cast<std::size_t>(s.in)];
    if (std::optional<Tensor<E>> y = onednn_.run(plan_, i, v, opt_.layout)) return std::move(*y);
    switch (s.kind) {
      case StepKind::conv:
#ifdef CUTRAIN_WITH_CUDA
        if constexpr (std::same_as<E, bfloat16> || std::same_as<E, half>)
          if (s.x_scale > 0)  // where cuDNN has no e4m3 engine at this batch, the step in E below
            if (std::optional<Tensor<E>> y = run_e4m3(i, v)) return std::move(*y);
#endif
        if (s.in2 >= 0 && fused_[i]) return std::move((*fused_[i])(x, s.w, s.b, v[static_cast<std::size_t>(s.in2)])[0]);
        if (s.in2 >= 0 && x.device().is_cpu())  // act(conv + bias + residual) in the conv's epilogue
          if constexpr (CpuFloat<E>) {
            profile::OpScope timed("conv2d_fused_forward", x.device());
            return cpu::conv2d_fused_forward(x, s.w, s.b.reshape({s.w.dim(0)}), v[static_cast<std::size_t>(s.in2)], s.act,
                                             s.conv);
          }
        if (s.in2 >= 0) {  // no fused graph: act(conv + bias + residual) in three passes
          Tensor<E> y = ops::binary(BinaryOp::add, ops::conv2d_forward(x, s.w, s.b.reshape({s.w.dim(0)}), s.conv),
                                    v[static_cast<std::size_t>(s.in2)]);
          return s.act.kind == Activation::identity ? std::move(y) : ops::activation_forward(y, s.act);
        }
        if (s.act.kind == Activation::identity || !s.b.defined()) {
          Tensor<E> y = ops::conv2d_forward(x, s.w, s.b, s.conv);
          return s.act.kind == Activation::identity ? std::move(y) : ops::activation_forward(y, s.act);
        }
        return ops::conv2d_bias_activation_forward(x, s.w, s.b, s.act, s.conv);
      case StepKind::linear: {  // tokens [B, S, C] as rows [B S, C]
        const Tensor<E> rows = detail::as_rows(x);
        if (s.in2 >= 0)  // + residual, as the matmul's C operand on the GPU
          return detail::from_rows(
              ops::linear_residual_forward(rows, s.w, s.b, detail::as_rows(v[static_cast<std::size_t>(s.in2)])),
              x.shape());
        return detail::from_rows(s.act.kind == Activation::identity ? ops::linear_forward(rows, s.w, s.b)
                                                                    : ops::linear_activation_forward(rows, s.w, s.b, s.act),
                                 x.shape());
      }
      case StepKind::scale_shift:
        return ops::binary(BinaryOp::add, ops::binary(BinaryOp::mul, x, s.w), s.b);
      case StepKind::activation: return ops::activation_forward(x, s.act);
      case StepKind::pool:
        return ops::pool2d_forward(x, s.pool);
      case StepKind::global_avg_pool: return ops::global_avg_pool_forward(x);
      case StepKind::flatten: return ops::flatten(x);
      case StepKind::add: return ops::binary(BinaryOp::add, x, v[static_cast<std::size_t>(s.in2)]);
      case StepKind::layer_norm:  // parameters in E on the CPU, in f32 on the GPU (wf, bf)
        if constexpr (CpuFloat<E>)
          if (x.device().is_cpu()) return ops::layer_norm_forward(x, s.w, s.b, s.eps).y;
        return ops::layer_norm_forward(x, s.wf, s.bf, s.eps).y;
      case StepKind::rms_norm:
        if constexpr (CpuFloat<E>)
          if (x.device().is_cpu()) return ops::rms_norm_forward(x, s.w, s.eps).y;
        return ops::rms_norm_forward(x, s.wf, s.eps).y;
      case StepKind::softmax: return ops::softmax_forward(x, s.axis);
      case StepKind::attention: return attention(s, x);
      case StepKind::add_constant: return ops::add(x, s.w);  // w broadcast over the batch
    }
    throw Error("deploy::Engine", "unknown step");
  }

  // qkv [B, S, 3C] (row-major) -> [B, S, C]: q, k and v are views of it, as in
  // nn::MultiheadAttention; o comes back [B, H, S, D] (on the GPU [B, S, H, D] in memory).
  static Tensor<E> attention(const Step<E>& s, const Tensor<E>& x) {
    const std::int64_t b = x.dim(0), n = x.dim(1), c = x.dim(2) / 3;
    const Tensor<E> qkv = x.contiguous(Layout::row_major).reshape(Shape{b, n, 3, s.heads, c / s.heads});
    const Tensor<E> o = ops::scaled_dot_product_attention_inference(autograd::detail::qkv_part(qkv, 0),
                                                                    autograd::detail::qkv_part(qkv, 1),
                                                                    autograd::detail::qkv_part(qkv, 2), {.causal = s.causal});
    return permute(o, {0, 2, 1, 3}).contiguous(Layout::row_major).reshape(Shape{b, n, c});
  }

  Plan<E> plan_;
  MemoryPlan memory_;
  CompileOptions opt_;
  std::vector<std::shared_ptr<const ops::Fusion>> fused_;  // per step: the conv + bias + residual (+ act) graph
  detail::OnednnSteps<E> onednn_;  // the f32 CPU steps oneDNN runs (deploy/engine_onednn.hpp)
  std::optional<QuantizeOptions> quantized_;
};

namespace detail {
// The lowered plan p rewritten (o.fuse) and its weights put in E on o.device, laid out for it;
// then the engine, its CPU convolutions' oneDNN tactics tuned.
template <class E, class T>
Engine<E> engine_from(Plan<T> p, const CompileOptions& o) {
  if (o.fuse) {
    fold_batch_norms(p);
    fuse_residual_adds(p);
    fuse_activations(p);
  }
  Plan<E> plan{.steps = {}, .shapes = p.shapes, .output = p.output, .removed = p.removed, .model = p.model};
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    auto& s = p.steps[i];
    const auto put = [&](const Tensor<T>& t, Layout l) {
      return t.defined() ? cast<E>(t).contiguous(l).to(o.device) : Tensor<E>{};
    };
    Step<E> d{.kind = s.kind, .in = s.in, .in2 = s.in2, .out = s.out, .conv = s.conv, .pool = s.pool, .act = s.act,
              .eps = s.eps, .axis = s.axis, .heads = s.heads, .causal = s.causal, .module = s.module, .merged = s.merged};
    d.w = put(s.w, s.kind == StepKind::conv ? o.layout : Layout::row_major);
    d.b = put(s.b, Layout::row_major);
    if ((s.kind == StepKind::layer_norm || s.kind == StepKind::rms_norm) && !o.device.is_cpu()) {
      d.wf = cast<float>(s.w).to(o.device);  // from the model's T: no rounding through E
      if (s.b.defined()) d.bf = cast<float>(s.b).to(o.device);
    }
    if (s.kind == StepKind::scale_shift) {  // [C] as [1, C, 1, 1] or [1, C], to broadcast over x
      const Shape bc = plan.shapes[static_cast<std::size_t>(s.in)].rank() == 4 ? Shape{1, d.w.dim(0), 1, 1}
                                                                              : Shape{1, d.w.dim(0)};
      d.w = d.w.reshape(bc);
      d.b = d.b.reshape(bc);
    }
    if (s.kind == StepKind::conv && s.in2 >= 0) {  // the fusion graph's bias: [1, K, 1, 1], zeros without one
      if (!d.b.defined()) d.b = Tensor<E>::zeros(Shape{d.w.dim(0)}, {.device = o.device});
      d.b = d.b.reshape({1, d.w.dim(0), 1, 1});
    }
    plan.steps.push_back(std::move(d));
  }
  Engine<E> engine(std::move(plan), o);
  engine.onednn_.tune(engine.plan_, o.layout);  // each CPU convolution's oneDNN tactic, timed here
  return engine;
}
}  // namespace detail

// Compiles model (read in eval mode: running statistics, no dropout) for inputs of
// example_shape ([N, C, H, W], tokens [N, S, C] or [N, features]; N is the largest batch) on
// o.device in E. InvalidArgument for an empty model, a bad shape or options; NotImplemented
// naming the module for one the engine does not compile.
template <class E, class T>
Engine<E> compile(const nn::Sequential<T>& model, const Shape& example_shape, const CompileOptions& o = {}) {
  using detail::compile_op;
  detail::check_model_input(compile_op, model, example_shape);
  detail::check_options<E>(compile_op, o, example_shape[0]);
  return detail::engine_from<E>(lower(model, example_shape), o);
}

}  // namespace cutrain::inline CUTRAIN_ABI::deploy
