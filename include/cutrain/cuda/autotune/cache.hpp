// The autotuner's persistent cache: an op signature on a given GPU and library version -> the
// fastest engine (id and knobs, never a plan index) or cuBLASLt algorithm, kept in one JSON file
// that every process on the machine shares. Plain C++ with no CUDA header, so that the file logic
// is tested on machines without a GPU.
//
// The file is a help, never a hazard: a corrupt, foreign or unwritable file becomes one warning
// and an empty cache, and no call here fails a run because of it.
#pragma once

#include "cutrain/core/abi.hpp"
#include "cutrain/core/config.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
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
#include "cutrain/cuda/autotune/entry.hpp"

namespace cutrain::inline CUTRAIN_ABI::cuda::autotune {

namespace detail {
using cutrain::detail::cat;

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
  static std::filesystem::path default_path() { return files::cache_path(config()->autotune_cache, "autotune.json"); }

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
