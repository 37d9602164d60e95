// The inference engine's plan (deploy/engine.hpp): a trained nn::Sequential lowered to a list
// of forward-only steps over numbered values, then rewritten as TensorRT does: batch norm folded
// into the convolution before it, a residual add and an activation fused into the convolution
// before them (one cuDNN graph on the GPU), an activation into the linear layer before it (a
// cuBLASLt epilogue), dropout removed. plan_memory gives a static memory plan from the values'
// lifetimes. Weights here are host copies in the model's T.
#pragma once

#include "cutrain/core/abi.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cutrain/core/params/activation.hpp"
#include "cutrain/core/params/conv2d.hpp"
#include "cutrain/core/params/pool2d.hpp"
#include "cutrain/deploy/common.hpp"
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

// conv: act(conv(in, w) + b (+ in2)); linear: act(in w^T + b); scale_shift: in * w + b per
// channel (a batch norm that had no convolution to fold into); add: in + in2; layer_norm and
// rms_norm over in's trailing dims w.shape() (w: gamma, b: beta), eps; softmax along axis;
// attention: self-attention of a fused projection's output in [B, S, 3C] (q, k, v of `heads`
// heads, causal or not) to [B, S, C]; add_constant: in + w, w of in's shape without the batch
// (a GPT's position embeddings). A linear step takes any rank >= 2 (features last).
enum class StepKind : std::uint8_t {
  conv, linear, scale_shift, activation, pool, global_avg_pool, flatten, add, layer_norm, rms_norm, softmax, attention,
  add_constant
};
inline constexpr StepKind last_step_kind = StepKind::add_constant;

inline const char* to_string(StepKind k) {
  constexpr const char* names[] = {"conv",    "linear", "scale_shift", "activation", "pool",   "global_avg_pool",
                                   "flatten", "add",    "layer_norm",  "rms_norm",   "softmax", "attention",
                                   "add_constant"};
  return names[static_cast<int>(k)];
}

template <class T>
struct Step {
  StepKind kind = StepKind::conv;
  int in = -1, in2 = -1, out = -1;  // values
  Conv2dParams conv{};
  Pool2dParams pool{};
  ActivationParams act{.kind = Activation::identity};
  Tensor<T> w{}, b{};                 // host, contiguous: weights and bias (scale_shift: scale and shift [C])
  double eps = 0;                     // layer_norm, rms_norm
  int axis = -1;                      // softmax
  std::int64_t heads = 0;             // attention
  bool causal = false;                // attention
  Tensor<float> wf{}, bf{};           // layer_norm, rms_norm on the GPU: w and b in f32 (cuDNN's norms take f32 parameters)
  std::string module{};               // the module it came from: "3", "3.conv1"
  std::vector<std::string> merged{};  // what was fused into it: "batch_norm 3.bn1 (folded)", "add", "relu"
  std::vector<double> scale{}, shift{};  // scale_shift: w and b in double, for folding
  // 8-bit (deploy::quantize_e4m3, engine_fp8.hpp), a conv on the GPU: x's e4m3 scale (0: the step
  // runs in T); w's scale per output channel; w / w_scale[k] in e4m3 (device, the engine's
  // layout); descale = x_scale * w_scale[k] as [1, K, 1, 1] f32 (device).
  float x_scale = 0;
  std::vector<float> w_scale{};
  Tensor<std::uint8_t> wq{};
  Tensor<float> descale{};
  // quantize_e4m3's timing of the step at the first calibration batch, in ms: in e4m3 (quantize
  // and convolution) and in T; -1: not timed.
  float e4m3_ms = -1, base_ms = -1;
};

template <class T>
struct Plan {
  std::vector<Step<T>> steps;
  std::vector<Shape> shapes;  // per value; value 0 is the input
  int output = 0;
  std::vector<std::string> removed;  // modules with no step (dropout)
  std::string model{};               // "gpt": the body of a GptEngine (engine_gpt.hpp); "": a Sequential's
};

