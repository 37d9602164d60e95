// Engine files: deploy::save_engine(engine, path) writes a compiled engine, and
// deploy::load_engine<E>(path) gives it back without the model or a compile: its weights (in E,
// folded, as the engine runs them), its plan (steps, shapes, what was fused), its options, the
// library versions and GPU it was compiled for, and on the GPU the autotuner's choices for that
// GPU (the plans cuDNN and cuBLASLt run; loaded into the tuner's cache, so that no op is tuned
// or left to heuristics again). The file is a .safetensors file: the weights as tensors
// "step<i>.w" / "step<i>.b", the rest as JSON strings in its metadata. docs/deploy.md.
//
//   deploy::save_engine(engine, "resnet18.engine");
//   auto e = deploy::load_engine<bfloat16>("resnet18.engine");   // on the device it was saved for
//
// A file for another element type, device kind, cutrain version, cuDNN or cudnn-frontend version
// or GPU (name, SM count, compute capability) is rejected with InvalidArgument naming each field
// that differs; a corrupt file (a plan that does not add up, a missing or misshapen weight) with
// IoError naming the file and the reason.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cutrain/core/json.hpp"
#include "cutrain/core/safetensors.hpp"
#include "cutrain/cuda/autotune/cache.hpp"
#include "cutrain/deploy/engine.hpp"
#include "cutrain/deploy/engine_fp8.hpp"
#include "cutrain/version.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/autotune/options.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::deploy {

