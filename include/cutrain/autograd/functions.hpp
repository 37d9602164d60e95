// Differentiable ops on Var<T>. Each op is a function object (a Node) whose forward calls the
// ops/ layer and saves what its backward needs (views, never copies, of the tensors involved);
// backward calls the op's own backward and computes only the gradients its inputs need.
// With no input requiring grad (or under NoGradGuard) no node is recorded.
//
// The ops live in autograd/functions/, one file per family; this header includes them all.
#pragma once

#include "cutrain/autograd/functions/attention.hpp"
#include "cutrain/autograd/functions/batch_norm_act.hpp"
#include "cutrain/autograd/functions/broadcast.hpp"
#include "cutrain/autograd/functions/checkpoint.hpp"
#include "cutrain/autograd/functions/conv_pool.hpp"
#include "cutrain/autograd/functions/conv_transpose.hpp"
#include "cutrain/autograd/functions/elementwise.hpp"
#include "cutrain/autograd/functions/fused_linear.hpp"
#include "cutrain/autograd/functions/fusion.hpp"
#include "cutrain/autograd/functions/linear_cross_entropy.hpp"
#include "cutrain/autograd/functions/linear_loss.hpp"
#include "cutrain/autograd/functions/matmul.hpp"
#include "cutrain/autograd/functions/norm_activation.hpp"
#include "cutrain/autograd/functions/record.hpp"
#include "cutrain/autograd/functions/reduce.hpp"
#include "cutrain/autograd/functions/shape_ops.hpp"
#include "cutrain/autograd/functions/softmax.hpp"
#include "cutrain/autograd/functions/view.hpp"
#include "cutrain/autograd/var.hpp"
