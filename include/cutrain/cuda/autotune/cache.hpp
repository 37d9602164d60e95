// The autotuner's persistent cache: an op signature on a given GPU and library version -> the
// fastest engine (id and knobs, never a plan index) or cuBLASLt algorithm, kept in one JSON file
// that every process on the machine shares. Plain C++ with no CUDA header, so that the file logic
// is tested on machines without a GPU.
//
// The file is a help, never a hazard: a corrupt, foreign or unwritable file becomes one warning
// and an empty cache, and no call here fails a run because of it.
#pragma once

#include "cutrain/core/abi.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cutrain/core/error.hpp"
#include "cutrain/core/files.hpp"
#include "cutrain/core/json.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::autotune {

// What makes a timing valid only on this machine: a choice tuned on another GPU, or with other
// cuDNN / cudnn-frontend versions, may be slow or no longer exist.
struct Environment {
  std::string gpu_name;            // cudaDeviceProp::name
  int sm_count = 0;                // multiprocessors: a cut-down part of the same name tunes differently
  std::string compute_capability;  // "9.0"
  std::int64_t cudnn_version = 0;  // cudnnGetVersion()
  std::int64_t frontend_version = 0;
  bool operator==(const Environment&) const = default;
};

struct Key {
  std::string op;         // "conv2d.fprop", "conv2d.dgrad+relu_bwd", "linear.fwd+relu"
  std::string signature;  // shapes, strides, dtypes, params, epilogue, alignment: built by the caller
  std::string library;    // "cudnn" or "cublaslt"
  std::string gpu_name;
  int sm_count = 0;
  std::string compute_capability;
  std::int64_t cudnn_version = 0;
  std::int64_t frontend_version = 0;

  static Key make(std::string op, std::string signature, std::string library, const Environment& env) {
    return {std::move(op), std::move(signature), std::move(library), env.gpu_name, env.sm_count,
            env.compute_capability, env.cudnn_version, env.frontend_version};
  }
  Environment environment() const {
    return {gpu_name, sm_count, compute_capability, cudnn_version, frontend_version};
  }

  // One line, every field, '|' between them; '\', '|' and control characters are escaped so that
  // two different keys never have the same text. The file is sorted by it.
  std::string text() const {
    std::string t;
    const auto field = [&t](std::string_view s) {
      constexpr char hex[] = "0123456789abcdef";
      for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '\\' || c == '|') {
          t += '\\';
          t += ch;
        } else if (c < 0x20 || c == 0x7f) {
          t += "\\x";
          t += hex[c >> 4];
          t += hex[c & 15];
        } else {
          t += ch;
        }
      }
      t += '|';
    };
    field(library);
    field(op);
    field(signature);
    field(gpu_name);
    t += cutrain::detail::cat(sm_count, '|');
    field(compute_capability);
    t += cutrain::detail::cat(cudnn_version, '|', frontend_version);
    return t;
  }

  bool operator==(const Key&) const = default;
};

inline bool same_environment(const Key& key, const Environment& env) { return key.environment() == env; }

// A knob's type is a cudnn_frontend::KnobType_t where cudnn-frontend names the backend's knob
// type, else raw_knob_type_base plus the cuDNN backend type (cudnnBackendKnobType_t): engines
// that still report knobs the frontend dropped (SPLIT_K, KBLOCK, LDGC, ...) are replayed too.
inline constexpr std::int64_t raw_knob_type_base = 2000;

struct Knob {
  std::int64_t type = 0;  // see raw_knob_type_base
  std::int64_t value = 0;
  bool operator==(const Knob&) const = default;
};

struct RunnerUp {
  std::int64_t engine_id = 0;
  std::vector<Knob> knobs;
  double median_ms = 0;
  bool operator==(const RunnerUp&) const = default;
};

// What tuning found. An engine id and knobs rebuild the same plan in any later process, where a
// plan index would point at whatever the heuristics list happens to hold that day.
struct Choice {
  std::int64_t engine_id = 0;
  std::vector<Knob> knobs;
  double median_ms = 0;
  std::int64_t workspace_bytes = 0;
  double heuristic_ms = -1;  // the heuristics' first choice, timed the same way; -1: unknown
  int candidates_tried = 0;
  int candidates_failed = 0;
  double tuning_ms = 0;  // wall time the tuning took
  std::optional<RunnerUp> runner_up;
  std::string algo;  // cuBLASLt: the opaque cublasLtMatmulAlgo_t bytes as lowercase hex; empty for cuDNN
  bool operator==(const Choice&) const = default;
};

