// NVRTC kernels: compiled at first use for the running GPU's architecture (nvrtc_compile.hpp),
// cached on disk as CUBIN, loaded with the driver API into the device's primary context, and
// launched on cuda::current_stream().
//
// The compile and disk-cache half needs only nvrtc.h, so the NVRTC compile test runs it with no
// GPU and no CUTRAIN_WITH_CUDA. The load-and-launch half needs CUTRAIN_WITH_CUDA.
#pragma once

#include "cutrain/core/abi.hpp"
#include "cutrain/core/config.hpp"

#include <nvrtc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/files.hpp"
#include "cutrain/cuda/kernels/nvrtc_compile.hpp"
#include "cutrain/cuda/kernels/program.hpp"

#ifdef CUTRAIN_WITH_CUDA
#include <cuda.h>

#include <utility>

#include "cutrain/core/tensor.hpp"
#include "cutrain/cuda/runtime.hpp"
#endif

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

// ---------------------------------------------------------------------------------------------
// The disk cache (no GPU needed)

// Where compiled kernels are cached: $CUTRAIN_KERNEL_CACHE, else kernels/ in cutrain's cache
// directory (files::cache_path); empty (no disk cache) when there is none.
inline std::filesystem::path kernel_cache_dir() { return files::cache_path(config()->kernel_cache, "kernels"); }

// The cache key: a hash of the source, NVRTC's version, the target and the options.
inline std::string cache_key(const Program& p, const Target& t) {
  std::string k = p.source;
  k += '\0';
  k += nvrtc_version();
  k += '\0';
  k += t.gpu_architecture;
  for (const auto& o : nvrtc_options(t)) {
    k += '\0';
    k += o;
  }
  return detail::hex16(detail::fnv1a(k));
}

// The cache file of a program for a target; empty when there is no cache directory.
inline std::filesystem::path cache_file(const Program& p, const Target& t) {
  const auto dir = kernel_cache_dir();
  if (dir.empty()) return {};
  std::string name = p.name;
  for (char& c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) c = '_';
  return dir / (name + "-" + t.gpu_architecture + "-" + cache_key(p, t) + (t.cubin ? ".cubin" : ".ptx"));
}

// Counters that tests and curious users read; they never affect behaviour.
struct KernelStats {
  std::atomic<std::uint64_t> compiles{0};      // NVRTC compilations
  std::atomic<std::uint64_t> disk_hits{0};     // images read from a valid cache file
  std::atomic<std::uint64_t> seed_hits{0};     // images copied in from a seed directory ($CUTRAIN_KERNEL_SEED)
  std::atomic<std::uint64_t> prefetch_waits{0};  // loads that waited for a background compile (prefetch)
  std::atomic<std::uint64_t> disk_rejects{0};  // cache files ignored: corrupt, unreadable or refused by the driver
  std::atomic<std::uint64_t> module_loads{0};  // modules loaded into a device's context
  std::atomic<std::uint64_t> memory_hits{0};   // lookups served by the loaded-module map
  std::atomic<std::uint64_t> load_micros{0};   // wall time of the first loads (compile or disk, and load)
};
inline KernelStats& stats() {
  static KernelStats s;
  return s;
}

namespace detail {
// A cache file is this magic, the payload's size and FNV-1a hash (8 bytes each, native byte
// order: the cache is per machine), then the payload. Anything else is ignored.
inline constexpr std::string_view cache_magic = "cutrain kernel cache v1\n";
inline constexpr std::size_t cache_header_size = cache_magic.size() + 16;

// The payload of a valid cache file; nothing when it is missing, unreadable or corrupt.
inline std::optional<std::vector<char>> read_cache_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  std::string bytes;
  try {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    if (in.bad()) return std::nullopt;
  } catch (const std::exception&) {  // libstdc++ throws from a read that fails underneath
    return std::nullopt;
  }
  if (bytes.size() < cache_header_size || bytes.compare(0, cache_magic.size(), cache_magic) != 0) return std::nullopt;
  std::uint64_t size = 0, hash = 0;
  std::memcpy(&size, bytes.data() + cache_magic.size(), 8);
  std::memcpy(&hash, bytes.data() + cache_magic.size() + 8, 8);
  const std::string_view payload = std::string_view(bytes).substr(cache_header_size);
  if (size != payload.size() || size == 0 || fnv1a(payload) != hash) return std::nullopt;
  return std::vector<char>(payload.begin(), payload.end());
}