namespace detail {

inline constexpr std::string_view compile_op = "deploy::compile";

template <class T>
Tensor<T> host_copy(const Tensor<T>& t) {
  return t.to(Device::cpu()).contiguous(Layout::row_major);
}

// t [..., k] as the rows [numel / k, k] a linear layer takes (a view where t is row-major), and
// a linear layer's rows y of input x back to x's leading dims.
template <class T>
Tensor<T> as_rows(const Tensor<T>& t) {
  if (t.rank() == 2) return t.view();
  const std::int64_t k = t.dim(t.rank() - 1);
  return t.contiguous(Layout::row_major).reshape(Shape{t.numel() / k, k});
}
template <class T>
Tensor<T> from_rows(Tensor<T> y, const Shape& x) {
  if (x.rank() == 2) return y;
  std::vector<std::int64_t> d = x.dims();
  d.back() = y.dim(1);
  return y.reshape(Shape(d));
}

// Lowers one Sequential<T> into steps, tracking shapes as it goes (the ONNX export's walk).
template <class T>
class PlanLowering {
 public:
  explicit PlanLowering(Plan<T>& p) : p_(p) {}

  int sequential(const nn::Sequential<T>& m, int x) {
    for (std::size_t i = 0; i < m.size(); ++i) x = module(m, i, x);
    return x;
  }

  // nn::GPT after its token lookup: x [B, S, C] -> + the position embeddings of 0 .. S-1, the
  // blocks, ln_f, the head tied to wte (no bias) -> logits [B, S, vocab]. Modules named as GPT's
  // parameters are ("wpe", "h.0", "ln_f").
  int gpt_body(const nn::GPT<T>& g, int x) {
    p_.model = "gpt";
    x = push({.kind = StepKind::add_constant, .in = x,
              .w = host_copy(g.wpe.weight.value()).slice(0, 0, shape(x)[1]).contiguous(Layout::row_major), .module = "wpe"},
             shape(x));
    for (std::size_t i = 0; i < g.blocks.size(); ++i) x = transformer(g.blocks[i], x, "h." + std::to_string(i));
    x = norm(StepKind::layer_norm, g.ln_f.weight.value(), &g.ln_f.bias.value(), g.ln_f.options().eps, x, "ln_f",
             "LayerNorm");
    std::vector<std::int64_t> out = shape(x).dims();
    out.back() = g.options().vocab;
    return push({.kind = StepKind::linear, .in = x, .w = host_copy(g.wte.weight.value()), .module = "head (wte)"},
                Shape(out));
  }

 private:
  const Shape& shape(int v) const { return p_.shapes[static_cast<std::size_t>(v)]; }
  int push(Step<T> s, Shape out) {
    p_.shapes.push_back(std::move(out));
    s.out = static_cast<int>(p_.shapes.size()) - 1;
    p_.steps.push_back(std::move(s));
    return p_.steps.back().out;
  }
  void require_rank(int x, int rank, std::string_view what, const std::string& name) const {
    CUTRAIN_REQUIRE(shape(x).rank() == rank, InvalidArgument, compile_op, "module ", name, " (", what, ") needs a ",
                    rank, "-d input, got ", shape(x));
  }

