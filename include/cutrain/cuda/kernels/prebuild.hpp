// Kernels compiled before their first launch, so that a program's first steps do not wait for
// NVRTC. Needs nvrtc.h only (no GPU): the kernels of a GPU architecture can be compiled on a
// build machine into a directory that travels with the program (CUTRAIN_KERNEL_SEED), or at a
// program's start on background threads (prefetch).
//
//   prebuild(all_programs(), 90);        // now, on the calling thread and helpers; returns counts
//   prefetch(programs_for("float"), 90); // in the background; a launch waits for its own program only
#pragma once

#include "cutrain/core/abi.hpp"
#include "cutrain/core/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "cutrain/cuda/kernels/nvrtc.hpp"
#include "cutrain/cuda/kernels/programs.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::kernels {

// The programs a model computing in element type t (a device type name: "float",
// "cutrain_bf16", "cutrain_f16") can launch: the copy kernel and every program instantiated for
// t or f32, casts included (mixed precision keeps f32 master weights, optimizer and loss).
inline std::vector<Program> programs_for(std::string_view t) {
  std::vector<Program> out{programs::copy()};
  for (Program& p : all_programs())  // instantiations are named NAME_T (casts cast_T_U)
    if (p.name != out[0].name && (p.name.find(t) != std::string::npos || p.name.find("float") != std::string::npos))
      out.push_back(std::move(p));
  return out;
}

struct PrebuildReport {
  std::size_t programs = 0;   // asked for
  std::size_t compiled = 0;   // compiled with NVRTC now
  std::size_t from_disk = 0;  // already in the cache (or copied from a seed directory)
  int threads = 0;
  double seconds = 0;
};

namespace detail {
inline int prebuild_threads(int threads, std::size_t programs) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t n = threads > 0 ? static_cast<std::size_t>(threads) : cores;
  return static_cast<int>(std::clamp<std::size_t>(std::min(n, programs), 1, 64));
}
}  // namespace detail

