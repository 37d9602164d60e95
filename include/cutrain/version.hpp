// The one place the cutrain version is defined; CMake reads it from here.
#pragma once

#include "cutrain/core/abi.hpp"

#define CUTRAIN_VERSION_MAJOR 0
#define CUTRAIN_VERSION_MINOR 1
#define CUTRAIN_VERSION_PATCH 0

namespace cutrain::inline CUTRAIN_ABI {
inline constexpr int version_major = CUTRAIN_VERSION_MAJOR;
inline constexpr int version_minor = CUTRAIN_VERSION_MINOR;
inline constexpr int version_patch = CUTRAIN_VERSION_PATCH;
inline constexpr const char* version_string = "0.1.0";
}  // namespace cutrain::inline CUTRAIN_ABI
