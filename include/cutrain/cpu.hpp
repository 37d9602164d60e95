// Everything that runs on the host: core/, cpu/ and ops/. Compiles with no CUDA on the machine.
#pragma once

#include "cutrain/version.hpp"
#include "cutrain/core/tensor.hpp"
#include "cutrain/ops/activation.hpp"
