// The implementation unit of the CUDA backend: the bodies of cuda/api.hpp's entry points
// (cudnn-frontend graphs, cuBLASLt matmuls, the fused classifier), instantiated for every element
// type the GPU computes in. Include it in exactly one translation unit of a program compiled with
// CUTRAIN_WITH_CUDA; the CMake target cutrain::cuda does (cmake/cutrain_cuda_impl.cpp). A second
// inclusion in one program is harmless but costs its compile time again.
#pragma once

#ifndef CUTRAIN_WITH_CUDA
#error "cutrain/cuda/impl.hpp is the CUDA backend's implementation unit: compile it with CUTRAIN_WITH_CUDA (link cutrain::cuda)"
#endif

#include "cutrain/core/abi.hpp"

#include "cutrain/cuda/api.hpp"
#include "cutrain/cuda/cublas/linear.hpp"
#include "cutrain/cuda/cublas/matmul.hpp"
#include "cutrain/cuda/cudnn/attention.hpp"
#include "cutrain/cuda/cudnn/conv.hpp"
#include "cutrain/cuda/cudnn/conv_fp8.hpp"
#include "cutrain/cuda/cudnn/fusion.hpp"
#include "cutrain/cuda/cudnn/norm.hpp"
#include "cutrain/cuda/kernels/linear_cross_entropy.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda {

// Every entry point of api.hpp for one element type T.
#define CUTRAIN_CUDA_ENTRY_POINTS(T)                                                                                    \
  template void cudnn::conv2d_forward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Conv2dParams&,     \
                                         Tensor<T>&, const ActivationParams&);                                          \
  template void cudnn::conv2d_backward_data<T>(const Tensor<T>&, const Tensor<T>&, const Conv2dParams&, Tensor<T>&,     \
                                               const ActivationParams&, const Tensor<T>&);                              \
  template void cudnn::conv_transpose2d_forward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,                \
                                                   const Conv2dParams&, Tensor<T>&);                                    \
  template void cudnn::conv2d_backward_filter<T>(const Tensor<T>&, const Tensor<T>&, const Conv2dParams&, Tensor<T>&);  \
  template bool cudnn::batch_norm_forward_training<T>(                                                                  \
      const Tensor<T>&, const Tensor<float>&, const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,         \
      const BatchNormParams&, Tensor<T>&, Tensor<float>&, Tensor<float>&, Tensor<float>&, Tensor<float>&,               \
      const ActivationParams&, const Tensor<T>*);                                                                       \
  template bool cudnn::batch_norm_act_backward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,                 \
                                                  const Tensor<float>&, const Tensor<float>&, const Tensor<float>&,     \
                                                  const ActivationParams&, Tensor<T>&, Tensor<float>&, Tensor<float>&,  \
                                                  Tensor<T>*);                                                          \
  template bool cudnn::batch_norm_backward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<float>&,                 \
                                              const Tensor<float>&, const Tensor<float>&, Tensor<T>&, Tensor<float>&,   \
                                              Tensor<float>&);                                                          \
  template void cudnn::layer_norm_backward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<float>&,                 \
                                              const Tensor<float>&, const Tensor<float>&, Tensor<T>&, Tensor<float>&,   \
                                              Tensor<float>&);                                                          \
  template bool cudnn::rms_norm_forward<T>(const Tensor<T>&, const Tensor<float>&, double, Tensor<T>&, Tensor<float>&); \
  template bool cudnn::rms_norm_backward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<float>&,                   \
                                            const Tensor<float>&, Tensor<T>&, Tensor<float>&);                          \
  template bool cudnn::attention_forward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,                       \
                                            const Tensor<std::int32_t>&, const Tensor<std::int32_t>&, const Tensor<T>&, \
                                            double, cudnn::AttentionBand, double, const Tensor<std::int32_t>&,          \
                                            Tensor<T>&, Tensor<float>&, Tensor<float>*);                                \
  template bool cudnn::attention_backward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, const Tensor<T>&,    \
                                             const Tensor<T>&, const Tensor<float>&, const Tensor<std::int32_t>&,       \
                                             const Tensor<std::int32_t>&, const Tensor<T>&, double,                     \
                                             cudnn::AttentionBand, bool, double, const Tensor<std::int32_t>&,           \
                                             Tensor<T>&, Tensor<T>&, Tensor<T>&, Tensor<T>*);                           \
  template void cudnn::fusion_forward<T>(const fusion::Graph&, std::uint64_t, const std::vector<Shape>&, bool,          \
                                         std::span<const cudnn::FusionTensor>, std::span<const cudnn::FusionTensor>,    \
                                         int);                                                                          \
  template bool cudnn::conv2d_fp8_forward<T>(const Tensor<std::uint8_t>&, const Tensor<std::uint8_t>&,                  \
                                             const Tensor<float>&, const Tensor<T>&, const Tensor<T>&,                  \
                                             const Conv2dParams&, const ActivationParams&, Tensor<T>&);                 \
  template void cublas::linear_forward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, Activation, Tensor<T>&, \
                                          std::string_view, const Tensor<T>*);                                          \
  template void cublas::linear_backward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, bool, Tensor<T>&,      \
                                           Tensor<T>&, Tensor<T>&, std::string_view);                                   \
  template bool cublas::linear_gelu_forward<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, Tensor<T>&,        \
                                               Tensor<T>&, std::string_view);                                           \
  template bool cublas::linear_dgrad_gelu<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, Tensor<T>&,          \
                                             std::string_view);                                                         \
  template void cublas::matmul_into<T>(const Tensor<T>&, const Tensor<T>&, const Tensor<T>&, float, float, Tensor<T>&,  \
                                       std::string_view);                                                               \
  template LinearCrossEntropyResult<T> kernels::linear_cross_entropy<T>(                                                \
      const Tensor<T>&, const Tensor<T>&, const Tensor<std::int32_t>&, const LinearCrossEntropyParams&, bool);         \
  template void kernels::scale_classifier_grads<T>(const Tensor<float>&, Tensor<T>&, Tensor<float>&);

CUTRAIN_CUDA_ENTRY_POINTS(float)
CUTRAIN_CUDA_ENTRY_POINTS(bfloat16)
CUTRAIN_CUDA_ENTRY_POINTS(half)

#undef CUTRAIN_CUDA_ENTRY_POINTS

}  // namespace cutrain::inline CUTRAIN_ABI::cuda