  int module(const nn::Sequential<T>& m, std::size_t i, int x) {
    const std::string n = std::to_string(i);
    if (const auto* c = m.template get_if<nn::Conv2d<T>>(i)) return conv(*c, x, n);
    if (const auto* b = m.template get_if<nn::BatchNorm2d<T>>(i)) return batch_norm(*b, x, n);
    if (const auto* l = m.template get_if<nn::Linear<T>>(i)) return linear(*l, x, n);
    if (const auto* r = m.template get_if<nn::ResidualBlock<T>>(i)) return residual(*r, x, n);
    if (const auto* a = m.template get_if<nn::MultiheadAttention<T>>(i)) return attention(*a, x, n);
    if (const auto* b = m.template get_if<nn::TransformerBlock<T>>(i)) return transformer(*b, x, n);
    if (m.template get_if<nn::ReLU>(i)) return activation({.kind = Activation::relu}, x, n);
    if (const auto* a = m.template get_if<nn::Activation>(i)) return activation(a->params, x, n);
    if (const auto* mp = m.template get_if<nn::MaxPool2d>(i)) return pool(mp->params_for(shape(x)), x, n);
    if (const auto* ap = m.template get_if<nn::AvgPool2d>(i)) return pool(ap->params_for(shape(x)), x, n);
    if (m.template get_if<nn::AdaptiveAvgPool2d>(i)) {
      require_rank(x, 4, "AdaptiveAvgPool2d", n);
      return push({.kind = StepKind::global_avg_pool, .in = x, .module = n}, Shape{shape(x)[0], shape(x)[1], 1, 1});
    }
    if (m.template get_if<nn::Flatten>(i)) {
      CUTRAIN_REQUIRE(shape(x).rank() >= 1, InvalidArgument, compile_op, "module ", n, " (Flatten) gets a 0-d input");
      return push({.kind = StepKind::flatten, .in = x, .module = n}, Shape{shape(x)[0], shape(x).numel() / shape(x)[0]});
    }
    if (const auto* ln = m.template get_if<nn::LayerNorm<T>>(i))
      return norm(StepKind::layer_norm, ln->weight.value(), &ln->bias.value(), ln->options().eps, x, n, "LayerNorm");
    if (const auto* rn = m.template get_if<nn::RMSNorm<T>>(i))
      return norm(StepKind::rms_norm, rn->weight.value(), nullptr, rn->options().eps, x, n, "RMSNorm");
    if (const auto* sm = m.template get_if<nn::Softmax>(i)) {
      const int r = shape(x).rank();
      CUTRAIN_REQUIRE(sm->axis >= -r && sm->axis < r, InvalidArgument, compile_op, "module ", n, " (Softmax) axis ",
                      sm->axis, " is outside a ", r, "-d input ", shape(x));
      return push({.kind = StepKind::softmax, .in = x, .axis = sm->axis < 0 ? sm->axis + r : sm->axis, .module = n}, shape(x));
    }
    if (m.template get_if<nn::Dropout>(i)) {  // identity at inference
      p_.removed.push_back("dropout " + n);
      return x;
    }
    throw NotImplemented(std::string(compile_op), cutrain::detail::cat("module ", i, " is a ", type_name(m.module_type(i)),
                                                                       ", which the engine does not compile (see docs/deploy.md)"));
  }

  int conv(const nn::Conv2d<T>& c, int x, const std::string& n) {
    require_rank(x, 4, "Conv2d", n);
    Shape y;
    try {
      y = conv2d_output_shape(shape(x), c.weight.shape(), c.params_for(shape(x)), "Conv2d");
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string(compile_op), cutrain::detail::cat("module ", n, ": ", e.what()));
    }
    Step<T> s{.kind = StepKind::conv, .in = x, .conv = c.params_for(shape(x)), .w = host_copy(c.weight.value()), .module = n};
    if (c.bias.defined()) s.b = host_copy(c.bias.value());
    return push(std::move(s), y);
  }

  // Eval-mode batch norm as a per-channel scale and shift: gamma / sqrt(var + eps), beta - mean * scale.
  int batch_norm(const nn::BatchNorm2d<T>& bn, int x, const std::string& n) {
    const std::int64_t c = bn.options().features;
    const Shape& xs = shape(x);
    CUTRAIN_REQUIRE((xs.rank() == 4 || xs.rank() == 2) && xs[1] == c, InvalidArgument, compile_op, "module ", n,
                    " (BatchNorm2d of ", c, " features) needs [N, ", c, ", H, W] or [N, ", c, "], got ", xs);
    const auto g = host_copy(bn.weight.value()), beta = host_copy(bn.bias.value());
    const auto mean = host_copy(bn.running_mean), var = host_copy(bn.running_var);
    Step<T> st{.kind = StepKind::scale_shift, .in = x, .w = Tensor<T>(Shape{c}), .b = Tensor<T>(Shape{c}), .module = n};
    for (std::int64_t k = 0; k < c; ++k) {
      const double s = static_cast<double>(g.flat(k)) / std::sqrt(static_cast<double>(var.flat(k)) + bn.options().eps);
      st.scale.push_back(s);
      st.shift.push_back(static_cast<double>(beta.flat(k)) - static_cast<double>(mean.flat(k)) * s);
      st.w.flat(k) = static_cast<T>(s);
      st.b.flat(k) = static_cast<T>(st.shift.back());
    }
    return push(std::move(st), xs);
  }

