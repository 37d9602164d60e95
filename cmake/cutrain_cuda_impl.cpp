// The implementation unit of cutrain::cuda (cmake/cutrain_cuda.cmake): the CUDA backend's bodies
// that need cudnn-frontend, compiled once per build. Without CMake, compile a file like this one
// into your program (docs/building.md).
#include <cutrain/cuda/impl.hpp>