// Writes a cache file atomically (files::AtomicFile), so a reader never sees half a file.
// Returns false, and leaves no temporary behind, when it cannot.
inline bool write_cache_file(const std::filesystem::path& path, const std::vector<char>& payload) {
  try {
    std::filesystem::create_directories(path.parent_path());
    files::AtomicFile out(path, "kernels::write_cache_file");
    const std::uint64_t size = payload.size();
    const std::uint64_t hash = fnv1a(std::string_view(payload.data(), payload.size()));
    out.write(cache_magic);
    out.write(&size, 8);
    out.write(&hash, 8);
    out.write(payload.data(), payload.size());
    out.commit();
    return true;
  } catch (const std::exception&) {  // a FileError, a filesystem_error, out of memory
    return false;
  }
}
}  // namespace detail

// A program compiled for a GPU architecture, and where it came from.
struct Image {
  std::vector<char> bytes;
  Target target;
  bool from_disk = false;
  std::filesystem::path file;  // its cache file (empty: no disk cache)
};

// Read-only directories of cache files compiled elsewhere ($CUTRAIN_KERNEL_SEED, ':'-separated;
// examples/prebuild_kernels writes one at build time): a program missing from the cache is looked
// up there (by the same file name) and copied in before NVRTC is asked.
inline std::vector<std::filesystem::path> kernel_seed_dirs() {
  std::vector<std::filesystem::path> dirs;
  const auto c = config();
  for (std::string_view rest = c->kernel_seed; !rest.empty();) {
    const std::size_t colon = std::min(rest.find(':'), rest.size());
    if (colon > 0) dirs.emplace_back(std::string(rest.substr(0, colon)));
    rest.remove_prefix(std::min(colon + 1, rest.size()));
  }
  return dirs;
}

namespace detail {
// Compiles that kernels::prefetch has queued or started, by cache file. Whoever claims a job
// first (a prefetch thread, or a load that needs the program) sets `done` once: a load waits for
// a compile under way instead of compiling the program a second time, and takes back one still
// queued (it compiles the program itself, at once, rather than wait for the queue).
struct InflightJob {
  std::atomic<bool> claimed{false};
  std::promise<void> done;
  std::shared_future<void> ready = done.get_future().share();
};
struct Inflight {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<InflightJob>> jobs;
};
inline Inflight& inflight() {
  static auto* f = new Inflight();  // never destroyed: prefetch threads may outlive main's statics
  return *f;
}
inline void wait_inflight(const std::filesystem::path& file) {
  std::shared_ptr<InflightJob> job;
  {
    auto& f = inflight();
    std::lock_guard lock(f.mutex);
    const auto it = f.jobs.find(file.string());
    if (it == f.jobs.end()) return;
    job = it->second;
  }
  if (!job->claimed.exchange(true)) {  // still queued: this load compiles it
    job->done.set_value();
    return;
  }
  if (job->ready.wait_for(std::chrono::seconds(0)) != std::future_status::ready) ++stats().prefetch_waits;
  job->ready.wait();
}
}  // namespace detail

// The image of a program for a GPU of compute capability arch: read from the disk cache when a
// valid file is there (and use_cache_file), else copied in from a seed directory, else compiled
// with NVRTC and written to the cache. A cache that cannot be read or written is skipped, never
// fatal. A compile kernels::prefetch has under way is waited for first (unless !wait_prefetch:
// the prefetch threads themselves).
inline Image image_for(const Program& p, int arch, bool use_cache_file = true, bool wait_prefetch = true) {
  Image img;
  img.target = target_for(arch);
  img.file = cache_file(p, img.target);
  if (use_cache_file && !img.file.empty()) {
    if (wait_prefetch) detail::wait_inflight(img.file);
    if (auto bytes = detail::read_cache_file(img.file)) {
      img.bytes = std::move(*bytes);
      img.from_disk = true;
      ++stats().disk_hits;
      return img;
    }
    std::error_code ec;
    if (std::filesystem::exists(img.file, ec)) ++stats().disk_rejects;
    for (const auto& dir : kernel_seed_dirs())
      if (auto bytes = detail::read_cache_file(dir / img.file.filename())) {
        detail::write_cache_file(img.file, *bytes);
        img.bytes = std::move(*bytes);
        img.from_disk = true;
        ++stats().seed_hits;
        return img;
      }
  }
  img.bytes = compile(p.source, img.target, p.name + ".cu").image;
  ++stats().compiles;
  if (!img.file.empty()) detail::write_cache_file(img.file, img.bytes);
  return img;
}

#ifdef CUTRAIN_WITH_CUDA
// ---------------------------------------------------------------------------------------------
// Loading and launching (needs a GPU)