  // [..., in] -> [..., out]: a [N, in] input, or tokens [B, S, in] inside a transformer module.
  int linear(const nn::Linear<T>& l, int x, const std::string& n) {
    const std::int64_t in_f = l.options().in, out_f = l.options().out;
    const Shape& xs = shape(x);
    CUTRAIN_REQUIRE(xs.rank() >= 2 && xs[xs.rank() - 1] == in_f, InvalidArgument, compile_op, "module ", n, " (Linear ",
                    in_f, " -> ", out_f, ") needs a [N, ", in_f, "] input, got ", xs);
    Step<T> s{.kind = StepKind::linear, .in = x, .w = host_copy(l.weight.value()), .module = n};
    if (l.bias.defined()) s.b = host_copy(l.bias.value());
    std::vector<std::int64_t> out = xs.dims();
    out.back() = out_f;
    return push(std::move(s), Shape(out));
  }

  // x [B, S, C] -> proj(attention(qkv(x))): two linear steps around one attention step. The
  // attention's dropout is removed (inference).
  int attention(const nn::MultiheadAttention<T>& a, int x, const std::string& n) {
    const auto& o = a.options();
    CUTRAIN_REQUIRE(shape(x).rank() == 3 && shape(x)[2] == o.dim, InvalidArgument, compile_op, "module ", n,
                    " (MultiheadAttention of dim ", o.dim, ") needs tokens [B, S, ", o.dim, "], got ", shape(x));
    if (o.dropout > 0) p_.removed.push_back("attention dropout " + n);
    const int qkv = linear(a.qkv, x, n + ".qkv");
    const int att = push({.kind = StepKind::attention, .in = qkv, .heads = o.heads, .causal = o.causal, .module = n},
                         shape(x));
    return linear(a.proj, att, n + ".proj");
  }

  // Pre-norm: h = x + attn(ln1(x)); h + fc2(gelu_tanh(fc1(ln2(h)))) (the gelu fused into fc1's epilogue).
  int transformer(const nn::TransformerBlock<T>& b, int x, const std::string& n) {
    require_rank(x, 3, "TransformerBlock", n);
    const std::int64_t dim = b.attn.options().dim;
    CUTRAIN_REQUIRE(shape(x)[2] == dim, InvalidArgument, compile_op, "module ", n, " (TransformerBlock of dim ", dim,
                    ") needs tokens [B, S, ", dim, "], got ", shape(x));
    const auto norm_of = [&](const nn::LayerNorm<T>& ln, int v, const std::string& name) {
      return norm(StepKind::layer_norm, ln.weight.value(), &ln.bias.value(), ln.options().eps, v, name, "LayerNorm");
    };
    const int a = attention(b.attn, norm_of(b.ln1, x, n + ".ln1"), n + ".attn");
    const int h = push({.kind = StepKind::add, .in = a, .in2 = x, .module = n + ".add1"}, shape(x));
    const int f = activation({.kind = Activation::gelu_tanh}, linear(b.fc1, norm_of(b.ln2, h, n + ".ln2"), n + ".fc1"),
                             n + ".gelu");
    return push({.kind = StepKind::add, .in = linear(b.fc2, f, n + ".fc2"), .in2 = h, .module = n + ".add2"}, shape(x));
  }

