// ops::Fusion: runs a user's fusion graph (core/fusion.hpp) on cutrain tensors. On the GPU it is
// one cuDNN graph (cuda/cudnn/fusion.hpp), built once per signature and kept by the plan store;
// on the CPU, and as the GPU's reference, it is the composition of cutrain's ops (fusion_unfused).
//
//   fusion::Graph g;
//   auto x = g.input("x"), w = g.input("w"), b = g.input("bias"), r = g.input("residual");
//   g.output(g.relu(g.add(g.add(g.conv2d(x, w, p), b), r)), "y");
//   ops::Fusion f(std::move(g));
//   Tensor<bfloat16> y = std::move(f(x_t, w_t, b_t, r_t)[0]);
#pragma once

#include "cutrain/core/abi.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <concepts>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cutrain/core/fusion_shapes.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/batch_norm.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/cast.hpp"
#include "cutrain/ops/conv2d.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/layer_norm.hpp"
#include "cutrain/ops/matmul.hpp"
#include "cutrain/ops/rms_norm.hpp"
#include "cutrain/ops/sum_to.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/api.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::ops {

namespace detail {
// The element type of a norm's parameters and statistics in a graph of T: f64 in an f64 graph,
// else f32 (cuDNN's norm engines and cutrain's GPU norm ops take them in f32 under f32, bf16 and
// f16 x).
template <class T>
using fusion_norm_param_t = std::conditional_t<std::same_as<T, double>, double, float>;

// fusion_unfused on a graph and inputs already checked (ops::Fusion checks them once, not per call).
template <class T>
std::vector<Tensor<T>> run_unfused(const fusion::Graph& g, std::span<const Tensor<T>> inputs) {
  using S = fusion_norm_param_t<T>;
  std::vector<Tensor<T>> v(g.nodes().size());
  std::vector<std::vector<Tensor<T>>> parts(g.nodes().size());  // a norm's results after its value
  for (std::size_t i = 0; i < inputs.size(); ++i) v[static_cast<std::size_t>(g.inputs()[i])] = inputs[i].view();
  for (std::size_t i = 0; i < g.nodes().size(); ++i) {
    const fusion::Node& n = g.nodes()[i];
    const auto at = [&](int id) -> const Tensor<T>& { return v[static_cast<std::size_t>(id)]; };
    // A parameter or statistic as the norm op takes it (S, `s`: [C] per channel, [C, H, W] per
    // sample, [N] per row), and a result of the op back as the graph's value (T, `s`).
    const auto param = [&](int id, const Shape& s) { return cutrain::reshape(ops::cast<S>(at(id)), s); };
    const auto back = [](const Tensor<S>& t, const Shape& s) { return ops::cast<T>(cutrain::reshape(t, s)); };
    const auto x4 = [&](int id) {  // a norm's x: 4-d (infer_shapes)
      const auto& x = at(id);
      return std::array{x.dim(0), x.dim(1), x.dim(2), x.dim(3)};
    };
    const auto keep = [&](auto&&... t) { (parts[i].push_back(std::forward<decltype(t)>(t)), ...); };
    switch (n.kind) {
      case fusion::NodeKind::input: break;
      case fusion::NodeKind::conv2d: v[i] = conv2d_forward(at(n.a), at(n.b), n.conv); break;
      case fusion::NodeKind::matmul: v[i] = matmul(at(n.a), at(n.b)); break;
      case fusion::NodeKind::binary: v[i] = binary(n.binary, at(n.a), at(n.b)); break;
      case fusion::NodeKind::scale: v[i] = scale(at(n.a), n.alpha); break;
      case fusion::NodeKind::activation: v[i] = activation_forward(at(n.a), n.act); break;
      case fusion::NodeKind::conv2d_dgrad: v[i] = conv2d_backward_data(at(n.a), at(n.b), n.shape, n.conv); break;
      case fusion::NodeKind::conv2d_wgrad: v[i] = conv2d_backward_filter(at(n.a), at(n.b), n.shape, n.conv); break;
      case fusion::NodeKind::activation_backward: v[i] = activation_backward(at(n.b), at(n.a), n.act); break;
      case fusion::NodeKind::sum_to: v[i] = ops::sum_to(at(n.a), n.shape); break;
      case fusion::NodeKind::layer_norm:
      case fusion::NodeKind::layer_norm_train: {
        const auto [nn, c, h, w] = x4(n.a);
        auto r = layer_norm_forward(at(n.a), param(n.b, {c, h, w}), param(n.c, {c, h, w}), n.alpha);
        v[i] = std::move(r.y);
        if (n.kind == fusion::NodeKind::layer_norm_train)
          keep(back(r.mean, {nn, 1, 1, 1}), back(r.inv_std, {nn, 1, 1, 1}));
        break;
      }
      case fusion::NodeKind::rms_norm:
      case fusion::NodeKind::rms_norm_train: {
        const auto [nn, c, h, w] = x4(n.a);
        auto r = rms_norm_forward(at(n.a), param(n.b, {c, h, w}), n.alpha);
        v[i] = std::move(r.y);
        if (n.kind == fusion::NodeKind::rms_norm_train) keep(back(r.inv_rms, {nn, 1, 1, 1}));
        break;
      }
      case fusion::NodeKind::batch_norm: {
        const Shape c{at(n.a).dim(1)}, ps = at(n.b).shape();
        // The running statistics are updated in place: on copies, which are the node's results.
        Tensor<S> rm = param(n.d, c).clone(Layout::row_major), rv = param(n.e, c).clone(Layout::row_major);
        auto r = batch_norm_forward_training(at(n.a), param(n.b, c), param(n.c, c), rm, rv,
                                             BatchNormParams{.momentum = n.momentum, .eps = n.alpha});
        v[i] = std::move(r.y);
        keep(back(r.save_mean, ps), back(r.save_inv_std, ps), back(rm, ps), back(rv, ps));
        break;
      }
      case fusion::NodeKind::batch_norm_backward: {
        const Shape c{at(n.b).dim(1)}, ps = at(n.c).shape();
        auto r = batch_norm_backward(at(n.b), at(n.a), param(n.c, c), param(n.d, c), param(n.e, c));
        v[i] = std::move(r.dx);
        keep(back(r.dgamma, ps), back(r.dbeta, ps));
        break;
      }
      case fusion::NodeKind::layer_norm_backward:
      case fusion::NodeKind::rms_norm_backward: {
        const auto [nn, c, h, w] = x4(n.b);
        const Shape chw{c, h, w}, rows{nn}, ps = at(n.c).shape();
        if (n.kind == fusion::NodeKind::layer_norm_backward) {
          auto r = layer_norm_backward(at(n.b), at(n.a), param(n.c, chw), param(n.d, rows), param(n.e, rows));
          v[i] = std::move(r.dx);
          keep(back(r.dgamma, ps), back(r.dbeta, ps));
        } else {
          auto r = rms_norm_backward(at(n.b), at(n.a), param(n.c, chw), param(n.d, rows));
          v[i] = std::move(r.dx);
          keep(back(r.dgamma, ps));
        }
        break;
      }
      case fusion::NodeKind::part:
        v[i] = parts[static_cast<std::size_t>(n.a)][static_cast<std::size_t>(n.part - 1)].view();
        break;
    }
  }
  std::vector<Tensor<T>> out;
  for (const auto& o : g.outputs()) out.push_back(v[static_cast<std::size_t>(o.first)].view());
  return out;
}
}  // namespace detail

