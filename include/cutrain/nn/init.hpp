// Weight initialization from a seeded generator (no hidden global RNG): He (Kaiming) for layers
// followed by ReLU, Glorot (Xavier) for the rest.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>

#include "cutrain/core/random.hpp"
#include "cutrain/core/tensor.hpp"

namespace cutrain::inline CUTRAIN_ABI::nn {

enum class Init { kaiming_uniform, kaiming_normal, xavier_uniform, xavier_normal };

namespace init {

// Kaiming: variance 2 / fan_in (gain sqrt(2), ReLU); Xavier: variance 2 / (fan_in + fan_out).
template <class T>
Tensor<T> make(const Shape& shape, Init kind, std::int64_t fan_in, std::int64_t fan_out, Rng& rng) {
  const bool kaiming = kind == Init::kaiming_uniform || kind == Init::kaiming_normal;
  const double var = kaiming ? 2.0 / static_cast<double>(fan_in) : 2.0 / static_cast<double>(fan_in + fan_out);
  const double std = std::sqrt(var);
  if (kind == Init::kaiming_normal || kind == Init::xavier_normal) return Tensor<T>::randn(shape, rng, std);
  const double bound = std::sqrt(3.0) * std;  // uniform(-b, b) has variance b^2 / 3
  return Tensor<T>::uniform(shape, rng, -bound, bound);
}

// A generator for one layer: the user's seed mixed with a per-layer salt, so that two layers
// built from the same seed but different shapes still start differently.
inline Rng rng_for(std::uint64_t seed, std::uint64_t salt) { return Rng(splitmix64(seed ^ splitmix64(salt))); }

}  // namespace init
}  // namespace cutrain::inline CUTRAIN_ABI::nn
