// An op-level profiler users turn on: each op that ops::detail::dispatch runs (and each
// optimizer step) is timed while a profile::Session is alive on the thread, with CUDA events on
// the thread's stream for GPU ops and the host clock for CPU ops. Only the outermost op is
// recorded: an op built from others (linear from matmul, the composed attention) counts as one,
// its parts inside it. Ops queued while a CUDA graph is captured are not recorded (a replay runs
// no op code). The session then prints a table by op and by category, and writes JSON and a
// Chrome trace (chrome://tracing, ui.perfetto.dev). docs/profiling.md.
//
//   profile::Session prof;              // from here on this thread's ops are timed
//   for (...) step();
//   prof.stop();                        // waits for the GPU, resolves the events
//   std::cout << prof.table();
//   prof.write_chrome_trace("trace.json");
//
// CUTRAIN_PROFILE=1 in the environment: profile::Session::from_env() returns a session (else
// none); its destructor prints the table to stderr and, with CUTRAIN_PROFILE_DIR, writes
// profile.json and trace.json there. The examples call it.
#pragma once

#include "cutrain/core/abi.hpp"
#include "cutrain/core/config.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iomanip>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "cutrain/core/backend.hpp"
#include "cutrain/core/device.hpp"
#include "cutrain/core/files.hpp"
#include "cutrain/core/json.hpp"

