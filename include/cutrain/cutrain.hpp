// All of cutrain. With CUTRAIN_WITH_CUDA defined (link cutrain::cuda), ops on cuda tensors run
// on the GPU where the CUDA backend has them, and the backend core/ allocates and copies through
// (core/backend.hpp) is registered, strided copy kernel included.
#pragma once

#include "cutrain/cpu.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/backend.hpp"
#include "cutrain/cuda/cuda_graph.hpp"
#include "cutrain/cuda/kernels/copy.hpp"
#include "cutrain/cuda/runtime.hpp"
#endif
