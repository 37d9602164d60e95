// The compile boundary of the CUDA backend: the GPU entry points whose bodies need
// cudnn-frontend or cuBLASLt's planning (the cuDNN graphs of cudnn/, the matmuls of cublas/, the
// fused classifier), declared here and nowhere else with their default arguments. ops/ and
// deploy/ include only this header, so a translation unit that includes <cutrain/cutrain.hpp>
// never parses cudnn-frontend (about 20 s and 1.5 GB of g++ per translation unit on 2 cores).
//
// The bodies stay in their headers (cudnn/conv.hpp, cudnn/norm.hpp, cudnn/attention.hpp,
// cudnn/fusion.hpp, cudnn/conv_fp8.hpp, cublas/linear.hpp, cublas/matmul.hpp,
// kernels/linear_cross_entropy.hpp), which include this one; cutrain/cuda/impl.hpp includes them
// all and instantiates every entry point for f32, bf16 and f16. Exactly one translation unit of a
// program includes impl.hpp: the CMake target cutrain::cuda compiles it (cmake/cutrain_cuda_impl.cpp);
// without CMake, compile a file that holds `#include <cutrain/cuda/impl.hpp>` (docs/building.md).
// A translation unit that includes a body header itself (the GPU tests do) also works: the
// linker keeps one copy.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "cutrain/core/fusion.hpp"
#include "cutrain/core/params/activation.hpp"
#include "cutrain/core/params/attention.hpp"
#include "cutrain/core/params/conv2d.hpp"
#include "cutrain/core/params/loss.hpp"
#include "cutrain/core/params/norm.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/cpu/linear_cross_entropy.hpp"  // LinearCrossEntropyResult
#include "cutrain/cuda/gpu_float.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda {

namespace cudnn {

// A tensor of a fusion graph's call as the GPU graph sees it: dims, strides (owned by the
// caller), data; f32 for a norm's parameters and statistics (cuDNN's norm engines take them in
// f32, Graph::f32_values), the graph's dtype otherwise.
struct FusionTensor {
  const Shape* shape = nullptr;
  const Strides* strides = nullptr;
  const void* data = nullptr;
  bool f32 = false;
};

// conv.hpp: y = act(conv(x, w) (+ bias)); bias may be undefined.
template <GpuFloat T>
void conv2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, const Conv2dParams& p, Tensor<T>& y,
                    const ActivationParams& act = {.kind = Activation::identity});
// conv.hpp: dx = act'(act_x) * dgrad(dy, w); act identity: the plain data gradient.
template <GpuFloat T>
void conv2d_backward_data(const Tensor<T>& dy, const Tensor<T>& w, const Conv2dParams& p, Tensor<T>& dx,
                          const ActivationParams& act = {.kind = Activation::identity}, const Tensor<T>& act_x = {});
template <GpuFloat T>
void conv_transpose2d_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, const Conv2dParams& p,
                              Tensor<T>& y);
template <GpuFloat T>
void conv2d_backward_filter(const Tensor<T>& dy, const Tensor<T>& x, const Conv2dParams& p, Tensor<T>& dw);

// norm.hpp. The bool ones: false, having run nothing, where cuDNN has no engine.
template <GpuFloat T>
[[nodiscard]] bool batch_norm_forward_training(const Tensor<T>& x, const Tensor<float>& gamma, const Tensor<float>& beta,
                                               const Tensor<float>& running_mean, const Tensor<float>& running_var,
                                               const BatchNormParams& p, Tensor<T>& y, Tensor<float>& save_mean,
                                               Tensor<float>& save_inv_std, Tensor<float>& next_mean,
                                               Tensor<float>& next_var,
                                               const ActivationParams& act = {.kind = Activation::identity},
                                               const Tensor<T>* residual = nullptr);
template <GpuFloat T>
[[nodiscard]] bool batch_norm_act_backward(const Tensor<T>& x, const Tensor<T>& y, const Tensor<T>& dy,
                                           const Tensor<float>& gamma, const Tensor<float>& save_mean,
                                           const Tensor<float>& save_inv_std, const ActivationParams& act,
                                           Tensor<T>& dx, Tensor<float>& dgamma, Tensor<float>& dbeta, Tensor<T>* dz);
template <GpuFloat T>
[[nodiscard]] bool batch_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<float>& gamma,
                                       const Tensor<float>& save_mean, const Tensor<float>& save_inv_std, Tensor<T>& dx,
                                       Tensor<float>& dgamma, Tensor<float>& dbeta);
template <GpuFloat T>
void layer_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<float>& gamma, const Tensor<float>& mean,
                         const Tensor<float>& inv_std, Tensor<T>& dx, Tensor<float>& dgamma, Tensor<float>& dbeta);
template <GpuFloat T>
[[nodiscard]] bool rms_norm_forward(const Tensor<T>& x, const Tensor<float>& gamma, double eps, Tensor<T>& y,
                                    Tensor<float>& inv_rms);