  // layer_norm / rms_norm over x's trailing dims gamma.shape().
  int norm(StepKind kind, const Tensor<T>& gamma, const Tensor<T>* beta, double eps, int x, const std::string& n,
           std::string_view what) {
    const Shape& xs = shape(x);
    const Shape& gs = gamma.shape();
    bool fits = gs.rank() < xs.rank();  // the batch dim is never normalized
    for (int d = 0; fits && d < gs.rank(); ++d) fits = gs[d] == xs[xs.rank() - gs.rank() + d];
    CUTRAIN_REQUIRE(fits, InvalidArgument, compile_op, "module ", n, " (", what, " over ", gs, ") does not take ", xs,
                    ": its trailing dims must be ", gs);
    Step<T> s{.kind = kind, .in = x, .w = host_copy(gamma), .eps = eps, .module = n};
    if (beta) s.b = host_copy(*beta);
    return push(std::move(s), xs);
  }

  int activation(const ActivationParams& a, int x, const std::string& n) {
    cutrain::detail::check_activation(cutrain::detail::cat(compile_op, ": module ", n), a);
    return push({.kind = StepKind::activation, .in = x, .act = a, .module = n}, shape(x));
  }

  int pool(const Pool2dParams& pp, int x, const std::string& n) {
    require_rank(x, 4, pp.mode == PoolMode::max ? "MaxPool2d" : "AvgPool2d", n);
    Shape y;
    try {
      y = pool2d_output_shape(shape(x), pp, pp.mode == PoolMode::max ? "MaxPool2d" : "AvgPool2d");
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(std::string(compile_op), cutrain::detail::cat("module ", n, ": ", e.what()));
    }
    return push({.kind = StepKind::pool, .in = x, .pool = pp, .module = n}, std::move(y));
  }

  // relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), the shortcut first: it is ready when the
  // main path's last convolution runs, so the add can be fused into that convolution.
  int residual(const nn::ResidualBlock<T>& r, int x, const std::string& n) {
    int s = x;
    if (r.shortcut_conv) s = batch_norm(*r.shortcut_bn, conv(*r.shortcut_conv, x, n + ".shortcut.conv"), n + ".shortcut.bn");
    int h = activation({.kind = Activation::relu}, batch_norm(r.bn1, conv(r.conv1, x, n + ".conv1"), n + ".bn1"), n + ".relu1");
    h = batch_norm(r.bn2, conv(r.conv2, h, n + ".conv2"), n + ".bn2");
    CUTRAIN_REQUIRE(shape(s) == shape(h), InvalidArgument, compile_op, "module ", n, " (ResidualBlock): the shortcut ",
                    shape(s), " and the main path ", shape(h), " differ");
    const int sum = push({.kind = StepKind::add, .in = h, .in2 = s, .module = n + ".add"}, shape(h));
    return activation({.kind = Activation::relu}, sum, n + ".relu2");
  }

  Plan<T>& p_;
};

// How many steps read each value (the output counts as one more).
template <class T>
std::vector<int> uses(const Plan<T>& p) {
  std::vector<int> u(p.shapes.size(), 0);
  for (const auto& s : p.steps) {
    if (s.in >= 0) ++u[static_cast<std::size_t>(s.in)];
    if (s.in2 >= 0) ++u[static_cast<std::size_t>(s.in2)];
  }
  ++u[static_cast<std::size_t>(p.output)];
  return u;
}

// The index of the step that writes v; -1 for the input.
template <class T>
int producer(const Plan<T>& p, int v) {
  for (std::size_t i = 0; i < p.steps.size(); ++i)
    if (p.steps[i].out == v) return static_cast<int>(i);
  return -1;
}

// The step that writes v, where one step alone reads v (not the output too): a step that can
// take that reader in. Null for the input or a v with other readers.
template <class T>
Step<T>* sole_producer(Plan<T>& p, int v) {
  const int c = producer(p, v);
  return c >= 0 && uses(p)[static_cast<std::size_t>(v)] == 1 ? &p.steps[static_cast<std::size_t>(c)] : nullptr;
}

