// Seeded, counter-based random numbers: the value at (seed, index) is the same on every
// backend and in every order of evaluation, so dropout masks and inits are reproducible.
#pragma once

#include "cutrain/core/abi.hpp"

#include <cmath>
#include <cstdint>
#include <numbers>

namespace cutrain::inline CUTRAIN_ABI {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) with 53 random bits, from (seed, index).
inline double uniform_at(std::uint64_t seed, std::uint64_t index) {
  const std::uint64_t r = splitmix64(splitmix64(seed) ^ (index * 0xd1b54a32d192ed03ull));
  return static_cast<double>(r >> 11) * 0x1.0p-53;
}

// A small sequential generator for host-side use (inits, shuffling, test data).
class Rng {
 public:
  explicit Rng(std::uint64_t seed = 0) : seed_(seed) {}
  double uniform() { return uniform_at(seed_, counter_++); }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  std::uint64_t next_u64() { return splitmix64(splitmix64(seed_) ^ (counter_++ * 0xd1b54a32d192ed03ull)); }
  // Uniform integer in [0, n).
  std::uint64_t below(std::uint64_t n) { return n ? next_u64() % n : 0; }
  std::uint64_t seed() const { return seed_; }
  std::uint64_t counter() const { return counter_; }
  void set_state(std::uint64_t seed, std::uint64_t counter) { seed_ = seed; counter_ = counter; }

 private:
  std::uint64_t seed_;
  std::uint64_t counter_ = 0;
};

}  // namespace cutrain::inline CUTRAIN_ABI
