// The deploy engine's 8-bit convolution (deploy/engine_fp8.hpp) on cuDNN's graph API:
//
//   y = act(conv(xq, wq) * descale + bias (+ residual))
//
// xq [N, C, H, W] and wq [K, C/groups, R, S] are FP8 e4m3 bytes in NHWC (x / x_scale and each
// output channel's w / w_scale[k], cuda/kernels/quantize.hpp and core/fp8.hpp); the convolution
// accumulates in f32; descale [1, K, 1, 1] f32 is x_scale * w_scale[k] (or [1, 1, 1, 1] for one
// w scale per tensor); bias [1, K, 1, 1], residual and y (NHWC) are in T. One graph, tuned like the other convolutions. False, having run
// nothing, where cuDNN has no engine for the signature (the engine then runs the step in T).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cutrain/core/params/activation.hpp"
#include "cutrain/core/params/conv2d.hpp"
#include "cutrain/cuda/cudnn/conv.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn {

template <GpuFloat T>
[[nodiscard]] bool conv2d_fp8_forward(const Tensor<std::uint8_t>& xq, const Tensor<std::uint8_t>& wq,
                                      const Tensor<float>& descale, const Tensor<T>& bias, const Tensor<T>& residual,
                                      const Conv2dParams& p, const ActivationParams& act, Tensor<T>& y) {
  constexpr std::string_view op = "conv2d_fp8_forward";
  const int dev = xq.device().index;
  const bool has_res = residual.defined(), has_act = act.kind != Activation::identity;
  GraphKey key(GraphOp::conv_fprop_fp8, dev);
  key.add(dtype_of<T>).add(p.stride_h).add(p.stride_w).add(p.pad_top).add(p.pad_bottom).add(p.pad_left);
  key.add(p.pad_right).add(p.dilation_h).add(p.dilation_w).add(p.groups);
  key.add(xq.shape(), xq.strides()).add(wq.shape(), wq.strides()).add(y.shape(), y.strides());
  key.add(has_res).add(static_cast<int>(act.kind)).add(act.alpha).add(descale.numel());
  if (has_res) key.add(residual.shape(), residual.strides());
  PlanStore& store = plan_store();
  bool failed = false;
  BuiltGraph* bg = store.find(key, failed);
  if (!bg && !failed) {
    const std::string text = cutrain::detail::cat(
        "fprop e4m3->", dtype_of<T>, " stride ", p.stride_h, "x", p.stride_w, " pad ", p.pad_top, ",", p.pad_bottom, ",",
        p.pad_left, ",", p.pad_right, " dil ", p.dilation_h, "x", p.dilation_w, " groups ", p.groups,
        signature(" x", xq.shape(), xq.strides()), signature(" w", wq.shape(), wq.strides()),
        signature(" y", y.shape(), y.strides()), descale.numel() == 1 ? " *descale +bias" : " *descale[k] +bias", has_res ? " +residual" : "",
        has_act ? " +" + detail::activation_key(act) : "");
    bg = store.try_build(key, text, autotune::Planner::for_graph(dev, autotune::GraphFamily::convolution),
                         [&](autotune::Planner& planner) {
      namespace fg = fe::graph;
      auto g = detail::new_graph<T>();
      const std::int64_t k = y.dim(1);
      auto X = tensor(*g, "x", xq.shape(), xq.strides(), fe::DataType_t::FP8_E4M3);
      auto W = tensor(*g, "w", wq.shape(), wq.strides(), fe::DataType_t::FP8_E4M3);
      auto D = tensor(*g, "descale", descale.shape(), descale.strides(), fe::DataType_t::FLOAT);
      auto B = tensor(*g, "bias", detail::bias_dims(k), detail::bias_strides(k), fe_type<T>::value);
      const auto pw = [](fe::PointwiseMode_t m) {
        return fg::Pointwise_attributes().set_mode(m).set_compute_data_type(fe::DataType_t::FLOAT);
      };
      auto v = g->conv_fprop(X, W, detail::conv_attributes<fg::Conv_fprop_attributes>(p));
      v = g->pointwise(g->pointwise(v, D, pw(fe::PointwiseMode_t::MUL)), B, pw(fe::PointwiseMode_t::ADD));
      TensorAttr R;
      if (has_res) {
        R = tensor(*g, "residual", residual);
        v = g->pointwise(v, R, pw(fe::PointwiseMode_t::ADD));
      }
      if (has_act) v = g->pointwise(v, detail::activation_attributes(act, false).set_compute_data_type(fe::DataType_t::FLOAT));
      v->set_output(true).set_dim(y.shape().dims()).set_stride(y.strides()).set_data_type(fe_type<T>::value);
      build(*g, handles(dev).cudnn, op, text, false, planner);
      std::vector<TensorAttr> ts{X, W, D, B};
      if (has_res) ts.push_back(R);
      ts.push_back(v);
      return BuiltGraph{g, std::move(ts), g->get_workspace_size()};
    });
  }
  if (!bg) return ++kernel_fallbacks(), false;
  std::vector<const void*> ptrs{xq.data(), wq.data(), descale.data(), bias.data()};
  if (has_res) ptrs.push_back(residual.data());
  ptrs.push_back(y.data());
  execute(*bg, dev, ptrs, op);
  return true;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::cudnn
