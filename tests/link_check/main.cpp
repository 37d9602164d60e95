// Compiled without CUTRAIN_WITH_CUDA, as a program built against cutrain::cutrain would be; it
// calls with_cuda.cpp's function, whose Tensor is the other configuration's.
#include "cutrain/core/tensor.hpp"

float user_sum(const cutrain::Tensor<float>& t);

int main() { return user_sum(cutrain::Tensor<float>::zeros({2})) == 0 ? 0 : 1; }
