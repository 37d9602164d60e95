// The GPU tests' precompiled header: all of cutrain, and the CUDA backend's internals the tests
// reach into (cuDNN graphs and the plan store, cuBLASLt, the autotuner, the warm start), whose
// bodies a program otherwise gets from cutrain::cuda's implementation unit (cuda/impl.hpp).
#pragma once

#include <cutrain/cutrain.hpp>
#include <cutrain/cuda/autotune/tuner.hpp>
#include <cutrain/cuda/cublas/linear.hpp>
#include <cutrain/cuda/cublas/matmul.hpp>
#include <cutrain/cuda/cudnn/activation.hpp>
#include <cutrain/cuda/cudnn/attention.hpp>
#include <cutrain/cuda/cudnn/conv.hpp>
#include <cutrain/cuda/cudnn/conv_fp8.hpp>
#include <cutrain/cuda/cudnn/fusion.hpp>
#include <cutrain/cuda/cudnn/norm.hpp>
#include <cutrain/cuda/cudnn/plan_store.hpp>
#include <cutrain/cuda/kernels/linear_cross_entropy.hpp>
#include <cutrain/cuda/warm_start.hpp>
