// Everything that runs on the host: core/, cpu/, ops/ and data/. Compiles with no CUDA on the
// machine (ops on cuda tensors then throw DeviceError).
#pragma once

#include "cutrain/version.hpp"
#include "cutrain/core/cast.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/core/view.hpp"
#include "cutrain/data/idx.hpp"
#include "cutrain/ops/activation.hpp"
#include "cutrain/ops/batch_norm.hpp"
#include "cutrain/ops/broadcast.hpp"
#include "cutrain/ops/conv2d.hpp"
#include "cutrain/ops/cross_entropy.hpp"
#include "cutrain/ops/dropout.hpp"
#include "cutrain/ops/elementwise.hpp"
#include "cutrain/ops/flatten.hpp"
#include "cutrain/ops/layer_norm.hpp"
#include "cutrain/ops/linear.hpp"
#include "cutrain/ops/pool2d.hpp"
#include "cutrain/ops/reduce.hpp"
#include "cutrain/ops/softmax.hpp"
#include "cutrain/ops/sum_to.hpp"
