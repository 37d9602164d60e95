// Compiled with CUTRAIN_WITH_CUDA, as a library built against cutrain::cuda would be.
#include "cutrain/core/tensor.hpp"

float user_sum(const cutrain::Tensor<float>& t) {
  float s = 0;
  for (const float v : t.to_vector()) s += v;
  return s;
}
