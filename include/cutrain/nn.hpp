// Modules, losses and optimizers on top of the tiny autograd: everything the training loop in
// docs/autograd.md uses. Includes cutrain/autograd.hpp.
#pragma once

#include "cutrain/autograd.hpp"
#include "cutrain/nn/batch_norm.hpp"
#include "cutrain/nn/conv2d.hpp"
#include "cutrain/nn/conv_transpose2d.hpp"
#include "cutrain/nn/init.hpp"
#include "cutrain/nn/layer_norm.hpp"
#include "cutrain/nn/layers.hpp"
#include "cutrain/nn/linear.hpp"
#include "cutrain/nn/loss.hpp"
#include "cutrain/nn/mixed_precision.hpp"
#include "cutrain/nn/checkpoint.hpp"
#include "cutrain/nn/models.hpp"
#include "cutrain/nn/module.hpp"
#include "cutrain/nn/residual.hpp"
#include "cutrain/nn/rms_norm.hpp"
#include "cutrain/nn/sequential.hpp"
#include "cutrain/optim/clip.hpp"
#include "cutrain/optim/grad_scaler.hpp"
#include "cutrain/optim/optimizer.hpp"
#include "cutrain/optim/schedule.hpp"