namespace detail {

inline constexpr std::string_view engine_format = "cutrain engine";
inline constexpr int engine_format_version = 3;  // 2: steps carry eps and axis; 3: heads and causal (attention)

// What an engine's plans are valid for, field by field: the library, and on the GPU the card and
// cuDNN's and cudnn-frontend's versions (the autotuner's environment).
inline std::map<std::string, std::string> engine_environment(const Device& d) {
  std::map<std::string, std::string> env{
      {"cutrain", cutrain::detail::cat(version_major, ".", version_minor, ".", version_patch)},
      {"device", d.is_cpu() ? "cpu" : "cuda"}};
#ifdef CUTRAIN_WITH_CUDA
  if (d.is_cuda()) {
    const auto e = cuda::autotune::environment(d.index);
    env["gpu_name"] = e.gpu_name;
    env["sm_count"] = std::to_string(e.sm_count);
    env["compute_capability"] = e.compute_capability;
    env["cudnn_version"] = std::to_string(e.cudnn_version);
    env["frontend_version"] = std::to_string(e.frontend_version);
  }
#endif
  return env;
}

// "gpu_name: the file's NVIDIA H100, here NVIDIA H200; ..." for each field that differs; empty
// when none does.
inline std::string environment_differences(const std::map<std::string, std::string>& file,
                                           const std::map<std::string, std::string>& here) {
  std::set<std::string> keys;
  for (const auto* m : {&file, &here})
    for (const auto& [k, v] : *m) keys.insert(k);
  std::string d;
  for (const auto& k : keys) {
    const auto f = file.find(k), h = here.find(k);
    const std::string fv = f == file.end() ? "(none)" : f->second, hv = h == here.end() ? "(none)" : h->second;
    if (fv != hv) d += cutrain::detail::cat(d.empty() ? "" : "; ", k, ": the file's ", fv, ", here ", hv);
  }
  return d;
}

inline json::Value to_json(const Conv2dParams& c) {
  return json::Value::array({c.stride_h, c.stride_w, c.pad_top, c.pad_bottom, c.pad_left, c.pad_right, c.dilation_h,
                             c.dilation_w, c.groups});
}
inline json::Value to_json(const Pool2dParams& p) {
  return json::Value::array({static_cast<int>(p.mode), p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_top,
                             p.pad_bottom, p.pad_left, p.pad_right, p.count_include_pad ? 1 : 0, p.ceil_mode ? 1 : 0,
                             p.dilation_h, p.dilation_w});
}

// The file's ints, checked to be ints that fit (a hand-edited file is read, not trusted).
inline std::vector<int> ints(const json::Value& v, std::size_t n, std::string_view what) {
  CUTRAIN_REQUIRE(v.is_array() && v.size() == n, InvalidArgument, "load_engine", what, " is not an array of ", n,
                  " integers");
  std::vector<int> r;
  for (const auto& x : v) {
    const std::int64_t i = json::as_int(x);
    CUTRAIN_REQUIRE(i >= -(1 << 30) && i < (1 << 30), InvalidArgument, "load_engine", what, " holds ", i);
    r.push_back(static_cast<int>(i));
  }
  return r;
}
inline Conv2dParams conv_from_json(const json::Value& v) {
  const auto c = ints(v, 9, "a conv's params");
  return {c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]};
}
inline Pool2dParams pool_from_json(const json::Value& v) {
  const auto p = ints(v, 13, "a pool's params");
  CUTRAIN_REQUIRE(p[0] == static_cast<int>(PoolMode::max) || p[0] == static_cast<int>(PoolMode::average), InvalidArgument,
                  "load_engine", "pool mode ", p[0], " is unknown");
  return {.mode = static_cast<PoolMode>(p[0]), .kernel_h = p[1], .kernel_w = p[2], .stride_h = p[3], .stride_w = p[4],
          .pad_top = p[5], .pad_bottom = p[6], .pad_left = p[7], .pad_right = p[8], .count_include_pad = p[9] != 0,
          .ceil_mode = p[10] != 0, .dilation_h = p[11], .dilation_w = p[12]};
}
// An int of the file that must lie in [lo, hi].
inline int int_in(const json::Value& v, std::int64_t lo, std::int64_t hi, std::string_view what) {
  const std::int64_t i = json::as_int(v);
  CUTRAIN_REQUIRE(i >= lo && i <= hi, InvalidArgument, "load_engine", what, " is ", i, ", outside ", lo, " to ", hi);
  return static_cast<int>(i);
}
inline Layout layout_from_json(const std::string& s) {
  if (s == to_string(Layout::nhwc)) return Layout::nhwc;
  CUTRAIN_REQUIRE(s == to_string(Layout::row_major), InvalidArgument, "load_engine", "layout \"", s,
                  "\" is neither row_major nor nhwc");
  return Layout::row_major;
}
inline StepKind step_kind(const std::string& s) {
  for (int k = 0; k <= static_cast<int>(last_step_kind); ++k)
    if (s == to_string(static_cast<StepKind>(k))) return static_cast<StepKind>(k);
  throw InvalidArgument("load_engine", cutrain::detail::cat("step kind \"", s, "\" is unknown"));
}
inline Shape shape_from_json(const json::Value& v) {
  CUTRAIN_REQUIRE(v.is_array() && v.size() >= 2 && v.size() <= 4, InvalidArgument, "load_engine",
                  "a value's shape is not 2-d, 3-d or 4-d");
  std::vector<std::int64_t> d;
  for (const auto& x : v) {
    d.push_back(json::as_int(x));
    CUTRAIN_REQUIRE(d.back() > 0 && d.back() < (std::int64_t{1} << 31), InvalidArgument, "load_engine",
                    "a value's dimension is ", d.back());
  }
  Shape s(d);
  CUTRAIN_REQUIRE(shape_fits(s, 8), InvalidArgument, "load_engine", "a value's shape ", s, " is too large");
  return s;
}