namespace detail {
// The driver API functions cutrain uses, looked up through the runtime
// (cudaGetDriverEntryPointByVersion) rather than linked: a binary then does not need
// libcuda.so.1 to start, so on a machine without a driver it can say that it skipped.
struct DriverApi {
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  CUresult (*get_error_string)(CUresult, const char**) = nullptr;
  CUresult (*ctx_get_current)(CUcontext*) = nullptr;
  CUresult (*module_load_data)(CUmodule*, const void*) = nullptr;
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*launch_kernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            CUstream, void**, void**) = nullptr;
};

template <class F>
void driver_entry(const char* symbol, F*& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  cuda::check(cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found), "cuda::kernels",
              cutrain::detail::cat("cudaGetDriverEntryPointByVersion(", symbol, ")"));
  CUTRAIN_REQUIRE(found == cudaDriverEntryPointSuccess && p != nullptr, CudaError, "cuda::kernels",
                  "the CUDA driver has no ", symbol);
  fn = reinterpret_cast<F*>(p);
}

inline const DriverApi& driver() {
  static const DriverApi api = [] {
    DriverApi a;
    driver_entry("cuGetErrorName", a.get_error_name);
    driver_entry("cuGetErrorString", a.get_error_string);
    driver_entry("cuCtxGetCurrent", a.ctx_get_current);
    driver_entry("cuModuleLoadData", a.module_load_data);
    driver_entry("cuModuleGetFunction", a.module_get_function);
    driver_entry("cuLaunchKernel", a.launch_kernel);
    return a;
  }();
  return api;
}

inline void driver_check(CUresult st, std::string_view op, std::string_view what) {
  if (st == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  driver().get_error_name(st, &name);
  driver().get_error_string(st, &text);
  throw CudaError(op, cutrain::detail::cat(what, " failed: ", name ? name : "CUresult ", name ? "" : std::to_string(st),
                                           " (", text ? text : "unknown error", ")"));
}

// The compute capability of a device as major * 10 + minor (90 for an H100 or H200).
inline int device_arch(int device) {
  int major = 0, minor = 0;
  cuda::check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), "cuda::kernels",
              "cudaDeviceGetAttribute(compute capability major)");
  cuda::check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), "cuda::kernels",
              "cudaDeviceGetAttribute(compute capability minor)");
  return major * 10 + minor;
}

// A loaded module and the kernels looked up in it so far.
struct LoadedModule {
  CUmodule module = nullptr;
  std::map<std::string, CUfunction, std::less<>> functions;
};

// The loaded modules of every device, keyed by (device, program name). Process-wide, since a
// module belongs to the device's primary context, which all threads share. Never destroyed:
// unloading at exit could run after the driver has shut down.
struct ModuleRegistry {
  std::mutex mutex;
  std::map<std::pair<int, std::string>, LoadedModule> modules;
};
inline ModuleRegistry& registry() {
  static auto* r = new ModuleRegistry();
  return *r;
}

// Compiles (or reads from the disk cache) and loads a program into the current context. A cache
// file that the driver refuses is ignored: the program is compiled afresh.
inline CUmodule load_module(int device, const Program& p) {
  const int arch = device_arch(device);
  Image img = image_for(p, arch);
  CUmodule module = nullptr;
  CUresult st = driver().module_load_data(&module, img.bytes.data());
  if (st != CUDA_SUCCESS && img.from_disk) {
    ++stats().disk_rejects;
    img = image_for(p, arch, false);
    st = driver().module_load_data(&module, img.bytes.data());
  }
  driver_check(st, "cuda::kernels",
               cutrain::detail::cat("cuModuleLoadData of ", p.name, " (", img.target.gpu_architecture, ") on cuda:", device));
  ++stats().module_loads;
  return module;
}
}  // namespace detail

// Makes a device current for a scope, with its primary context (the one the runtime uses)
// current on this thread, as cuModuleLoadData and cuLaunchKernel need.
class DeviceScope {
 public:
  explicit DeviceScope(int device) : guard_(device) {
    CUcontext ctx = nullptr;
    if (detail::driver().ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr)
      cuda::check(cudaFree(nullptr), "cuda::kernels", "cudaFree(0) to create the primary context");
  }

 private:
  cutrain::detail::DeviceGuard guard_;
};

