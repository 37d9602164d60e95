// Loss parameters shared by the CPU and CUDA backends.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>
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

// The fused classifier (ops/linear_cross_entropy.hpp): cross-entropy of x w^T against labels.
struct LinearCrossEntropyParams {
  Reduction reduction = Reduction::mean;  // mean: over the labels that are not ignore_index
  double label_smoothing = 0.0;           // eps in [0, 1), as CrossEntropyParams
  std::int32_t ignore_index = -100;       // rows with this label add no loss and no gradient (PyTorch's default)
  // Rows whose logits are held at once; 0: as many as fit in about 2 GiB of logits (all of
  // GPT-2's 16 x 1024 tokens). Fewer rows lower the peak memory; each chunk is three matmuls.
  std::int64_t chunk_rows = 0;
  // GPU: the logits' rows are padded to a multiple of this many elements (50257 -> 50304 at 64),
  // so that the matmuls read and write aligned rows; the pad columns are never read.
  std::int64_t pad_to = 64;
};

}  // namespace cutrain::inline CUTRAIN_ABI