// The shape a step writes, from its input shapes, params and weights, as lowering gave it; throws
// InvalidArgument where they do not fit together.
template <class E>
Shape step_output(const Step<E>& s, const std::vector<Shape>& shapes) {
  const Shape& x = shapes[static_cast<std::size_t>(s.in)];
  const auto need = [](bool ok, auto&&... why) {
    CUTRAIN_REQUIRE(ok, InvalidArgument, "load_engine", why...);
  };
  need(s.kind == StepKind::pool || s.kind == StepKind::activation || s.kind == StepKind::global_avg_pool ||
           s.kind == StepKind::flatten || s.kind == StepKind::add || s.kind == StepKind::softmax ||
           s.kind == StepKind::attention || s.w.defined(),
       "a ", to_string(s.kind), " step has no weight");
  need((s.in2 >= 0) == (s.kind == StepKind::add) || s.kind == StepKind::conv || s.kind == StepKind::linear, "a ",
       to_string(s.kind),
       " step has the wrong operand count");
  cutrain::detail::check_activation("load_engine", s.act);
  switch (s.kind) {
    case StepKind::conv: {
      need(x.rank() == 4 && s.w.rank() == 4, "a conv step's input or weight is not 4-d");
      const Shape y = conv2d_output_shape(x, s.w.shape(), s.conv, "load_engine");
      const Shape bias = s.in2 >= 0 ? Shape{1, y[1], 1, 1} : Shape{y[1]};
      need(!s.b.defined() || s.b.shape() == bias, "a conv step's bias is ", s.b.shape(), ", not ", bias);
      need(s.in2 < 0 || (s.b.defined() && shapes[static_cast<std::size_t>(s.in2)] == y), "a fused residual is ",
           s.in2 >= 0 ? shapes[static_cast<std::size_t>(s.in2)] : Shape{}, ", not ", y);
      return y;
    }
    case StepKind::linear: {
      need(x.rank() >= 2 && s.w.rank() == 2 && s.w.dim(1) == x[x.rank() - 1], "a linear step's weight ", s.w.shape(),
           " does not take ", x);
      need(!s.b.defined() || s.b.shape() == Shape{s.w.dim(0)}, "a linear step's bias is ", s.b.shape());
      std::vector<std::int64_t> y = x.dims();
      y.back() = s.w.dim(0);
      need(s.in2 < 0 || (shapes[static_cast<std::size_t>(s.in2)] == Shape(y) && s.act.kind == Activation::identity),
           "a linear step's fused residual is ", s.in2 >= 0 ? shapes[static_cast<std::size_t>(s.in2)] : Shape{},
           ", not ", Shape(y), ", or comes with an activation");
      return Shape(y);
    }
    case StepKind::add_constant: {
      const Shape w(std::vector<std::int64_t>(x.dims().begin() + 1, x.dims().end()));
      need(s.w.shape() == w, "an add_constant step's constant is ", s.w.shape(), ", not ", w);
      return x;
    }
    case StepKind::attention:
      need(x.rank() == 3 && x[2] % 3 == 0 && s.heads > 0 && (x[2] / 3) % s.heads == 0, "an attention step of ", s.heads,
           " heads does not take ", x);
      return Shape{x[0], x[1], x[2] / 3};
    case StepKind::scale_shift: {
      const Shape c = x.rank() == 4 ? Shape{1, x[1], 1, 1} : Shape{1, x[1]};
      need(s.w.shape() == c && s.b.defined() && s.b.shape() == c, "a scale_shift step's scale is ", s.w.shape(),
           ", not ", c);
      return x;
    }
    case StepKind::pool:
      need(x.rank() == 4, "a pool step's input is not 4-d");
      return pool2d_output_shape(x, s.pool, "load_engine");
    case StepKind::global_avg_pool: need(x.rank() == 4, "a global_avg_pool step's input is not 4-d"); return Shape{x[0], x[1], 1, 1};
    case StepKind::flatten: return Shape{x[0], x.numel() / x[0]};
    case StepKind::activation: return x;
    case StepKind::add: need(shapes[static_cast<std::size_t>(s.in2)] == x, "an add step's operands differ"); return x;
    case StepKind::layer_norm:
    case StepKind::rms_norm: {
      const Shape& g = s.w.shape();
      bool fits = g.rank() < x.rank();
      for (int d = 0; fits && d < g.rank(); ++d) fits = g[d] == x[x.rank() - g.rank() + d];
      need(fits, "a ", to_string(s.kind), " step's weight ", g, " is not a trailing part of its input ", x);
      need((s.kind == StepKind::layer_norm) == s.b.defined() && (!s.b.defined() || s.b.shape() == g), "a ",
           to_string(s.kind), " step's bias is ", s.b.defined() ? s.b.shape() : Shape{});
      need(s.eps > 0 && std::isfinite(s.eps), "a ", to_string(s.kind), " step's eps is ", s.eps);
      return x;
    }
    case StepKind::softmax: need(s.axis >= 0 && s.axis < x.rank(), "a softmax step's axis is ", s.axis); return x;
  }
  throw InvalidArgument("load_engine", "unknown step");
}

}  // namespace detail

