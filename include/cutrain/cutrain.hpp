// All of cutrain. With CUTRAIN_WITH_CUDA defined (link cutrain::cuda), the CUDA backend too.
#pragma once

#include "cutrain/cpu.hpp"