// Lowercase hex of n bytes, and back (false when s is not exactly 2n hex digits).
inline std::string hex_encode(const void* data, std::size_t n) {
  constexpr char hex[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    const auto b = static_cast<const unsigned char*>(data)[i];
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}
inline bool hex_decode(std::string_view s, void* out, std::size_t n) {
  const auto digit = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  if (s.size() != 2 * n) return false;
  for (std::size_t i = 0; i < n; ++i) {
    const int hi = digit(s[2 * i]), lo = digit(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    static_cast<unsigned char*>(out)[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

namespace detail {
using cutrain::detail::cat;

// Why a key or choice cannot be stored; empty when it can. Applied to inserts and to file entries.
inline std::string problem(const Key& k) {
  if (k.op.empty()) return "the key has an empty op";
  // Caught here, not in save(): a key the file cannot hold would make every later save fail.
  const std::pair<const char*, const std::string*> fields[] = {
      {"op", &k.op}, {"signature", &k.signature}, {"gpu_name", &k.gpu_name},
      {"compute_capability", &k.compute_capability}};
  for (const auto& [name, s] : fields)
    if (const auto why = json::utf8_problem(*s); !why.empty())
      return cat("key field ", name, " is not valid UTF-8: ", why);
  if (k.library != "cudnn" && k.library != "cublaslt")
    return cat("library \"", k.library, "\" is not cudnn or cublaslt");
  return {};
}
inline std::string problem(const Choice& c) {
  const auto time = [](double ms) { return std::isfinite(ms) && ms >= 0; };
  if (!time(c.median_ms)) return cat("median_ms ", c.median_ms, " is not a finite time >= 0");
  if (!time(c.heuristic_ms) && c.heuristic_ms != -1)
    return cat("heuristic_ms ", c.heuristic_ms, " is neither a time nor -1");
  if (!time(c.tuning_ms)) return cat("tuning_ms ", c.tuning_ms, " is not a finite time >= 0");
  if (c.runner_up && !time(c.runner_up->median_ms))
    return cat("runner-up median_ms ", c.runner_up->median_ms, " is not a time");
  if (c.workspace_bytes < 0) return cat("workspace_bytes ", c.workspace_bytes, " is negative");
  if (c.candidates_tried < 0 || c.candidates_failed < 0) return "negative candidate counts";
  if (c.algo.find_first_not_of("0123456789abcdef") != std::string::npos || c.algo.size() % 2)
    return "algo is not lowercase hex bytes";
  return {};
}

inline json::Value to_json(const std::vector<Knob>& knobs) {
  json::Value a = json::Value::array();
  for (const auto& k : knobs) a.push_back(json::Value::array({k.type, k.value}));
  return a;
}
inline json::Value to_json(const Key& k) {
  return json::Value::object({{"library", k.library},
                              {"op", k.op},
                              {"signature", k.signature},
                              {"gpu_name", k.gpu_name},
                              {"sm_count", k.sm_count},
                              {"compute_capability", k.compute_capability},
                              {"cudnn_version", k.cudnn_version},
                              {"frontend_version", k.frontend_version}});
}
inline json::Value to_json(const Choice& c) {
  json::Value v = json::Value::object({{"engine_id", c.engine_id},
                                       {"knobs", to_json(c.knobs)},
                                       {"median_ms", c.median_ms},
                                       {"workspace_bytes", c.workspace_bytes},
                                       {"heuristic_ms", c.heuristic_ms},
                                       {"candidates_tried", c.candidates_tried},
                                       {"candidates_failed", c.candidates_failed},
                                       {"tuning_ms", c.tuning_ms}});
  if (c.runner_up)
    v["runner_up"] = json::Value::object({{"engine_id", c.runner_up->engine_id},
                                          {"knobs", to_json(c.runner_up->knobs)},
                                          {"median_ms", c.runner_up->median_ms}});
  if (!c.algo.empty()) v["algo"] = c.algo;
  return v;
}

// The from_json functions throw cutrain::Error (InvalidArgument) naming the field that is wrong.
inline int to_int(const json::Value& v, const char* name) {
  const std::int64_t i = json::as_int(v);
  CUTRAIN_REQUIRE(i >= INT32_MIN && i <= INT32_MAX, InvalidArgument, "autotune::Cache", name, " out of range");
  return static_cast<int>(i);
}
inline std::vector<Knob> knobs_from_json(const json::Value& v) {
  std::vector<Knob> knobs;
  for (const auto& k : json::as_array(v)) {
    const auto& pair = json::as_array(k);
    CUTRAIN_REQUIRE(pair.size() == 2, InvalidArgument, "autotune::Cache", "a knob is not [type, value]");
    knobs.push_back({json::as_int(pair[0]), json::as_int(pair[1])});
  }
  return knobs;
}
inline Key key_from_json(const json::Value& v) {
  const auto text = [&v](const char* name) { return json::as_string(json::at(v, name)); };
  const auto integer = [&v](const char* name) { return json::as_int(json::at(v, name)); };
  Key k{text("op"),
        text("signature"),
        text("library"),
        text("gpu_name"),
        to_int(json::at(v, "sm_count"), "sm_count"),
        text("compute_capability"),
        integer("cudnn_version"),
        integer("frontend_version")};
  const std::string why = problem(k);
  CUTRAIN_REQUIRE(why.empty(), InvalidArgument, "autotune::Cache", why);
  return k;
}
inline Choice choice_from_json(const json::Value& v) {
  const auto time = [&v](const char* name) { return json::as_double(json::at(v, name)); };
  Choice c;
  c.engine_id = json::as_int(json::at(v, "engine_id"));
  c.knobs = knobs_from_json(json::at(v, "knobs"));
  c.median_ms = time("median_ms");
  c.workspace_bytes = json::as_int(json::at(v, "workspace_bytes"));
  c.heuristic_ms = time("heuristic_ms");
  c.candidates_tried = to_int(json::at(v, "candidates_tried"), "candidates_tried");
  c.candidates_failed = to_int(json::at(v, "candidates_failed"), "candidates_failed");
  c.tuning_ms = time("tuning_ms");
  if (const auto* r = json::find(v, "runner_up"); r && !r->is_null())
    c.runner_up = RunnerUp{json::as_int(json::at(*r, "engine_id")), knobs_from_json(json::at(*r, "knobs")),
                           json::as_double(json::at(*r, "median_ms"))};
  if (const auto* a = json::find(v, "algo")) c.algo = json::as_string(*a);
  const std::string why = problem(c);
  CUTRAIN_REQUIRE(why.empty(), InvalidArgument, "autotune::Cache", why);
  return c;
}

using files::errno_text;

// An advisory lock (flock) on a sibling file, held while one process reads, merges and writes the
// cache. Polled with a deadline: a stuck process elsewhere costs a warning, never a hang.
class FileLock {
 public:
  explicit FileLock(const std::filesystem::path& path, std::chrono::milliseconds patience = std::chrono::seconds(30)) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      error_ = cat("cannot open the lock file ", path.string(), ": ", errno_text(errno));
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + patience;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err != EWOULDBLOCK || std::chrono::steady_clock::now() > deadline) {
        error_ = err == EWOULDBLOCK ? cat(path.string(), " stayed locked by another process")
                                    : cat("cannot lock ", path.string(), ": ", errno_text(err));
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    locked_ = true;
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool locked() const { return locked_; }
  const std::string& error() const { return error_; }

 private:
  int fd_ = -1;
  bool locked_ = false;
  std::string error_;
};

}  // namespace detail

// Thread-safe. Lookups happen when an op's plan is first built, not per launch, so one mutex is
// enough. Two processes that save at once both keep their entries (see save()).
class Cache {
 public:
  using WarningSink = std::function<void(const std::string&)>;
  static constexpr std::string_view format_tag = "cutrain-autotune";
  static constexpr std::int64_t format_version = 1;

  // An empty path gives a cache held in memory only.
  explicit Cache(std::filesystem::path path) : path_(std::move(path)) {}

  // $CUTRAIN_AUTOTUNE_CACHE, else autotune.json in cutrain's cache directory (files::cache_path);
  // empty (memory only) when there is none.
  static std::filesystem::path default_path() { return files::cache_path("CUTRAIN_AUTOTUNE_CACHE", "autotune.json"); }

  const std::filesystem::path& path() const noexcept { return path_; }

  // find() returns only entries tuned in this environment; the others stay in the file.
  void set_environment(Environment env) {
    std::lock_guard lock(mutex_);
    env_ = std::move(env);
  }
  Environment environment() const {
    std::lock_guard lock(mutex_);
    return env_;
  }
  // Where warnings go (default: one line on std::cerr); an empty function drops them. It is called
  // with no lock held, possibly from several threads.
  void set_warning_sink(WarningSink sink) {
    std::lock_guard lock(mutex_);
    sink_ = std::move(sink);
  }

  std::optional<Choice> find(const Key& key) {
    std::unique_lock lock(mutex_);
    load_once();
    std::optional<Choice> found;
    if (same_environment(key, env_))
      if (const auto it = map_.find(key.text()); it != map_.end()) found = it->second.choice;
    emit_warnings(lock);
    return found;
  }

  // Throws InvalidArgument for a choice no file could hold (NaN times, a bad library name...):
  // that is a bug in the caller, not a problem with the file.
  void insert(const Key& key, const Choice& choice) {
    for (const auto& why : {detail::problem(key), detail::problem(choice)})
      CUTRAIN_REQUIRE(why.empty(), InvalidArgument, "autotune::Cache::insert", why, " (key ", key.text(), ")");
    std::unique_lock lock(mutex_);
    load_once();
    json::Value raw = json::Value::object({{"key", detail::to_json(key)}, {"choice", detail::to_json(choice)}});
    map_[key.text()] = Entry{key, choice, std::move(raw), true};
    emit_warnings(lock);
  }

  // Under the lock file: reads the file as it is now, merges, writes a temp file, renames it over.
  // Merge order, later wins: entries this cache read earlier < the file now < entries inserted here
  // since the last save. So entries other processes wrote are kept, and what this process tuned
  // wins over the same key on disk. Failures are warnings; unsaved inserts stay for the next save.
  void save() {
    std::unique_lock lock(mutex_);
    if (!path_.empty()) {
      try {
        save_locked();
      } catch (const std::exception& e) {  // out of memory, a filesystem exception: still only a warning
        warn(detail::cat(path_.string(), ": not saved: ", e.what()));
      }
    }
    emit_warnings(lock);
  }

  std::size_t size() {
    std::unique_lock lock(mutex_);
    load_once();
    const std::size_t n = map_.size();
    emit_warnings(lock);
    return n;
  }

  // Every entry, of every environment, in file order.
  std::vector<std::pair<Key, Choice>> entries() {
    std::unique_lock lock(mutex_);
    load_once();
    std::vector<std::pair<Key, Choice>> all;
    for (const auto& [text, e] : map_) all.emplace_back(e.key, e.choice);
    emit_warnings(lock);
    return all;
  }

  // Forgets the entries in memory, unsaved inserts included. The file is untouched, and read
  // again only by the next save().
  void clear() {
    std::lock_guard lock(mutex_);
    map_.clear();
    loaded_ = true;
  }

 private:
  struct Entry {
    Key key;
    Choice choice;
    json::Value raw;  // written back as read, so fields a newer writer added survive
    bool unsaved = false;
  };
  using Map = std::map<std::string, Entry>;  // by key text: the file's order

  void load_once() {
    if (loaded_) return;
    loaded_ = true;
    for (auto& [text, e] : read_file())
      if (!map_.contains(text)) map_.emplace(text, std::move(e));  // inserts made before the load win
  }

  void save_locked() {
    std::error_code ec;
    if (const auto dir = path_.parent_path(); !dir.empty()) {
      std::filesystem::create_directories(dir, ec);
      if (ec) return warn(detail::cat(path_.string(), ": not saved: cannot create ", dir.string(), ": ", ec.message()));
    }
    const detail::FileLock file_lock(path_.string() + ".lock");
    if (!file_lock.locked()) return warn(detail::cat(path_.string(), ": not saved: ", file_lock.error()));
    Map merged;
    for (const auto& [text, e] : map_)
      if (!e.unsaved) merged.emplace(text, e);
    for (auto& [text, e] : read_file()) merged.insert_or_assign(text, std::move(e));
    for (const auto& [text, e] : map_)
      if (e.unsaved) merged.insert_or_assign(text, Entry{e.key, e.choice, e.raw, false});
    json::Value list = json::Value::array();
    for (const auto& [text, e] : merged) list.push_back(e.raw);
    const json::Value doc =
        json::Value::object({{"format", format_tag}, {"version", format_version}, {"entries", std::move(list)}});
    try {
      files::write_atomically(path_, json::dump(doc, 2) + "\n", "autotune::Cache::save");
    } catch (const files::FileError& e) {
      return warn(detail::cat(path_.string(), ": not saved: ", e.reason()));
    }
    map_ = std::move(merged);
    loaded_ = true;
  }

  // The entries in the file now: none, without a warning, when there is no file; none, with one
  // warning, when it cannot be read or is not a valid cache file.
  Map read_file() {
    Map map;
    if (path_.empty()) return map;
    const std::string name = path_.string();
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno != ENOENT && errno != ENOTDIR)
        warn(detail::cat(name, ": cannot be read: ", detail::errno_text(errno), "; ignored"));
      return map;
    }
    std::string text;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (std::int64_t{1} << 28)) {
      ::close(fd);
      warn(detail::cat(name, ": not a regular file of a plausible size; ignored"));
      return map;
    }
    char buf[1 << 16];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) text.append(buf, static_cast<std::size_t>(n));
      else if (n == 0 || errno != EINTR) break;
    }
    ::close(fd);
    if (text.empty()) {
      warn(detail::cat(name, ": the file is empty; ignored"));
      return map;
    }
    json::Value doc;
    try {
      doc = json::parse(text);
    } catch (const json::ParseError& e) {
      warn(detail::cat(name, ": corrupt (not valid JSON: ", e.reason(), "); ignored"));
      return map;
    }
    const json::Value* format = doc.is_object() ? json::find(doc, "format") : nullptr;
    if (!format || !format->is_string() || json::as_string(*format) != format_tag) {
      warn(detail::cat(name, ": not a cutrain autotune cache (no \"format\": \"", format_tag, "\"); ignored"));
      return map;
    }
    const json::Value* version = json::find(doc, "version");
    if (!version || !version->is_number_integer() || json::as_int(*version) != format_version) {
      warn(detail::cat(name, ": format version ", version ? json::dump(*version, 0) : "missing",
                       " is not the version this build reads (", format_version, "); ignored"));
      return map;
    }
    const json::Value* list = json::find(doc, "entries");
    if (!list || !list->is_array()) {
      warn(detail::cat(name, ": corrupt (\"entries\" is not an array); ignored"));
      return map;
    }
    // One bad entry (edited by hand, say) costs that entry, not the whole file.
    std::size_t bad = 0;
    std::string first_problem;
    for (const auto& item : *list) {
      try {
        Key key = detail::key_from_json(json::at(item, "key"));
        Choice choice = detail::choice_from_json(json::at(item, "choice"));
        std::string text_key = key.text();
        map.insert_or_assign(std::move(text_key), Entry{std::move(key), std::move(choice), item, false});
      } catch (const cutrain::Error& e) {
        if (bad++ == 0) first_problem = e.what();
      }
    }
    if (bad)
      warn(detail::cat(name, ": ", bad, " malformed entr", bad == 1 ? "y" : "ies", " ignored (", first_problem, ")"));
    return map;
  }

  // Queued under the lock, handed to the sink after it. A message already given is not repeated:
  // a file found corrupt by find() and again by save() is one warning, and a cache directory that
  // cannot be written does not print a line per save.
  void warn(std::string message) {
    if (warned_.insert(message).second) queued_.push_back(std::move(message));
  }
  void emit_warnings(std::unique_lock<std::mutex>& lock) {
    if (queued_.empty()) return;
    auto messages = std::move(queued_);
    queued_.clear();
    auto sink = sink_;
    lock.unlock();
    if (sink)
      for (const auto& m : messages) sink(m);
  }

  const std::filesystem::path path_;
  mutable std::mutex mutex_;
  Environment env_;
  Map map_;
  bool loaded_ = false;
  WarningSink sink_ = [](const std::string& m) { std::cerr << "cutrain: autotune cache: " << m << std::endl; };
  std::set<std::string> warned_;
  std::vector<std::string> queued_;
};

// The process's cache, on default_path(). The autotuner sets its environment and saves it.
inline Cache& global_cache() {
  static Cache cache(Cache::default_path());
  return cache;
}

}  // namespace cutrain::inline CUTRAIN_ABI::cuda::autotune

template <>
struct std::hash<cutrain::cuda::autotune::Key> {
  std::size_t operator()(const cutrain::cuda::autotune::Key& k) const noexcept {
    std::uint64_t h = 0xcbf29ce484222325ull;
    const auto mix = [&h](std::size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    const std::hash<std::string> s;
    const std::hash<std::int64_t> i;
    mix(s(k.op));
    mix(s(k.signature));
    mix(s(k.library));
    mix(s(k.gpu_name));
    mix(i(k.sm_count));
    mix(s(k.compute_capability));
    mix(i(k.cudnn_version));
    mix(i(k.frontend_version));
    return static_cast<std::size_t>(h);
  }
};
