// Compiles cutrain's NVRTC kernels for a GPU architecture into a directory, with no GPU: a seed
// for machines that would otherwise compile them at a program's first launches
// (CUTRAIN_KERNEL_SEED=DIR; see docs/kernels.md, Cold start). The build runs it into
// build/kernels for sm_90 (CUTRAIN_KERNEL_SEED_ARCHS).
//
//   prebuild_kernels DIR [--arch 90] [--threads N]
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "cutrain/cuda/kernels/prebuild.hpp"

using namespace cutrain::cuda::kernels;

int main(int argc, char** argv) try {
  std::string dir;
  int arch = 90, threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--arch" && i + 1 < argc) {
      arch = std::stoi(argv[++i]);
    } else if (a == "--threads" && i + 1 < argc) {
      threads = std::stoi(argv[++i]);
    } else if (!a.empty() && a[0] != '-' && dir.empty()) {
      dir = a;
    } else {
      std::fprintf(stderr, "usage: prebuild_kernels DIR [--arch 90] [--threads N]\n");
      return 2;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: prebuild_kernels DIR [--arch 90] [--threads N]\n");
    return 2;
  }
  const cutrain::ConfigOverride into_dir([&](cutrain::Config& c) {
    c.kernel_cache = dir;  // the kernels compile into DIR
    c.kernel_seed.clear();  // and none is copied from a seed
  });
  const auto programs = all_programs();
  const PrebuildReport r = prebuild(programs, arch, threads);
  std::printf("prebuild_kernels: %zu programs for %s with NVRTC %s in %s: %zu compiled, %zu already there, %.1f s on %d "
              "threads\n",
              r.programs, target_for(arch).gpu_architecture.c_str(), nvrtc_version().c_str(), dir.c_str(), r.compiled,
              r.from_disk, r.seconds, r.threads);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "prebuild_kernels: %s\n", e.what());
  return 1;
}