// The composition of cutrain's ops that g describes, on the inputs' device: the CPU's
// implementation of a fusion, the reference its GPU graph is tested against, and the GPU's
// fallback where cuDNN has no engine for it (Fusion::Options::unfused_fallback).
template <class T>
std::vector<Tensor<T>> fusion_unfused(const fusion::Graph& g, std::span<const Tensor<T>> inputs) {
  g.check_complete("fusion_unfused");
  CUTRAIN_REQUIRE(inputs.size() == g.inputs().size(), InvalidArgument, "fusion_unfused", g.describe(), ": takes ",
                  g.inputs().size(), " inputs, got ", inputs.size());
  return detail::run_unfused(g, inputs);
}

struct FusionOptions {
  // Where cuDNN has no engine for the graph on this GPU, run fusion_unfused instead of throwing.
  bool unfused_fallback = false;
};

class Fusion {
 public:
  using Options = FusionOptions;

  explicit Fusion(fusion::Graph g, Options o = {})
      : g_(std::make_shared<const fusion::Graph>(std::move(g))), id_(next_id()), o_(o) {
    g_->check_complete("ops::Fusion");
    f32_in_ = g_->f32_inputs();
    f32_out_ = g_->f32_outputs();
    norm_ = g_->has_norm();
  }

  const fusion::Graph& graph() const { return *g_; }

  // The outputs (in Graph::output order) for inputs in Graph::input order, on the inputs' device.
  template <class T>
  std::vector<Tensor<T>> operator()(std::span<const Tensor<T>> inputs) const {
    return run(inputs, o_.unfused_fallback);
  }
  template <class T, class... Rest>
    requires(std::same_as<Rest, Tensor<T>> && ...)
  std::vector<Tensor<T>> operator()(const Tensor<T>& first, const Rest&... rest) const {
    std::vector<Tensor<T>> in;
    in.push_back(first.view());
    (in.push_back(rest.view()), ...);
    return run(std::span<const Tensor<T>>(in), o_.unfused_fallback);
  }
  template <class T>
  std::vector<Tensor<T>> operator()(const std::vector<Tensor<T>>& inputs) const {
    return run(std::span<const Tensor<T>>(inputs), o_.unfused_fallback);
  }

  // Empty where the graph runs fused on these inputs (always on the CPU), else the CudnnError's
  // message: the pattern and cuDNN's first reason. Runs the graph once (and builds it, once).
  template <class T>
  std::string unsupported(const std::vector<Tensor<T>>& inputs) const {
    try {
      run(std::span<const Tensor<T>>(inputs), false);
    } catch (const CudnnError& e) {
      return e.what();
    }
    return {};
  }