// Compiles every program for a GPU of compute capability arch into the kernel disk cache
// (kernel_cache_dir()), on `threads` threads (0: one per core), and returns when all are there.
// A program already cached is read, not compiled. Throws NvrtcError when one does not compile,
// and InvalidArgument when there is no cache directory to write to.
inline PrebuildReport prebuild(const std::vector<Program>& programs, int arch, int threads = 0) {
  CUTRAIN_REQUIRE(!kernel_cache_dir().empty(), InvalidArgument, "cuda::kernels::prebuild",
                  "there is no kernel cache directory: set CUTRAIN_KERNEL_CACHE (or HOME / XDG_CACHE_HOME)");
  CUTRAIN_REQUIRE(threads >= 0, InvalidArgument, "cuda::kernels::prebuild", "threads must be >= 0, got ", threads);
  PrebuildReport report;
  report.programs = programs.size();
  report.threads = detail::prebuild_threads(threads, programs.size());
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<std::size_t> next{0}, compiled{0}, cached{0};
  std::mutex error_mutex;
  std::exception_ptr error;
  const auto work = [&] {
    for (std::size_t i; (i = next++) < programs.size();) {
      try {
        (image_for(programs[i], arch).from_disk ? cached : compiled)++;
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  try {
    for (int t = 1; t < report.threads; ++t) pool.emplace_back(work);
  } catch (const std::system_error&) {  // fewer threads to be had: those that started, and this one
  }
  report.threads = static_cast<int>(pool.size()) + 1;
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  report.compiled = compiled;
  report.from_disk = cached;
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

namespace detail {
// The prefetch threads still running; exit waits for them (a compile takes a second or two) so
// that NVRTC is not torn down under them.
struct PrefetchPool {
  std::mutex mutex;
  std::condition_variable idle;
  int busy = 0;
  bool stopping = false;
};
inline PrefetchPool& prefetch_pool() {
  static auto* p = new PrefetchPool();  // never destroyed: detached threads use it
  static struct Drain {
    PrefetchPool& p;
    ~Drain() {
      std::unique_lock lock(p.mutex);
      p.stopping = true;
      p.idle.wait_for(lock, std::chrono::seconds(30), [&] { return p.busy == 0; });
    }
  } drain{*p};
  return *p;
}

// Whether files can be written in dir (created if need be): without that a prefetch's compiles
// could reach no launch.
inline bool writable_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const auto probe = dir / cutrain::detail::cat(".prefetch-probe-", ::getpid());
  bool ok = false;
  {
    std::ofstream f(probe, std::ios::binary);
    ok = static_cast<bool>(f << 'x');
  }
  std::filesystem::remove(probe, ec);
  return ok;
}
}  // namespace detail

// Starts compiling the programs for arch into the kernel disk cache on `threads` background
// threads (0: half the cores, at most 8) and returns at once. A program that is cached already
// is skipped. A launch that needs a program being compiled waits for that compile; one whose
// program is still queued compiles it itself at once (see image_for). Never throws for a program
// that fails: its launch compiles it again and reports the error then. Does nothing without a
// kernel cache directory that can be written, or with CUTRAIN_KERNEL_PREFETCH=0. Returns how
// many programs it queued.
inline std::size_t prefetch(const std::vector<Program>& programs, int arch, int threads = 0) {
  CUTRAIN_REQUIRE(threads >= 0 && threads <= 64, InvalidArgument, "cuda::kernels::prefetch", "threads ", threads,
                  " must be 0 (automatic) to 64");
  if (!config()->kernel_prefetch) return 0;
  const auto dir = kernel_cache_dir();
  if (dir.empty() || !detail::writable_dir(dir)) return 0;
  const Target target = target_for(arch);
  struct Job {
    Program program;
    std::shared_ptr<detail::InflightJob> state;
  };
  auto jobs = std::make_shared<std::vector<Job>>();
  {
    auto& f = detail::inflight();
    std::lock_guard lock(f.mutex);
    for (const Program& p : programs) {
      const auto file = cache_file(p, target);
      std::error_code ec;
      if (f.jobs.contains(file.string()) || std::filesystem::exists(file, ec)) continue;
      auto state = std::make_shared<detail::InflightJob>();
      f.jobs.emplace(file.string(), state);
      jobs->push_back({p, std::move(state)});
    }
  }
  if (jobs->empty()) return 0;
  const unsigned cores = std::max(2u, std::thread::hardware_concurrency());
  const std::size_t n = threads > 0 ? static_cast<std::size_t>(threads) : std::min<std::size_t>(8, cores / 2);
  auto next = std::make_shared<std::atomic<std::size_t>>(0);
  auto& pool = detail::prefetch_pool();
  for (std::size_t t = 0; t < std::min(n, jobs->size()); ++t) {
    {
      std::lock_guard lock(pool.mutex);
      ++pool.busy;
    }
    try {
      std::thread([jobs, next, arch, &pool] {
        for (std::size_t i; (i = (*next)++) < jobs->size();) {
          Job& job = (*jobs)[i];
          if (job.state->claimed.exchange(true)) continue;  // a launch took it back
          bool stop = false;
          {
            std::lock_guard lock(pool.mutex);
            stop = pool.stopping;
          }
          try {
            if (!stop) (void)image_for(job.program, arch, true, false);
          } catch (...) {  // the launch compiles it again and throws there
          }
          job.state->done.set_value();
        }
        std::lock_guard lock(pool.mutex);
        --pool.busy;
        pool.idle.notify_all();
      }).detach();
    } catch (...) {  // no thread to be had: the jobs left stay queued, and launches take them back
      std::lock_guard lock(pool.mutex);
      --pool.busy;
      pool.idle.notify_all();
      break;
    }
  }
  return jobs->size();
}

// Points config()->kernel_seed at the seed directory that travels with the running program,
// where it is empty: `kernels` beside the executable or beside its directory (the build's
// build/kernels for build/examples/NAME), for as long as the returned override lives (main()
// keeps it). It changes nothing where there is no such directory or a seed was configured
// (CUTRAIN_KERNEL_SEED). *dir, when given, is set to the directory (or to empty).
inline ConfigOverride use_seed_beside_program(std::filesystem::path* dir = nullptr) {
  if (dir) dir->clear();
  if (!config()->kernel_seed.empty()) return {};
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  for (const auto& d : {exe.parent_path() / "kernels", exe.parent_path().parent_path() / "kernels"})
    if (std::filesystem::is_directory(d, ec)) {
      if (dir) *dir = d;
      return ConfigOverride([&](Config& c) { c.kernel_seed = d.string(); });
    }
  return {};
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::kernels
