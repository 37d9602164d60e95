// The CPU backend's GEMM library and the threads it uses. Built against cutrain::openblas
// (CUTRAIN_OPENBLAS and EIGEN_USE_BLAS defined), Eigen's matrix products call OpenBLAS, whose
// kernels are chosen for the CPU at run time and which runs on its own thread pool (all cores
// unless OPENBLAS_NUM_THREADS or set_num_threads says otherwise). Otherwise they are Eigen's own,
// vectorized for the flags the program was compiled with, on one thread.
#pragma once

#include "cutrain/core/abi.hpp"

#include <string_view>

#include <Eigen/Core>

#include "cutrain/core/check.hpp"

#ifdef CUTRAIN_OPENBLAS
extern "C" {
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
}
#endif
#ifdef CUTRAIN_ONEDNN
extern "C" void omp_set_num_threads(int num_threads);  // oneDNN's pool (cutrain::onednn links libgomp)
#endif

namespace cutrain::inline CUTRAIN_ABI::cpu {

// "OpenBLAS" or "Eigen": who computes the CPU backend's GEMMs in this program.
inline constexpr std::string_view gemm_library() {
#ifdef CUTRAIN_OPENBLAS
  return "OpenBLAS";
#else
  return "Eigen";
#endif
}

// The threads a CPU GEMM may use: OpenBLAS's pool, else Eigen's (1 unless built with OpenMP).
inline int num_threads() {
#ifdef CUTRAIN_OPENBLAS
  return openblas_get_num_threads();
#else
  return Eigen::nbThreads();
#endif
}

// Caps the CPU GEMMs (and oneDNN's convolutions, with cutrain::onednn) at n threads (n >= 1).
// Without OpenBLAS, oneDNN or OpenMP there is one thread whatever n is.
inline void set_num_threads(int n) {
  CUTRAIN_REQUIRE(n >= 1, InvalidArgument, "cpu::set_num_threads", "the thread count must be >= 1, got ", n);
#ifdef CUTRAIN_OPENBLAS
  openblas_set_num_threads(n);
#endif
#ifdef CUTRAIN_ONEDNN
  omp_set_num_threads(n);
#endif
  Eigen::setNbThreads(n);
}

}  // namespace cutrain::inline CUTRAIN_ABI::cpu