namespace cutrain::inline CUTRAIN_ABI::profile {

// One op's time: start relative to the session's first op on that device, both in ms.
struct OpRecord {
  std::string op, category;
  Device device;
  double start_ms = 0, ms = 0;
};

// The category an op's name puts it in (the table's second grouping).
inline std::string category_of(std::string_view op) {
  const auto has = [&](std::string_view s) { return op.find(s) != std::string_view::npos; };
  const bool backward = has("backward");
  if (has("conv")) {
    if (has("backward_data")) return "conv dgrad";
    if (has("backward_filter")) return "conv wgrad";
    if (has("backward_bias")) return "conv bias grad";
    return "conv fprop";
  }
  if (has("sgd") || has("adam") || has("optim") || has("clip")) return "optimizer";
  if (has("_norm")) return backward ? "norm backward" : "norm forward";
  if (has("attention")) return backward ? "attention backward" : "attention forward";
  if (has("matmul") || has("linear") || has("gemm")) return backward ? "matmul backward" : "matmul";
  if (has("cast")) return "casts";
  if (has("index_select") || has("gather") || has("concat") || has("split") || has("chunk") || has("flatten") ||
      has("copy") || has("contiguous"))
    return "copies and indexing";
  if (has("cross_entropy") || has("softmax")) return "softmax and loss";
  if (has("pool")) return "pooling";
  if (has("sum_to")) return "pointwise";
  if (has("sum") || has("mean") || has("max") || has("min") || has("norm") || has("var")) return "reductions";
  if (has("activation") || has("add") || has("multiply") || has("scale") || has("where") || has("dropout") ||
      has("unary"))
    return "pointwise";
  return "other";
}

class Session;

namespace detail {
// An op begun and not yet resolved: its events (GPU) or clock readings (CPU).
struct Pending {
  std::string op;
  Device device;
  void* ev0 = nullptr;
  void* ev1 = nullptr;
  std::chrono::steady_clock::time_point t0{}, t1{};
};

struct ThreadState {
  Session* active = nullptr;
  int depth = 0;
};

inline ThreadState& thread_state() {
  thread_local ThreadState s;
  return s;
}
}  // namespace detail

class Session {
 public:
  // Starts recording this thread's ops (one session per thread at a time).
  Session() {
    detail::ThreadState& s = detail::thread_state();
    CUTRAIN_REQUIRE(s.active == nullptr, InvalidArgument, "profile::Session",
                    "another session is already recording on this thread");
    s.active = this;
    t0_ = std::chrono::steady_clock::now();
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
  virtual ~Session() {
    try {
      stop();
    } catch (...) {  // a destructor does not throw; the events are lost
    }
    release_events();
  }

  // A session when CUTRAIN_PROFILE=1 (its destructor reports), else nullptr.
  static std::unique_ptr<Session> from_env();

  // Stops recording and resolves every op's time (waits for the GPU work it recorded).
  void stop() {
    detail::ThreadState& s = detail::thread_state();
    if (s.active == this) s.active = nullptr;
    if (stopped_) return;
    stopped_ = true;
    wall_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    const cutrain::detail::DeviceBackend& b = cutrain::detail::device_backend_slot();
    std::map<int, void*> first;  // each device's first event: the trace's zero there
    for (const detail::Pending& p : pending_) {
      if (p.device.is_cuda() ? p.ev1 == nullptr : p.t1 == std::chrono::steady_clock::time_point{})
        continue;  // still running when the session stopped
      OpRecord r{p.op, category_of(p.op), p.device};
      if (p.device.is_cpu()) {
        r.start_ms = std::chrono::duration<double, std::milli>(p.t0 - t0_).count();
        r.ms = std::chrono::duration<double, std::milli>(p.t1 - p.t0).count();
      } else {
        void*& f = first.try_emplace(p.device.index, p.ev0).first->second;
        r.start_ms = b.event_elapsed_ms(f, p.ev0);
        r.ms = b.event_elapsed_ms(p.ev0, p.ev1);
      }
      records_.push_back(std::move(r));
    }
    release_events();
  }

  bool stopped() const { return stopped_; }
  // The ops in the order they began (after stop()).
  const std::vector<OpRecord>& records() const { return records_; }
  // Host time from the session's start to stop().
  double wall_ms() const { return wall_ms_; }

  // Totals by op name or by category: calls and ms, largest first.
  struct Total {
    std::string name;
    long calls = 0;
    double ms = 0;
  };
  std::vector<Total> totals(bool by_category) const {
    std::map<std::string, Total> m;
    for (const OpRecord& r : records_) {
      const std::string& key = by_category ? r.category : r.op;
      Total& t = m.try_emplace(key, Total{key}).first->second;
      ++t.calls;
      t.ms += r.ms;
    }
    std::vector<Total> v;
    for (auto& [k, t] : m) v.push_back(t);
    std::sort(v.begin(), v.end(), [](const Total& a, const Total& b) { return a.ms > b.ms; });
    return v;
  }
  double recorded_ms() const {
    double s = 0;
    for (const OpRecord& r : records_) s += r.ms;
    return s;
  }

  // The table: by category, then by op (calls, total, mean, share of the recorded time).
  std::string table() const {
    std::ostringstream o;
    const double all = recorded_ms();
    const auto rows = [&](const char* title, const std::vector<Total>& v) {
      o << std::left << std::setw(44) << title << std::right << std::setw(8) << "calls" << std::setw(12) << "total ms"
        << std::setw(11) << "mean ms" << std::setw(8) << "share" << "\n";
      for (const Total& t : v)
        o << std::left << std::setw(44) << t.name << std::right << std::setw(8) << t.calls << std::fixed
          << std::setprecision(3) << std::setw(12) << t.ms << std::setw(11) << t.ms / static_cast<double>(t.calls)
          << std::setprecision(1) << std::setw(7) << (all > 0 ? 100.0 * t.ms / all : 0.0) << "%\n";
    };
    rows("category", totals(true));
    o << "\n";
    rows("op", totals(false));
    o << std::fixed << std::setprecision(3) << "\nrecorded " << records_.size() << " ops, " << all
      << " ms of op time; the session's host time " << wall_ms_ << " ms\n";
    return o.str();
  }

  nlohmann::json json() const {
    nlohmann::json j;
    j["wall_ms"] = wall_ms_;
    j["recorded_ms"] = recorded_ms();
    j["ops_recorded"] = records_.size();
    for (const bool cat : {true, false}) {
      nlohmann::json& a = j[cat ? "categories" : "ops"] = nlohmann::json::array();
      for (const Total& t : totals(cat)) a.push_back({{"name", t.name}, {"calls", t.calls}, {"total_ms", t.ms}});
    }
    return j;
  }

  // Chrome's trace event format: one complete event ("ph": "X") per op, µs, a row per device.
  nlohmann::json chrome_trace() const {
    nlohmann::json ev = nlohmann::json::array();
    for (const OpRecord& r : records_) {
      std::ostringstream dev;
      dev << r.device;
      ev.push_back({{"name", r.op}, {"cat", r.category}, {"ph", "X"}, {"ts", r.start_ms * 1000.0},
                    {"dur", r.ms * 1000.0}, {"pid", 0}, {"tid", dev.str()}});
    }
    return {{"traceEvents", ev}, {"displayTimeUnit", "ms"}};
  }

  void write_json(const std::filesystem::path& path) const {
    files::write_atomically(path, json().dump(2) + "\n", "profile::Session::write_json");
  }
  void write_chrome_trace(const std::filesystem::path& path) const {
    files::write_atomically(path, chrome_trace().dump() + "\n", "profile::Session::write_chrome_trace");
  }

 private:
  friend class OpScope;
  void release_events() noexcept {
    const cutrain::detail::DeviceBackend& b = cutrain::detail::device_backend_slot();
    for (detail::Pending& p : pending_) {
      if (p.ev0 && b.event_release) b.event_release(p.device.index, p.ev0);
      if (p.ev1 && b.event_release) b.event_release(p.device.index, p.ev1);
      p.ev0 = p.ev1 = nullptr;
    }
  }

  std::chrono::steady_clock::time_point t0_{};
  std::vector<detail::Pending> pending_;
  std::vector<OpRecord> records_;
  double wall_ms_ = 0;
  bool stopped_ = false;
};

// Times one op while a session records on this thread (dispatch and the optimizers make one).
class OpScope {
 public:
  OpScope(std::string_view op, Device dev) {
    detail::ThreadState& s = detail::thread_state();
    if (s.active == nullptr) return;
    if (s.depth == 0) {  // not inside another op (whose time counts this one's)
      Session& a = *s.active;
      if (dev.is_cpu()) {
        a.pending_.push_back({std::string(op), dev, nullptr, nullptr, std::chrono::steady_clock::now(), {}});
        index_ = static_cast<long>(a.pending_.size()) - 1;
      } else if (const auto& b = cutrain::detail::device_backend_slot();
                 b.event_record && !cutrain::detail::device_capturing()) {
        a.pending_.push_back({std::string(op), dev, b.event_record(dev.index), nullptr, {}, {}});
        index_ = static_cast<long>(a.pending_.size()) - 1;
      }
      session_ = &a;
    }
    ++s.depth;  // only once nothing above can throw: the destructor undoes it
    armed_ = true;
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
  ~OpScope() {
    if (!armed_) return;
    detail::ThreadState& s = detail::thread_state();
    --s.depth;
    if (index_ < 0 || s.active != session_) return;
    detail::Pending& p = session_->pending_[static_cast<std::size_t>(index_)];
    if (p.device.is_cpu()) {
      p.t1 = std::chrono::steady_clock::now();
      return;
    }
    try {  // a destructor does not throw (after a CUDA error, say): the op is then not recorded
      p.ev1 = cutrain::detail::device_backend_slot().event_record(p.device.index);
    } catch (...) {
    }
  }

 private:
  bool armed_ = false;
  long index_ = -1;
  Session* session_ = nullptr;
};

namespace detail {
// from_env's session: reports when it ends.
class EnvSession final : public Session {
 public:
  ~EnvSession() override {
    try {
      stop();
      std::fprintf(stderr, "\n== cutrain profile (CUTRAIN_PROFILE=1)\n%s", table().c_str());
      if (const std::string dir = config()->profile_dir; !dir.empty()) {
        const std::filesystem::path d(dir);
        std::filesystem::create_directories(d);
        write_json(d / "profile.json");
        write_chrome_trace(d / "trace.json");
        std::fprintf(stderr, "profile written to %s (profile.json, trace.json)\n", dir.c_str());
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "cutrain profile: %s\n", e.what());
    }
  }
};
}  // namespace detail

inline std::unique_ptr<Session> Session::from_env() {
  if (!config()->profile) return nullptr;
  return std::make_unique<detail::EnvSession>();
}

}  // namespace cutrain::inline CUTRAIN_ABI::profile