 private:
  static std::uint64_t next_id() {
    static std::atomic<std::uint64_t> n{0};
    return ++n;
  }

  template <class T>
  std::vector<Tensor<T>> run(std::span<const Tensor<T>> inputs, [[maybe_unused]] bool fallback) const {
    constexpr std::string_view op = "fusion";
    const fusion::Graph& g = *g_;
    CUTRAIN_REQUIRE(inputs.size() == g.inputs().size(), InvalidArgument, op, g.describe(), ": takes ",
                    g.inputs().size(), " inputs, got ", inputs.size());
    std::vector<Shape> shapes;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const std::string& name = g.nodes()[static_cast<std::size_t>(g.inputs()[i])].name;
      check::defined(op, inputs[i], name);
      check::same_device(op, inputs[0], inputs[i]);
      shapes.push_back(inputs[i].shape());
    }
    const auto all = fusion::infer_shapes(g, shapes, op);
    // An empty tensor anywhere: cutrain's ops, which take empty tensors on both devices (cuDNN
    // graphs do not take zero dims).
    for (const auto& t : inputs)
      if (t.numel() == 0) return detail::run_unfused(g, inputs);
    return detail::dispatch<std::vector<Tensor<T>>>(
        op, [&](const auto&) { return detail::run_unfused(g, inputs); },
        CUTRAIN_IF_CUDA([&](const auto&) {
          // Contiguous, 16-byte aligned inputs (cuDNN's engines want both); NHWC intermediates and
          // 4-d outputs where the largest 4-d input is NHWC, except in graphs with a norm (row-major:
          // cuDNN's layer norm gave wrong NHWC results, ops/layer_norm.hpp). A norm's parameters and
          // statistics go in f32 and come back cast to T.
          const bool norm = norm_;
          bool nhwc = false;  // the largest 4-d input's layout (a [1, K, 1, 1] bias has none to speak of)
          std::int64_t largest = -1;
          for (const auto& t : inputs)
            if (t.rank() == 4 && t.numel() > largest && !norm) {
              largest = t.numel();
              nhwc = t.layout() == Layout::nhwc;
            }
          std::vector<Tensor<T>> ins;
          std::vector<Tensor<float>> f32;
          std::vector<cuda::cudnn::FusionTensor> args;
          ins.reserve(inputs.size());  // args point into ins and f32: no reallocation
          f32.reserve(inputs.size());
          for (std::size_t i = 0; i < inputs.size(); ++i) {
            const auto layout = norm ? Layout::row_major : detail::elementwise_layout(inputs[i]);
            const auto& t = ins.emplace_back(detail::contiguous_aligned(inputs[i], layout));
            if (f32_in_[i] && !std::same_as<T, float>) {
              const auto& f = f32.emplace_back(ops::cast<float>(t));
              args.push_back({&f.shape(), &f.strides(), f.data(), true});
            } else {
              args.push_back({&t.shape(), &t.strides(), t.data(), f32_in_[i]});
            }
          }
          std::vector<Tensor<T>> outs;
          std::vector<Tensor<float>> f32_outs;  // f32 results, cast into outs after the run
          std::vector<cuda::cudnn::FusionTensor> out_args;
          outs.reserve(g.outputs().size());  // out_args point into outs and f32_outs: no reallocation
          f32_outs.reserve(g.outputs().size());
          for (std::size_t i = 0; i < g.outputs().size(); ++i) {
            const Shape& s = all[static_cast<std::size_t>(g.outputs()[i].first)];
            const TensorOptions to{.layout = nhwc && s.rank() == 4 ? Layout::nhwc : Layout::row_major,
                                   .device = inputs[0].device()};
            const auto& t = outs.emplace_back(s, to);
            if (f32_out_[i] && !std::same_as<T, float>) {
              const auto& f = f32_outs.emplace_back(s, to);
              out_args.push_back({&f.shape(), &f.strides(), f.data(), true});
            } else {
              out_args.push_back({&t.shape(), &t.strides(), t.data(), f32_out_[i]});
            }
          }
          if constexpr (cuda::GpuFloat<T>) {  // dispatch() calls this only then; no body for others
            try {
              cuda::cudnn::fusion_forward<T>(g, id_, all, nhwc, args, out_args, inputs[0].device().index);
            } catch (const CudnnError&) {
              if (!fallback) throw;
              return detail::run_unfused(g, std::span<const Tensor<T>>(ins));
            }
          }
          for (std::size_t i = 0, k = 0; i < outs.size(); ++i)
            if (f32_out_[i] && !std::same_as<T, float>) outs[i] = ops::cast<T>(f32_outs[k++]);
          return outs;
        }),
        inputs[0]);
  }

  std::shared_ptr<const fusion::Graph> g_;
  std::uint64_t id_;
  Options o_;
  std::vector<bool> f32_in_, f32_out_;  // per input and output: f32 on the GPU (Graph::f32_values)
  bool norm_ = false;                   // the graph has a norm
};

}  // namespace cutrain::inline CUTRAIN_ABI::ops