// Writes engine to path (atomically). Its weights as the engine holds them (in E, batch norms
// folded), its plan and options, the environment it was compiled for and, on the GPU, the
// autotuner's choices for that GPU.
template <class E>
void save_engine(const Engine<E>& engine, const std::filesystem::path& path) {
  const auto& p = engine.plan();
  const auto& o = engine.options();
  TensorMap weights;
  json::Value steps = json::Value::array();
  for (std::size_t i = 0; i < p.steps.size(); ++i) {
    const auto& s = p.steps[i];
    json::Value j = json::Value::object({{"kind", to_string(s.kind)},
                                         {"in", s.in},
                                         {"in2", s.in2},
                                         {"out", s.out},
                                         {"conv", detail::to_json(s.conv)},
                                         {"pool", detail::to_json(s.pool)},
                                         {"act", static_cast<int>(s.act.kind)},
                                         {"alpha", s.act.alpha},
                                         {"eps", s.eps},
                                         {"axis", s.axis},
                                         {"heads", s.heads},
                                         {"causal", s.causal},
                                         {"module", s.module},
                                         {"merged", s.merged}});
    if (const std::string t = engine.cpu_tactic(i); !t.empty()) j["cpu_tactic"] = t;
    if (s.w.defined()) weights.emplace(cutrain::detail::cat("step", i, ".w"), s.w.view());
    if (s.b.defined()) weights.emplace(cutrain::detail::cat("step", i, ".b"), s.b.view());
    if (s.wf.defined()) weights.emplace(cutrain::detail::cat("step", i, ".wf"), s.wf.view());
    if (s.bf.defined()) weights.emplace(cutrain::detail::cat("step", i, ".bf"), s.bf.view());
    if (s.e4m3_ms >= 0) j["timed"] = json::Value::array({static_cast<double>(s.e4m3_ms), static_cast<double>(s.base_ms)});
    if (s.x_scale > 0) {  // 8-bit: the scales, and w in e4m3 (descale follows from them)
      j["x_scale"] = static_cast<double>(s.x_scale);
      j["w_scale"] = std::vector<double>(s.w_scale.begin(), s.w_scale.end());
      weights.emplace(cutrain::detail::cat("step", i, ".wq"), s.wq.view());
    }
    steps.push_back(std::move(j));
  }
  json::Value shapes = json::Value::array();
  for (const auto& sh : p.shapes) shapes.push_back(sh.dims());
  json::Value plan = json::Value::object({{"steps", std::move(steps)},
                                          {"shapes", std::move(shapes)},
                                          {"output", p.output},
                                          {"removed", p.removed},
                                          {"model", p.model},
                                          {"layout", std::string(to_string(o.layout))},
                                          {"min_batch", o.min_batch},
                                          {"fuse", o.fuse},
                                          {"cuda_graph", o.cuda_graph}});
  if (const auto& q = engine.quantized())
    plan["quantized"] = json::Value::object({{"calibrator", std::string(to_string(q->calibrator))},
                                             {"percentile", q->percentile},
                                             {"per_channel", q->per_channel},
                                             {"keep_faster", q->keep_faster}});
  json::Value env = json::Value::object();
  for (const auto& [k, v] : detail::engine_environment(o.device)) env[k] = v;
  json::Value tuned = json::Value::array();
#ifdef CUTRAIN_WITH_CUDA
  if (o.device.is_cuda()) {
    const auto here = cuda::autotune::environment(o.device.index);
    for (const auto& [key, choice] : cuda::autotune::cache()->entries())
      if (key.environment() == here)
        tuned.push_back(json::Value::object({{"key", cuda::autotune::detail::to_json(key)},
                                             {"choice", cuda::autotune::detail::to_json(choice)}}));
  }
#endif
  save_safetensors(path, weights,
                   {{"format", std::string(detail::engine_format)},
                    {"format_version", std::to_string(detail::engine_format_version)},
                    {"dtype", std::string(to_string(dtype_of<E>))},
                    {"environment", json::dump(env, 0)},
                    {"plan", json::dump(plan, 0)},
                    {"autotune", json::dump(tuned, 0)}});
}

