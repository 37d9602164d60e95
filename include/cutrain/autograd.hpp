// The tiny autograd: Var<T>, backward(), NoGradGuard and the differentiable ops.
#pragma once

#include "cutrain/autograd/engine.hpp"
#include "cutrain/autograd/functions.hpp"
#include "cutrain/autograd/var.hpp"
