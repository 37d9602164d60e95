// Main of the GPU tests: without a CUDA device it says so and exits with the code CTest's
// SKIP_RETURN_CODE names (77), so the run is listed as skipped, never as passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "cutrain/cuda/runtime.hpp"

int main(int argc, char** argv) {
  if (!cutrain::cuda::available()) {
    std::printf("SKIPPED: no CUDA device on this machine; the GPU tests did not run\n");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("GPU tests on %s (sm_%d%d), cuDNN %zu\n", prop.name, prop.major, prop.minor, cudnnGetVersion());
  return Catch::Session().run(argc, argv);
}
