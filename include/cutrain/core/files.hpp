// Files cutrain keeps between runs: where its caches live, and writing a file so that a reader,
// or a crash, sees the old file or the new one and never part of one. The autotune cache, the
// kernel and plan caches and checkpoints all go through here.
#pragma once

#include "cutrain/core/abi.hpp"

#include <fcntl.h>
#ifdef _WIN32
#include <io.h>
#include <process.h>
#include <sys/stat.h>
#else
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <source_location>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "cutrain/core/config.hpp"
#include "cutrain/core/error.hpp"

namespace cutrain::inline CUTRAIN_ABI::files {

// Where a cache named `name` (a file or a directory) lives: `chosen` (the Config field that names
// it, such as config()->kernel_cache) when not empty; else $XDG_CACHE_HOME/cutrain/<name> when
// XDG_CACHE_HOME is an absolute path (the XDG spec says to ignore a relative one); else
// $HOME/.cache/cutrain/<name> (both as config() read them); else empty: there is nowhere to keep
// it, and the caller keeps the cache in memory only.
inline std::filesystem::path cache_path(std::string_view chosen, std::string_view name) {
  if (!chosen.empty()) return std::filesystem::path(chosen);
  const auto c = config();
  if (!c->xdg_cache_home.empty() && std::filesystem::path(c->xdg_cache_home).is_absolute())
    return std::filesystem::path(c->xdg_cache_home) / "cutrain" / name;
  if (!c->home.empty()) return std::filesystem::path(c->home) / ".cache" / "cutrain" / name;
  return {};
}

inline std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// A file that could not be written. what() is "cutrain::<op>: <path>: <reason> (file:line)";
// path() and reason() give the parts, for a caller that reports the failure as a warning.
class FileError : public IoError {
 public:
  FileError(std::string_view op, std::filesystem::path path, std::string reason,
            std::source_location where = std::source_location::current())
      : IoError(op, cutrain::detail::cat(path.string(), ": ", reason), where),
        path_(std::move(path)), reason_(std::move(reason)) {}
  const std::filesystem::path& path() const noexcept { return path_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::filesystem::path path_;
  std::string reason_;
};

namespace detail {
#ifdef _WIN32
inline int open_new(const char* p) {
  return ::_open(p, _O_WRONLY | _O_CREAT | _O_EXCL | _O_BINARY, _S_IREAD | _S_IWRITE);
}
inline long write_some(int fd, const char* p, std::size_t n) {
  return ::_write(fd, p, static_cast<unsigned>(std::min<std::size_t>(n, 1u << 30)));
}
inline int sync(int fd) { return ::_commit(fd); }
inline int close(int fd) { return ::_close(fd); }
inline std::uint64_t process_id() { return static_cast<std::uint64_t>(::_getpid()); }
inline void sync_directory(const std::filesystem::path&) {}  // Windows cannot fsync a directory
#else
inline int open_new(const char* p) { return ::open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666); }
inline long write_some(int fd, const char* p, std::size_t n) { return ::write(fd, p, n); }
inline int sync(int fd) { return ::fsync(fd); }
inline int close(int fd) { return ::close(fd); }
inline std::uint64_t process_id() { return static_cast<std::uint64_t>(::getpid()); }
// Makes a rename durable. Best effort: some file systems refuse fsync on a directory, and the
// data is safe under one of the two names either way.
inline void sync_directory(const std::filesystem::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  (void)::close(fd);
}
#endif
}  // namespace detail

// A file written under a temporary name beside `path` (path.tmp-<pid>-<n>, created exclusively,
// so never someone else's file) and renamed over `path` by commit(), after an fsync; the
// directory is then synced too. Until commit() `path` keeps what it held; a process killed
// before it leaves at worst the temporary file, which nothing reads. Without commit() the
// destructor removes the temporary file. Every failure is a FileError naming `path` and the
// system's reason, thrown as `op` (the caller's name, such as "Checkpoint::save").
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path, std::string op = "files::AtomicFile")
      : path_(std::move(path)), op_(std::move(op)) {
    static std::atomic<std::uint64_t> counter{0};  // separates threads; the pid separates processes
    tmp_ = path_;
    tmp_ += cutrain::detail::cat(".tmp-", detail::process_id(), "-", counter.fetch_add(1, std::memory_order_relaxed));
    fd_ = detail::open_new(tmp_.string().c_str());
    if (fd_ < 0) {
      const int err = errno;
      const auto dir = path_.parent_path();
      fail(cutrain::detail::cat("cannot create a temp file in ", dir.empty() ? "." : dir.string(), ": ",
                                errno_text(err)));
    }
    buffer_.reserve(buffer_bytes);
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() {
    if (fd_ >= 0) (void)detail::close(fd_);
    if (!committed_) {
      std::error_code ignored;
      std::filesystem::remove(tmp_, ignored);
    }
  }

  const std::filesystem::path& path() const noexcept { return path_; }

  void write(const void* data, std::size_t n) {
    const char* p = static_cast<const char*>(data);
    if (buffer_.size() + n <= buffer_bytes) {
      buffer_.append(p, n);
      return;
    }
    flush();
    if (n < buffer_bytes) buffer_.append(p, n);
    else write_through(p, n);
  }
  void write(std::string_view s) { write(s.data(), s.size()); }

  // Flushes the file to disk, renames it over path and syncs the directory.
  void commit() {
    flush();
    if (detail::sync(fd_) != 0) fail(cutrain::detail::cat("fsync failed: ", errno_text(errno)));
    const int closed = detail::close(fd_);
    fd_ = -1;
    if (closed != 0) fail(cutrain::detail::cat("close failed: ", errno_text(errno)));
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec) fail(cutrain::detail::cat("cannot rename the temp file over it: ", ec.message()));
    committed_ = true;
    detail::sync_directory(path_.parent_path());
  }

 private:
  static constexpr std::size_t buffer_bytes = std::size_t{1} << 16;

  [[noreturn]] void fail(std::string reason) const { throw FileError(op_, path_, std::move(reason)); }
  void flush() {
    write_through(buffer_.data(), buffer_.size());
    buffer_.clear();
  }
  void write_through(const char* p, std::size_t n) {
    while (n > 0) {
      const long done = detail::write_some(fd_, p, n);
      if (done < 0 && errno == EINTR) continue;
      if (done <= 0) fail(cutrain::detail::cat("write failed: ", done < 0 ? errno_text(errno) : "no progress"));
      p += done;
      n -= static_cast<std::size_t>(done);
    }
  }

  std::filesystem::path path_, tmp_;
  std::string op_;
  std::string buffer_;
  int fd_ = -1;
  bool committed_ = false;
};

// The whole of `bytes` as path's new content, through an AtomicFile.
inline void write_atomically(const std::filesystem::path& path, std::string_view bytes,
                             std::string op = "files::write_atomically") {
  AtomicFile f(path, std::move(op));
  f.write(bytes);
  f.commit();
}

}  // namespace cutrain::inline CUTRAIN_ABI::files
