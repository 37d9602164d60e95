// Loss parameters shared by the CPU and CUDA backends.
#pragma once

#include "cutrain/core/abi.hpp"

#include <ostream>
#include <string_view>

namespace cutrain::inline CUTRAIN_ABI {

// How per-sample losses become one scalar.
enum class Reduction { mean, sum };

inline std::string_view to_string(Reduction r) {
  switch (r) {
    case Reduction::mean: return "mean";
    case Reduction::sum: return "sum";
  }
  return "?";
}
inline std::ostream& operator<<(std::ostream& os, Reduction r) { return os << to_string(r); }

struct CrossEntropyParams {
  Reduction reduction = Reduction::mean;
  // eps in [0, 1): the target is (1 - eps) * onehot + eps / C.
  double label_smoothing = 0.0;
};

}  // namespace cutrain::inline CUTRAIN_ABI
