// cutrain's configuration: every environment variable the library reads (docs/architecture.md,
// "Environment variables", has the table), read here and only here, once per process, at the
// first config() call. The rest of include/ reads config(), never the environment, and nothing
// in cutrain calls setenv. A test or a program changes the configuration for a scope with
// ConfigOverride:
//
//   cutrain::ConfigOverride no_disk([](cutrain::Config& c) { c.kernel_cache = "/tmp/k"; });
//
// (dist::Env reads the launcher's variables, RANK, WORLD_SIZE and the rest, when a program asks
// it to: those describe the job, not cutrain.)
#pragma once

#include "cutrain/core/abi.hpp"

#include <array>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace cutrain::inline CUTRAIN_ABI {

struct Config {
  std::string autotune;           // CUTRAIN_AUTOTUNE: heuristic, benchmark or cached (cuda/autotune/options.hpp)
  std::string autotune_cache;     // CUTRAIN_AUTOTUNE_CACHE: the autotune cache file
  std::string kernel_cache;       // CUTRAIN_KERNEL_CACHE: compiled kernels, plan files, warm-start lists
  std::string kernel_seed;        // CUTRAIN_KERNEL_SEED: ':'-separated read-only kernel directories
  bool kernel_prefetch = true;    // CUTRAIN_KERNEL_PREFETCH=0: prefetch queues nothing
  bool plan_cache = true;         // CUTRAIN_PLAN_CACHE=0: no cuDNN plan files
  bool plan_log = false;          // CUTRAIN_PLAN_LOG set and not 0: graph builds logged on stderr
  bool cudnn_full_errors = false;  // CUTRAIN_CUDNN_FULL_ERRORS=1: whole library messages in what()
  std::string bn_forward;         // CUTRAIN_BN_FORWARD: cudnn or fast (cuda/kernels/batch_norm_train.hpp)
  std::string bn_backward;        // CUTRAIN_BN_BACKWARD: cudnn
  bool profile = false;           // CUTRAIN_PROFILE=1: profile::Session::from_env records
  std::string profile_dir;        // CUTRAIN_PROFILE_DIR: where that session also writes JSON
  std::string fashion_mnist_dir;  // CUTRAIN_FASHION_MNIST_DIR
  std::string xdg_cache_home;     // XDG_CACHE_HOME: where caches go by default (files::cache_path)
  std::string home;               // HOME: the same, when XDG_CACHE_HOME is not usable

  // The variables Config reads, by name.
  static constexpr std::array<std::string_view, 15> variables{
      "CUTRAIN_AUTOTUNE",          "CUTRAIN_AUTOTUNE_CACHE", "CUTRAIN_KERNEL_CACHE", "CUTRAIN_KERNEL_SEED",
      "CUTRAIN_KERNEL_PREFETCH",   "CUTRAIN_PLAN_CACHE",     "CUTRAIN_PLAN_LOG",     "CUTRAIN_CUDNN_FULL_ERRORS",
      "CUTRAIN_BN_FORWARD",        "CUTRAIN_BN_BACKWARD",    "CUTRAIN_PROFILE",      "CUTRAIN_PROFILE_DIR",
      "CUTRAIN_FASHION_MNIST_DIR", "XDG_CACHE_HOME",         "HOME"};

  // Sets the field of variable `name` as the environment's value v would; false (and c as it
  // was) for a name that is not in `variables`.
  static bool set(Config& c, std::string_view name, std::string_view v) {
    if (name == "CUTRAIN_AUTOTUNE") c.autotune = v;
    else if (name == "CUTRAIN_AUTOTUNE_CACHE") c.autotune_cache = v;
    else if (name == "CUTRAIN_KERNEL_CACHE") c.kernel_cache = v;
    else if (name == "CUTRAIN_KERNEL_SEED") c.kernel_seed = v;
    else if (name == "CUTRAIN_KERNEL_PREFETCH") c.kernel_prefetch = v != "0";
    else if (name == "CUTRAIN_PLAN_CACHE") c.plan_cache = v != "0";
    else if (name == "CUTRAIN_PLAN_LOG") c.plan_log = !v.empty() && v != "0";
    else if (name == "CUTRAIN_CUDNN_FULL_ERRORS") c.cudnn_full_errors = v == "1";
    else if (name == "CUTRAIN_BN_FORWARD") c.bn_forward = v;
    else if (name == "CUTRAIN_BN_BACKWARD") c.bn_backward = v;
    else if (name == "CUTRAIN_PROFILE") c.profile = v == "1";
    else if (name == "CUTRAIN_PROFILE_DIR") c.profile_dir = v;
    else if (name == "CUTRAIN_FASHION_MNIST_DIR") c.fashion_mnist_dir = v;
    else if (name == "XDG_CACHE_HOME") c.xdg_cache_home = v;
    else if (name == "HOME") c.home = v;
    else return false;
    return true;
  }

  // lookup(name): the variable's value, or null where it is unset (std::getenv for the process).
  static Config from(const std::function<const char*(const char*)>& lookup) {
    Config c;
    for (std::string_view name : variables)
      if (const char* v = lookup(std::string(name).c_str())) set(c, name, v);
    return c;
  }
  static Config from_environment() {
    return from([](const char* name) -> const char* { return std::getenv(name); });
  }
};

namespace detail {
struct ConfigState {
  std::mutex mutex;
  std::shared_ptr<const Config> current;
};
inline ConfigState& config_state() {
  static ConfigState s{{}, std::make_shared<const Config>(Config::from_environment())};
  return s;
}
}  // namespace detail

// The configuration now: the environment as read at the first call, or the innermost live
// ConfigOverride's. Held by the caller as long as it reads it (an override may end meanwhile).
inline std::shared_ptr<const Config> config() {
  auto& s = detail::config_state();
  std::lock_guard lock(s.mutex);
  return s.current;
}

// Changes the configuration for its lifetime, then puts back what was there. Overrides nest
// (end them in reverse order, as scopes do); a default-constructed one changes nothing.
class ConfigOverride {
 public:
  ConfigOverride() = default;
  explicit ConfigOverride(const std::function<void(Config&)>& change) {
    auto& s = detail::config_state();
    std::lock_guard lock(s.mutex);
    auto next = std::make_shared<Config>(*s.current);
    change(*next);
    previous_ = std::exchange(s.current, std::move(next));
  }
  ~ConfigOverride() { restore(); }
  // Moves hand the override on (the moved-from one changes nothing); assign only to an override
  // that holds none (a default-constructed one), as a scope's variable that is set later.
  ConfigOverride(ConfigOverride&& o) noexcept : previous_(std::exchange(o.previous_, nullptr)) {}
  ConfigOverride& operator=(ConfigOverride&& o) noexcept {
    if (this != &o) {
      restore();
      previous_ = std::exchange(o.previous_, nullptr);
    }
    return *this;
  }
  ConfigOverride(const ConfigOverride&) = delete;
  ConfigOverride& operator=(const ConfigOverride&) = delete;

 private:
  void restore() noexcept {
    if (!previous_) return;
    auto& s = detail::config_state();
    std::lock_guard lock(s.mutex);
    s.current = std::move(previous_);
  }
  std::shared_ptr<const Config> previous_;  // null: changed nothing
};

}  // namespace cutrain::inline CUTRAIN_ABI