// The kernel `kernel` of program p on `device`, which a DeviceScope has made current: compiled,
// cached and loaded at the first call, a map lookup afterwards.
inline CUfunction function(int device, const Program& p, std::string_view kernel) {
  auto& reg = detail::registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  const auto key = std::make_pair(device, p.name);
  auto it = reg.modules.find(key);
  if (it == reg.modules.end()) {
    require_not_capturing("cuda::kernels", cutrain::detail::cat("loading the NVRTC kernels of ", p.name));
    detail::LoadedModule loaded;
    const auto t0 = std::chrono::steady_clock::now();
    loaded.module = detail::load_module(device, p);
    stats().load_micros += static_cast<std::uint64_t>(cutrain::cuda::detail::micros_since(t0));
    it = reg.modules.emplace(key, std::move(loaded)).first;
  } else {
    ++stats().memory_hits;
  }
  detail::LoadedModule& m = it->second;
  auto f = m.functions.find(kernel);
  if (f == m.functions.end()) {
    CUfunction fn = nullptr;
    const std::string name(kernel);
    detail::driver_check(detail::driver().module_get_function(&fn, m.module, name.c_str()), "cuda::kernels",
                         cutrain::detail::cat("cuModuleGetFunction(", name, ") in ", p.name));
    f = m.functions.emplace(name, fn).first;
  }
  return f->second;
}

// Launches a kernel on cuda::current_stream(). The arguments go in the kernel's parameter order
// and each must have the parameter's exact type (pointers, int, long long, float, double, or a
// struct with the kernel's layout, passed by value).
template <class... Args>
void launch(CUfunction f, dim3 grid, dim3 block, std::string_view op, const Args&... args) {
  static_assert(((std::is_pointer_v<Args> || (std::is_arithmetic_v<Args> && sizeof(Args) >= 4) ||
                  (std::is_class_v<Args> && std::is_trivially_copyable_v<Args>)) &&
                 ...),
                "kernel arguments are pointers, 4- and 8-byte numbers, or plain structs laid out as the kernel's");
  void* params[] = {const_cast<void*>(static_cast<const void*>(&args))...};
  detail::driver_check(detail::driver().launch_kernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z, 0,
                                                     current_stream(), params, nullptr),
                       op, "cuLaunchKernel");
}

// The number of 16-byte packs of T that n elements make, for a _vec kernel (16 / sizeof(T)
// elements per thread): n / (16 / sizeof(T)) where n is a multiple of it and every pointer is
// 16-byte aligned, else 0 (launch the one-element kernel).
template <class T, class... P>
long long vec_packs(long long n, const P*... ptrs) {
  constexpr long long v = 16 / sizeof(T);
  const bool aligned = ((reinterpret_cast<std::uintptr_t>(ptrs) % 16 == 0) && ...);
  return aligned && n % v == 0 ? n / v : 0;
}

// Blocks of `threads` for a grid-stride loop over n > 0 elements.
inline unsigned grid_for(std::int64_t n, unsigned threads = 256) {
  return static_cast<unsigned>(std::min<std::int64_t>((n + threads - 1) / threads, 65536));
}

// ---------------------------------------------------------------------------------------------
// Helpers of the kernel wrappers

namespace detail {
// t contiguous in layout l (row_major, nchw or nhwc): a view when it already is, else a copy on
// t's device (a kernel, cuda/kernels/copy.hpp).
template <class T>
Tensor<T> staged(const Tensor<T>& t, Layout l) {
  return t.layout() == l ? t.view() : t.contiguous(l);
}

// An input: defined and on a CUDA device.
template <class T>
void require_cuda_input(std::string_view op, const Tensor<T>& t, std::string_view name) {
  CUTRAIN_REQUIRE(t.defined(), InvalidArgument, op, name, " is an empty (undefined) tensor");
  CUTRAIN_REQUIRE(t.device().is_cuda(), DeviceError, op, name, " must be on a CUDA device, got ", t.describe());
}

// An output: the given shape, on the given device, contiguous (row-major, nchw or nhwc).
template <class T>
void require_output(std::string_view op, const Tensor<T>& t, const Shape& shape, Device device, std::string_view name) {
  CUTRAIN_REQUIRE(t.defined() && t.shape() == shape, InvalidArgument, op, name, " must have shape ", shape, ", got ",
                  t.defined() ? t.describe() : std::string("an undefined tensor"));
  CUTRAIN_REQUIRE(t.device() == device, DeviceError, op, name, " must be on ", device, ", got ", t.describe());
  CUTRAIN_REQUIRE(t.is_contiguous(), InvalidArgument, op, name, " must be contiguous (row-major, nchw or nhwc), got ",
                  t.describe());
}
}  // namespace detail
#endif  // CUTRAIN_WITH_CUDA

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels

// Installs the device path of Tensor::copy_from wherever a kernel header is included.
#ifdef CUTRAIN_WITH_CUDA
#include "cutrain/cuda/kernels/copy.hpp"
#endif
