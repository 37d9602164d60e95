// The one switch for TF32: f32 convolutions (cuDNN) and matmuls (cuBLASLt) run in true f32
// unless this thread asks for TF32 (tensor cores, about 10 bits of mantissa). bf16 and f16
// always accumulate in f32.
#pragma once

#include "cutrain/core/abi.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda {

struct MathOptions {
  bool allow_tf32 = false;
};
inline MathOptions& math_options() {
  thread_local MathOptions o;
  return o;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda
