// One NVRTC program of cutrain's own kernels (decision 3 of DESIGN.md), as text that NVRTC
// compiles at first use. This header needs no CUDA headers, so the NVRTC compile test and the
// docs can list every program without a GPU.
//
// A program is prelude.cuh (element types and their f32 conversions, block reductions) followed
// by typedefs naming its element types (T; U for a cast's output; G for an optimizer's gradient)
// and one kernel source, NAME.cuh beside NAME.hpp, its launcher. f16 and bf16 travel as raw 16-bit
// structs converted by hand, so the sources need neither cuda_fp16.h nor cuda_bf16.h (NVRTC does
// not ship them as built-in headers). Kernels are extern "C", so their names are the plain names
// listed in Program::kernels. The .cuh files reach C++ as the generated NAME_cuh.hpp headers
// (scripts/embed-kernels writes them; a CPU test fails when one is stale).
#pragma once

#include "cutrain/core/abi.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cutrain/core/dtype.hpp"
#include "cutrain/cuda/kernels/prelude_cuh.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

// One NVRTC program: a name that is unique per source text (it keys the loaded-module map and
// names the cache file), the full CUDA C++ text, and the extern "C" kernels it defines.
struct Program {
  std::string name;
  std::string source;
  std::vector<std::string> kernels;
};

// The device-side name of a host element type.
template <class T> inline constexpr std::string_view device_type = "unsupported";
template <> inline constexpr std::string_view device_type<float> = "float";
template <> inline constexpr std::string_view device_type<half> = "cutrain_f16";
template <> inline constexpr std::string_view device_type<bfloat16> = "cutrain_bf16";

// Every element type the kernels are instantiated for.
inline constexpr std::string_view device_types[] = {"float", "cutrain_bf16", "cutrain_f16"};

// The full text of one instantiation: a line naming it, the prelude, typedefs, a blank line,
// the body. The text is the disk cache's key: a change to it compiles the program afresh.
inline Program make_program(std::string_view name, std::string_view body,
                            std::vector<std::pair<std::string_view, std::string_view>> types,
                            std::vector<std::string> kernels) {
  Program p;
  p.name = std::string(name);
  p.source = "// cutrain kernel program ";
  p.source += name;
  p.source += "\n";
  p.source += source::prelude;
  for (const auto& [alias, type] : types) {
    p.name += "_";
    p.name += type;
    p.source += "typedef ";
    p.source += type;
    p.source += " ";
    p.source += alias;
    p.source += ";\n";
  }
  p.source += "\n";
  p.source += body;
  p.kernels = std::move(kernels);
  return p;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