// Merges step `from` into step `into` (which wrote from's input): `into` now writes from's output.
template <class T>
void absorb(Plan<T>& p, int into, std::size_t from, std::string what) {
  auto& s = p.steps[static_cast<std::size_t>(into)];
  s.out = p.steps[from].out;
  s.merged.push_back(std::move(what));
  p.steps.erase(p.steps.begin() + static_cast<std::ptrdiff_t>(from));
}

}  // namespace detail

// Folds each scale_shift (an eval-mode batch norm) into the convolution before it, where that
// convolution's output feeds nothing else: w[k] *= scale[k], b[k] = b[k] * scale[k] + shift[k].
template <class T>
void fold_batch_norms(Plan<T>& p) {
  for (std::size_t i = 0; i < p.steps.size();) {
    const auto& s = p.steps[i];
    auto* conv = s.kind == StepKind::scale_shift ? detail::sole_producer(p, s.in) : nullptr;
    if (!conv || conv->kind != StepKind::conv || conv->in2 >= 0 || conv->act.kind != Activation::identity) {
      ++i;
      continue;
    }
    const std::int64_t k = conv->w.dim(0), per = conv->w.numel() / k;
    Tensor<T> b(Shape{k});
    for (std::int64_t o = 0; o < k; ++o) {  // in double: a bf16 or f16 model rounds once
      const double sc = s.scale[static_cast<std::size_t>(o)], sh = s.shift[static_cast<std::size_t>(o)];
      for (std::int64_t j = 0; j < per; ++j)
        conv->w.flat(o * per + j) = static_cast<T>(static_cast<double>(conv->w.flat(o * per + j)) * sc);
      b.flat(o) = static_cast<T>((conv->b.defined() ? static_cast<double>(conv->b.flat(o)) * sc : 0.0) + sh);
    }
    conv->b = std::move(b);
    detail::absorb(p, static_cast<int>(conv - p.steps.data()), i, "batch_norm " + s.module + " (folded)");
  }
}

// Fuses an add into the convolution or linear layer that writes one operand, where the other
// operand is ready before that step runs: act(conv + b + residual) becomes one cuDNN graph,
// linear + b + residual one cuBLASLt matmul (the residual its C operand).
template <class T>
void fuse_residual_adds(Plan<T>& p) {
  for (std::size_t i = 0; i < p.steps.size();) {
    const auto& s = p.steps[i];
    bool done = false;
    for (const auto& [main, other] : {std::pair{s.in, s.in2}, std::pair{s.in2, s.in}}) {
      if (s.kind != StepKind::add) break;
      const int c = detail::producer(p, main);
      const StepKind k = c < 0 ? StepKind::add : p.steps[static_cast<std::size_t>(c)].kind;
      if (k != StepKind::conv && k != StepKind::linear) continue;
      auto& conv = p.steps[static_cast<std::size_t>(c)];
      if (conv.in2 >= 0 || conv.act.kind != Activation::identity || detail::uses(p)[static_cast<std::size_t>(main)] != 1 ||
          main == other || detail::producer(p, other) >= c)
        continue;
      conv.in2 = other;
      detail::absorb(p, c, i, "add " + s.module);  // s is gone now
      done = true;
      break;
    }
    if (!done) ++i;
  }
}

// Fuses an activation into the convolution or linear layer before it (linear: identity, relu
// and gelu_tanh, what cuBLASLt's epilogues take), where its input feeds nothing else.
template <class T>
void fuse_activations(Plan<T>& p) {
  for (std::size_t i = 0; i < p.steps.size();) {
    const auto& s = p.steps[i];
    auto* prev = s.kind == StepKind::activation ? detail::sole_producer(p, s.in) : nullptr;
    const bool epilogue = prev && prev->kind == StepKind::linear && prev->in2 < 0 &&
                          (s.act.kind == Activation::relu || s.act.kind == Activation::gelu_tanh);
    if (!prev || !(prev->kind == StepKind::conv || epilogue) || prev->act.kind != Activation::identity) {
      ++i;
      continue;
    }
    prev->act = s.act;
    detail::absorb(p, static_cast<int>(prev - p.steps.data()), i, cutrain::detail::cat(s.act.kind, " ", s.module));
  }
}