// The engine in path, on device (default: the kind of device it was saved for, cuda:0 or the
// CPU). InvalidArgument where the file's element type, device kind, versions or GPU differ from
// E and this machine (naming each); IoError for a file that is not an engine file or does not
// add up.
template <class E>
Engine<E> load_engine(const std::filesystem::path& path, std::optional<Device> device) {
  constexpr std::string_view op = "load_engine";
  Safetensors file = read_safetensors(path, op);
  const auto meta = [&](const std::string& k) -> const std::string& {
    const auto it = file.metadata.find(k);
    if (it == file.metadata.end())
      throw IoError(std::string(op), cutrain::detail::cat(path.string(), ": not a cutrain engine file (no \"", k,
                                                          "\" in its metadata)"));
    return it->second;
  };
  if (meta("format") != detail::engine_format || meta("format_version") != std::to_string(detail::engine_format_version))
    throw IoError(std::string(op), cutrain::detail::cat(path.string(), ": format \"", meta("format"), "\" version ",
                                                        meta("format_version"), " is not ", detail::engine_format,
                                                        " version ", detail::engine_format_version));
  CUTRAIN_REQUIRE(meta("dtype") == to_string(dtype_of<E>), InvalidArgument, op, path.string(), " holds an engine in ",
                  meta("dtype"), ", not ", dtype_of<E>);
  const auto parsed = [&](const std::string& k) {
    try {
      return json::parse(meta(k));
    } catch (const json::ParseError& e) {
      throw IoError(std::string(op), cutrain::detail::cat(path.string(), ": its \"", k, "\" is not valid JSON: ", e.reason()));
    }
  };
  const json::Value env = parsed("environment"), plan = parsed("plan");
  std::map<std::string, std::string> file_env;
  if (env.is_object())
    for (const auto& [k, v] : env.items()) file_env[k] = v.is_string() ? v.template get<std::string>() : json::dump(v, 0);
  const auto saved_for = file_env.find("device");
  const bool saved_cuda = saved_for != file_env.end() && saved_for->second == "cuda";
  const Device d = device.value_or(saved_cuda ? Device::cuda(0) : Device::cpu());
  CUTRAIN_REQUIRE(d.is_cpu() || built_with_cuda, InvalidArgument, op, path.string(), " is an engine for ", d,
                  ", and this build has no CUDA");
  if (const auto diff = detail::environment_differences(file_env, detail::engine_environment(d)); !diff.empty())
    throw InvalidArgument(std::string(op), cutrain::detail::cat(path.string(), " does not match here: ", diff));
  try {  // from here a problem is the file's: IoError
    CompileOptions o{.device = d,
                     .layout = detail::layout_from_json(json::as_string(json::at(plan, "layout"))),
                     .min_batch = json::as_int(json::at(plan, "min_batch")),
                     .fuse = json::as_bool(json::at(plan, "fuse")),
                     .cuda_graph = json::as_bool(json::at(plan, "cuda_graph"))};
    Plan<E> p;
    std::optional<QuantizeOptions> quantized;
    for (const auto& s : json::as_array(json::at(plan, "shapes"))) p.shapes.push_back(detail::shape_from_json(s));
    for (const auto& r : json::as_array(json::at(plan, "removed"))) p.removed.push_back(json::as_string(r));
    p.model = json::as_string(json::at(plan, "model"));
    CUTRAIN_REQUIRE(p.model.empty() || p.model == "gpt", InvalidArgument, op, "model \"", p.model, "\" is unknown");
    const auto n = static_cast<int>(p.shapes.size());
    CUTRAIN_REQUIRE(n >= 1, InvalidArgument, op, "the plan has no values");
    detail::check_options<E>(op, o, p.shapes[0][0]);  // as compile's: a CPU file that asks for CUDA graphs is corrupt
    std::vector<bool> written(static_cast<std::size_t>(n), false);
    written[0] = true;
    std::size_t tensors_read = 0;
    // An 8-bit conv's scales and e4m3 weights (engine_fp8.hpp), checked as quantize_e4m3 makes them.
    const auto read_8bit = [&](Step<E>& s, const json::Value& xs, const json::Value& ws, std::size_t i) {
      s.x_scale = static_cast<float>(json::as_double(xs));
      CUTRAIN_REQUIRE(s.kind == StepKind::conv && d.is_cuda() && o.layout == Layout::nhwc &&
                          (std::same_as<E, bfloat16> || std::same_as<E, half>),
                      InvalidArgument, op, "an e4m3 step needs a conv in a GPU engine in bf16 or f16, nhwc");
      const auto k = static_cast<std::int64_t>(ws.is_array() ? ws.size() : 0);  // per channel, or 1 per tensor
      CUTRAIN_REQUIRE(std::isfinite(s.x_scale) && s.x_scale > 0 && (k == s.w.dim(0) || k == 1), InvalidArgument, op,
                      "its x_scale ", s.x_scale, " or its ", k, " w_scale values are not valid");
      Tensor<float> dsc(Shape{1, k, 1, 1});
      for (std::int64_t c = 0; c < k; ++c) {
        const float w = static_cast<float>(json::as_double(ws[static_cast<std::size_t>(c)]));
        CUTRAIN_REQUIRE(std::isfinite(w) && w > 0, InvalidArgument, op, "w_scale[", c, "] is ", w);
        s.w_scale.push_back(w);
        dsc.data()[c] = s.x_scale * w;
      }
      const std::string name = cutrain::detail::cat("step", i, ".wq");
      const auto it = file.tensors.find(name);
      CUTRAIN_REQUIRE(it != file.tensors.end() && it->second.dtype() == DType::u8 && it->second.shape() == s.w.shape(),
                      InvalidArgument, op, "tensor ", name, " is missing or not u8 of w's shape ", s.w.shape());
      ++tensors_read;
      s.wq = it->second.template get<std::uint8_t>().contiguous(Layout::nhwc).to(d);
      s.descale = dsc.to(d);
    };
    const auto& steps = json::as_array(json::at(plan, "steps"));
    std::vector<std::string> tactics(steps.size());  // the CPU convolutions' oneDNN tactics
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const auto& j = steps[i];
      if (const auto* t = json::find(j, "cpu_tactic")) tactics[i] = json::as_string(*t);
      Step<E> s;
      try {  // the step's index (and module, once read) in every message about it
        s = Step<E>{.kind = detail::step_kind(json::as_string(json::at(j, "kind"))),
                    .in = detail::int_in(json::at(j, "in"), 0, n - 1, "in"),
                    .in2 = detail::int_in(json::at(j, "in2"), -1, n - 1, "in2"),
                    .out = detail::int_in(json::at(j, "out"), 1, n - 1, "out"),
                    .conv = detail::conv_from_json(json::at(j, "conv")),
                    .pool = detail::pool_from_json(json::at(j, "pool")),
                    .act = {.kind = static_cast<Activation>(
                                detail::int_in(json::at(j, "act"), 0, static_cast<int>(Activation::silu), "act")),
                            .alpha = json::as_double(json::at(j, "alpha"))},
                    .eps = json::as_double(json::at(j, "eps")),
                    .axis = detail::int_in(json::at(j, "axis"), -1, 7, "axis"),
                    .heads = json::as_int(json::at(j, "heads")),
                    .causal = json::as_bool(json::at(j, "causal")),
                    .module = json::as_string(json::at(j, "module"))};
        for (const auto& m : json::as_array(json::at(j, "merged"))) s.merged.push_back(json::as_string(m));
        const auto ready = [&](int v) { return v >= 0 && written[static_cast<std::size_t>(v)]; };
        CUTRAIN_REQUIRE(ready(s.in), InvalidArgument, op, "it reads value ", s.in, ", which no earlier step writes");
        CUTRAIN_REQUIRE(s.in2 == -1 || ready(s.in2), InvalidArgument, op, "it reads value ", s.in2,
                        " (in2), which no earlier step writes");
        CUTRAIN_REQUIRE(!written[static_cast<std::size_t>(s.out)], InvalidArgument, op, "it writes value ", s.out,
                        ", which ", s.out == 0 ? "is the input" : "an earlier step writes");
        written[static_cast<std::size_t>(s.out)] = true;
        const auto take = [&](const std::string& name, Layout l) {
          const auto it = file.tensors.find(name);
          if (it == file.tensors.end()) return Tensor<E>{};
          CUTRAIN_REQUIRE(it->second.dtype() == dtype_of<E>, InvalidArgument, op, "tensor ", name, " is ",
                          it->second.describe());
          ++tensors_read;
          return it->second.template get<E>().contiguous(l).to(d);
        };
        s.w = take(cutrain::detail::cat("step", i, ".w"), s.kind == StepKind::conv ? o.layout : Layout::row_major);
        s.b = take(cutrain::detail::cat("step", i, ".b"), Layout::row_major);
        const auto take_f32 = [&](const std::string& name) {  // a norm's parameters in f32, on the GPU
          const auto it = file.tensors.find(name);
          if (it == file.tensors.end()) return Tensor<float>{};
          CUTRAIN_REQUIRE(it->second.dtype() == DType::f32 && !d.is_cpu(), InvalidArgument, op, "tensor ", name, " is ",
                          it->second.describe());
          ++tensors_read;
          return it->second.template get<float>().contiguous(Layout::row_major).to(d);
        };
        s.wf = take_f32(cutrain::detail::cat("step", i, ".wf"));
        s.bf = take_f32(cutrain::detail::cat("step", i, ".bf"));
        if ((s.kind == StepKind::layer_norm || s.kind == StepKind::rms_norm) && !d.is_cpu())
          CUTRAIN_REQUIRE(s.wf.defined() && s.wf.shape() == s.w.shape() && s.bf.defined() == s.b.defined() &&
                              (!s.bf.defined() || s.bf.shape() == s.b.shape()),
                          InvalidArgument, op, "its f32 norm parameters are missing or misshapen");
        const Shape y = detail::step_output(s, p.shapes);
        CUTRAIN_REQUIRE(y == p.shapes[static_cast<std::size_t>(s.out)], InvalidArgument, op, "it writes ", y,
                        ", the plan says ", p.shapes[static_cast<std::size_t>(s.out)]);
        if (const auto* xs = json::find(j, "x_scale")) read_8bit(s, *xs, json::at(j, "w_scale"), i);
        if (const auto* t = json::find(j, "timed")) {
          CUTRAIN_REQUIRE(t->is_array() && t->size() == 2, InvalidArgument, op, "its timings are not two numbers");
          s.e4m3_ms = static_cast<float>(json::as_double((*t)[0]));
          s.base_ms = static_cast<float>(json::as_double((*t)[1]));
        }
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(std::string(op), cutrain::detail::cat("step ", i, s.module.empty() ? "" : " (module ",
                                                                    s.module, s.module.empty() ? "" : ")", ": ",
                                                                    cutrain::detail::reason_of(e)));
      }
      p.steps.push_back(std::move(s));
    }
    CUTRAIN_REQUIRE(tensors_read == file.tensors.size(), InvalidArgument, op, "it holds ",
                    file.tensors.size() - tensors_read, " tensor(s) that no step reads");
    p.output = static_cast<int>(json::as_int(json::at(plan, "output")));
    CUTRAIN_REQUIRE(p.output >= 0 && p.output < n && written[static_cast<std::size_t>(p.output)] &&
                        (p.output > 0 || p.steps.empty()),
                    InvalidArgument, op, "the output value ", p.output, " is no step's output");
    if (const auto* q = json::find(plan, "quantized")) {
      const std::string c = json::as_string(json::at(*q, "calibrator"));
      CUTRAIN_REQUIRE(c == "max" || c == "percentile", InvalidArgument, op, "calibrator \"", c, "\" is unknown");
      quantized = QuantizeOptions{.calibrator = c == "max" ? Calibrator::max : Calibrator::percentile,
                                  .percentile = json::as_double(json::at(*q, "percentile")),
                                  .per_channel = json::as_bool(json::at(*q, "per_channel")),
                                  .keep_faster = json::as_bool(json::at(*q, "keep_faster"))};
    }
#ifdef CUTRAIN_WITH_CUDA
    if (d.is_cuda()) {  // the tuner's choices, where this process has none of its own for the key
      const json::Value tuned = parsed("autotune");
      const auto store = cuda::autotune::cache();
      cuda::autotune::detail::use_environment(*store, cuda::autotune::environment(d.index));
      for (const auto& e : json::as_array(tuned)) {
        const auto key = cuda::autotune::detail::key_from_json(json::at(e, "key"));
        if (!store->find(key)) store->insert(key, cuda::autotune::detail::choice_from_json(json::at(e, "choice")));
      }
    }
#endif
    Engine<E> e(std::move(p), o);
    e.quantized_ = quantized;
    for (std::size_t i = 0; i < tactics.size(); ++i) e.onednn_.set_tactic(i, std::move(tactics[i]));
    return e;
  } catch (const InvalidArgument& e) {
    throw IoError(std::string(op),
                  cutrain::detail::cat(path.string(), ": the engine does not add up: ", cutrain::detail::reason_of(e)));
  }
}

template <class E>
Engine<E> load_engine(const std::filesystem::path& path) {
  return load_engine<E>(path, std::nullopt);
}

}  // namespace cutrain::inline CUTRAIN_ABI::deploy
