// NVRTC compilation of cutrain's kernel sources for a GPU architecture, to PTX or CUBIN. Needs
// only nvrtc.h: the NVRTC compile test runs it with no GPU and no CUTRAIN_WITH_CUDA.
#pragma once

#include "cutrain/core/abi.hpp"

#include <nvrtc.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

namespace detail {
inline void nvrtc_check(nvrtcResult st, std::string_view op, std::string_view what) {
  if (st != NVRTC_SUCCESS) throw NvrtcError(op, cutrain::detail::cat(what, " failed: ", nvrtcGetErrorString(st)));
}

// Owns one nvrtcProgram.
class NvrtcProgram {
 public:
  NvrtcProgram(const std::string& source, const std::string& name) {
    nvrtc_check(nvrtcCreateProgram(&prog_, source.c_str(), name.c_str(), 0, nullptr, nullptr), "nvrtc",
                "nvrtcCreateProgram of " + name);
  }
  ~NvrtcProgram() {
    if (prog_) nvrtcDestroyProgram(&prog_);
  }
  NvrtcProgram(const NvrtcProgram&) = delete;
  NvrtcProgram& operator=(const NvrtcProgram&) = delete;

  nvrtcProgram get() const { return prog_; }
  std::string log() const {
    std::size_t size = 0;
    if (nvrtcGetProgramLogSize(prog_, &size) != NVRTC_SUCCESS || size == 0) return {};
    std::string log(size, '\0');
    if (nvrtcGetProgramLog(prog_, log.data()) != NVRTC_SUCCESS) return {};
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    return log;
  }

 private:
  nvrtcProgram prog_ = nullptr;
};

// FNV-1a, 64 bits: a hash that is the same in every run and build (std::hash need not be).
inline std::uint64_t fnv1a(std::string_view bytes, std::uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

inline std::string hex16(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = digits[v & 0xf];
  return s;
}
}  // namespace detail

// NVRTC's version, e.g. "13.0".
inline std::string nvrtc_version() {
  int major = 0, minor = 0;
  detail::nvrtc_check(nvrtcVersion(&major, &minor), "nvrtc", "nvrtcVersion");
  return cutrain::detail::cat(major, ".", minor);
}

// The GPU architectures this NVRTC compiles for (75, 80, 90, ...), ascending.
inline std::vector<int> nvrtc_supported_archs() {
  int n = 0;
  detail::nvrtc_check(nvrtcGetNumSupportedArchs(&n), "nvrtc", "nvrtcGetNumSupportedArchs");
  std::vector<int> archs(static_cast<std::size_t>(n));
  if (n > 0) detail::nvrtc_check(nvrtcGetSupportedArchs(archs.data()), "nvrtc", "nvrtcGetSupportedArchs");
  std::sort(archs.begin(), archs.end());
  return archs;
}

// What a kernel is compiled to: CUBIN for a real architecture ("sm_90"), or PTX for a virtual
// one ("compute_90"), which the driver compiles when it loads it.
struct Target {
  std::string gpu_architecture;
  bool cubin = true;
};

// The target for a GPU of compute capability arch (major * 10 + minor): CUBIN for sm_<arch> when
// this NVRTC knows the architecture, else PTX for the newest one it knows below it (a GPU newer
// than the toolkit).
inline Target target_for(int arch) {
  const auto known = nvrtc_supported_archs();
  if (std::find(known.begin(), known.end(), arch) != known.end()) return {cutrain::detail::cat("sm_", arch), true};
  int best = 0;
  for (int a : known)
    if (a <= arch) best = a;
  CUTRAIN_REQUIRE(best > 0, NvrtcError, "nvrtc", "the GPU (sm_", arch, ") is older than every architecture NVRTC ",
                  nvrtc_version(), " compiles for");
  return {cutrain::detail::cat("compute_", best), false};
}

// The options of every compile. No --use_fast_math: division, sqrt, exp and log stay precise and
// denormals are kept (NVRTC's defaults).
inline std::vector<std::string> nvrtc_options(const Target& t) {
  return {"--gpu-architecture=" + t.gpu_architecture, "-std=c++17"};
}

// A compiled image (CUBIN, or PTX with its terminating NUL) and NVRTC's log (warnings).
struct Compiled {
  std::vector<char> image;
  std::string log;
};

// Compiles one CUDA C++ source for a target; throws NvrtcError with NVRTC's log when it fails.
inline Compiled compile(std::string_view source, const Target& target, std::string_view name = "cutrain_kernel.cu") {
  const std::string op = cutrain::detail::cat("nvrtc ", name);
  detail::NvrtcProgram prog{std::string(source), std::string(name)};
  const auto options = nvrtc_options(target);
  std::vector<const char*> argv;
  for (const auto& o : options) argv.push_back(o.c_str());
  const nvrtcResult st = nvrtcCompileProgram(prog.get(), static_cast<int>(argv.size()), argv.data());
  Compiled out;
  out.log = prog.log();
  if (st != NVRTC_SUCCESS)
    throw NvrtcError(op, cutrain::detail::cat("compiling for ", target.gpu_architecture, " failed: ",
                                              nvrtcGetErrorString(st), "\n", out.log));
  std::size_t size = 0;
  if (target.cubin) {
    detail::nvrtc_check(nvrtcGetCUBINSize(prog.get(), &size), op, "nvrtcGetCUBINSize");
    out.image.resize(size);
    detail::nvrtc_check(nvrtcGetCUBIN(prog.get(), out.image.data()), op, "nvrtcGetCUBIN");
  } else {
    detail::nvrtc_check(nvrtcGetPTXSize(prog.get(), &size), op, "nvrtcGetPTXSize");
    out.image.resize(size);
    detail::nvrtc_check(nvrtcGetPTX(prog.get(), out.image.data()), op, "nvrtcGetPTX");
  }
  return out;
}

// PTX for compute_<arch>, with no GPU and no CUDA runtime or driver involved.
inline std::string compile_ptx_for(std::string_view source, int arch, std::string_view name = "cutrain_kernel.cu") {
  const Compiled c = compile(source, {cutrain::detail::cat("compute_", arch), false}, name);
  return std::string(c.image.data(), strnlen(c.image.data(), c.image.size()));
}

// CUBIN for sm_<arch> (runs ptxas too), with no GPU.
inline std::vector<char> compile_cubin_for(std::string_view source, int arch, std::string_view name = "cutrain_kernel.cu") {
  return compile(source, {cutrain::detail::cat("sm_", arch), true}, name).image;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