template <GpuFloat T>
[[nodiscard]] bool rms_norm_backward(const Tensor<T>& x, const Tensor<T>& dy, const Tensor<float>& gamma,
                                     const Tensor<float>& inv_rms, Tensor<T>& dx, Tensor<float>& dgamma);

// attention.hpp: the diagonal band of an SDPA graph: causal, aligned top-left or bottom-right,
// with a sliding window of `window` keys (0: none).
struct AttentionBand {
  bool causal = false, bottom_right = false;
  std::int64_t window = 0;
};
// attention.hpp: false where no engine runs the pattern (nothing ran). bias: an additive bias
// [B or 1, H or 1, Sq, Skv] of the scores, or undefined; dbias, if given, receives its gradient.
template <GpuFloat T>
[[nodiscard]] bool attention_forward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v,
                                     const Tensor<std::int32_t>& q_len, const Tensor<std::int32_t>& kv_len,
                                     const Tensor<T>& bias, double scale, AttentionBand band, double dropout,
                                     const Tensor<std::int32_t>& seed_offset, Tensor<T>& o, Tensor<float>& stats,
                                     Tensor<float>* rng_dump = nullptr);
template <GpuFloat T>
[[nodiscard]] bool attention_backward(const Tensor<T>& q, const Tensor<T>& k, const Tensor<T>& v, const Tensor<T>& o,
                                      const Tensor<T>& dout, const Tensor<float>& stats,
                                      const Tensor<std::int32_t>& q_len, const Tensor<std::int32_t>& kv_len,
                                      const Tensor<T>& bias, double scale, AttentionBand band, bool deterministic,
                                      double dropout, const Tensor<std::int32_t>& seed_offset, Tensor<T>& dq,
                                      Tensor<T>& dk, Tensor<T>& dv, Tensor<T>* dbias = nullptr);

// fusion.hpp: a user's fusion graph as one cuDNN graph.
template <GpuFloat T>
void fusion_forward(const fusion::Graph& g, std::uint64_t id, const std::vector<Shape>& shapes, bool nhwc,
                    std::span<const FusionTensor> inputs, std::span<const FusionTensor> outputs, int dev);

// conv_fp8.hpp: an e4m3 convolution (the deploy engine's); false where no engine runs it.
template <GpuFloat T>
[[nodiscard]] bool conv2d_fp8_forward(const Tensor<std::uint8_t>& xq, const Tensor<std::uint8_t>& wq,
                                      const Tensor<float>& descale, const Tensor<T>& bias, const Tensor<T>& residual,
                                      const Conv2dParams& p, const ActivationParams& act, Tensor<T>& y);

}  // namespace cudnn

namespace cublas {

// linear.hpp: y = act(x w^T + bias [+ residual]), the epilogue fused.
template <GpuFloat T>
void linear_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, Activation act, Tensor<T>& y,
                    std::string_view op = "linear_forward", const Tensor<T>* residual = nullptr);
// linear.hpp: dx, dw and (has_bias) db.
template <GpuFloat T>
void linear_backward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& dy, bool has_bias, Tensor<T>& dx,
                     Tensor<T>& dw, Tensor<T>& db, std::string_view op = "linear_backward");
// linear.hpp: y = gelu_tanh(z), z = x w^T + bias, from one matmul; false where none runs it.
template <GpuFloat T>
[[nodiscard]] bool linear_gelu_forward(const Tensor<T>& x, const Tensor<T>& w, const Tensor<T>& bias, Tensor<T>& y,
                                       Tensor<T>& z, std::string_view op = "linear_gelu_forward");
// linear.hpp: dz = gelu_tanh'(z) * (dy w) from one matmul; false where none runs it.
template <GpuFloat T>
[[nodiscard]] bool linear_dgrad_gelu(const Tensor<T>& w, const Tensor<T>& dy, const Tensor<T>& z, Tensor<T>& dz,
                                     std::string_view op = "linear_dgrad_gelu");
// matmul.hpp: y = alpha a b + beta c, batched and broadcast.
template <GpuFloat T>
void matmul_into(const Tensor<T>& a_in, const Tensor<T>& b_in, const Tensor<T>& c_in, float alpha, float beta,
                 Tensor<T>& y, std::string_view op = "matmul");

}  // namespace cublas

namespace kernels {

// linear_cross_entropy.hpp: the fused classifier's loss and (grads) its gradient over the logits.
template <GpuFloat T>
LinearCrossEntropyResult<T> linear_cross_entropy(const Tensor<T>& x, const Tensor<T>& w,
                                                 const Tensor<std::int32_t>& labels, const LinearCrossEntropyParams& p,
                                                 bool grads);
// linear_cross_entropy.hpp: dx * s and dw * s for the one-element upstream gradient s (f32, on
// the device), as new tensors.
template <GpuFloat T>
void scale_classifier_grads(const Tensor<float>& s, Tensor<T>& dx, Tensor<float>& dw);

}  // namespace kernels

}  // namespace cutrain::inline CUTRAIN_ABI::cuda
