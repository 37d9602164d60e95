// Where a tensor lives: the host, or one CUDA device.
#pragma once

#include "cutrain/core/abi.hpp"

#include <ostream>
#include <string>

namespace cutrain::inline CUTRAIN_ABI {

struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;

  static constexpr Device cpu() { return {Kind::cpu, 0}; }
  static constexpr Device cuda(int i = 0) { return {Kind::cuda, i}; }
  constexpr bool is_cpu() const { return kind == Kind::cpu; }
  constexpr bool is_cuda() const { return kind == Kind::cuda; }
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
  friend constexpr bool operator==(const Device&, const Device&) = default;
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

// True when this build has CUDA support compiled in (not whether a GPU is present).
inline constexpr bool built_with_cuda =
#ifdef CUTRAIN_WITH_CUDA
    true;
#else
    false;
#endif

}  // namespace cutrain::inline CUTRAIN_ABI