template <class T>
Plan<T> lower(const nn::Sequential<T>& model, const Shape& input) {
  Plan<T> p;
  p.shapes.push_back(input);
  p.output = detail::PlanLowering<T>(p).sequential(model, 0);
  return p;
}

// A static memory plan: each value's byte offset in one arena, values whose lifetimes overlap
// never sharing bytes. A value lives from the step that writes it (the input: before the first)
// to the last step that reads it (the output: to the end). Largest first, each at the lowest
// offset that fits; offsets aligned to 256 bytes.
struct MemoryPlan {
  std::vector<std::int64_t> offset, bytes;
  std::vector<std::pair<int, int>> life;  // [first step, last step]
  std::int64_t arena = 0, total = 0;      // the arena's size; the sum of all values' sizes
};

inline MemoryPlan plan_memory(std::vector<std::int64_t> bytes, std::vector<std::pair<int, int>> life) {
  CUTRAIN_REQUIRE(life.size() == bytes.size(), InvalidArgument, "deploy::plan_memory", bytes.size(), " values but ",
                  life.size(), " lifetimes");
  MemoryPlan m{.offset = std::vector<std::int64_t>(bytes.size(), 0), .bytes = std::move(bytes), .life = std::move(life)};
  // Sums in int64, checked: values whose bytes add up past 2^63 are refused, not wrapped.
  const auto add = [](std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    CUTRAIN_REQUIRE(!__builtin_add_overflow(a, b, &r), InvalidArgument, "deploy::plan_memory",
                    "the values need more than 2^63 bytes (", a, " + ", b, ")");
    return r;
  };
  for (std::size_t v = 0; v < m.bytes.size(); ++v)
    CUTRAIN_REQUIRE(m.bytes[v] >= 0, InvalidArgument, "deploy::plan_memory", "value ", v, " has ", m.bytes[v], " bytes");
  const auto align = [&](std::int64_t b) { return add(b, 255) / 256 * 256; };
  std::vector<std::size_t> order(m.bytes.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return m.bytes[a] > m.bytes[b]; });
  std::vector<std::size_t> placed;
  for (const std::size_t v : order) {
    m.total = add(m.total, m.bytes[v]);
    // The blocks of live-at-the-same-time values, by offset: the first gap that holds v.
    std::vector<std::pair<std::int64_t, std::int64_t>> busy;
    for (const std::size_t u : placed)
      if (m.life[u].first <= m.life[v].second && m.life[v].first <= m.life[u].second)
        busy.emplace_back(m.offset[u], m.offset[u] + align(m.bytes[u]));
    std::sort(busy.begin(), busy.end());
    std::int64_t at = 0;
    for (const auto& [lo, hi] : busy) {
      if (add(at, align(m.bytes[v])) <= lo) break;
      at = std::max(at, hi);
    }
    m.offset[v] = at;
    m.arena = std::max(m.arena, add(at, align(m.bytes[v])));
    placed.push_back(v);
  }
  return m;
}

// The lifetimes of p's values, in steps.
template <class T>
std::vector<std::pair<int, int>> lifetimes(const Plan<T>& p) {
  std::vector<std::pair<int, int>> life(p.shapes.size(), {-1, -1});
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    const int at = static_cast<int>(i);
    const auto& s = p.steps[i];
    life[static_cast<std::size_t>(s.out)] = {at, at};
    for (const int v : {s.in, s.in2})
      if (v >= 0) life[static_cast<std::size_t>(v)].second = at;
  }
  life[static_cast<std::size_t>(p.output)].second = static_cast<int>(p.steps.size());
  return life;
}

}  // namespace cutrain::inline CUTRAIN_ABI::deploy
