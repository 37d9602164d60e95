// The one switch for TF32: f32 convolutions (cuDNN) and matmuls (cuBLASLt) run in true f32
// unless the process asks for TF32 (tensor cores, about 10 bits of mantissa). bf16 and f16
// always accumulate in f32. One switch for the process, as PyTorch's allow_tf32: every thread
// sees the same (the plan caches key on the compute type, so a change takes effect at the next
// call of each op).
#pragma once

#include "cutrain/core/abi.hpp"

#include <atomic>

namespace cutrain::inline CUTRAIN_ABI::cuda {

struct MathOptions {
  std::atomic<bool> allow_tf32{false};
};
inline MathOptions& math_options() {
  static MathOptions o;
  return o;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda
