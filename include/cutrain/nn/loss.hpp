// Losses on Vars, as the training loop calls them: nn::cross_entropy(net(x), y).
#pragma once

#include "cutrain/core/abi.hpp"

#include <cstdint>

#include "cutrain/autograd/functions.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

// labels int32 or int64.
template <class T, ops::IndexInt I>
autograd::Var<T> cross_entropy(const autograd::Var<T>& logits, const Tensor<I>& labels,
                               const CrossEntropyParams& p = {}) {
  return autograd::cross_entropy(logits, labels, p);
}

}  // namespace cutrain::inline CUTRAIN_ABI::nn
