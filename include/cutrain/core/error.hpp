// Errors are exceptions whose message names the op, the reason and where it was thrown.
#pragma once

#include "cutrain/core/abi.hpp"
#include "cutrain/core/config.hpp"

#include <algorithm>
#include <charconv>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace cutrain::inline CUTRAIN_ABI {

namespace detail {
// One argument of cat(), appended as `std::ostream << a` would print it. Strings, characters,
// integers and floating-point numbers (%g, the stream's default) are appended directly: cat()
// builds the keys of the GPU graph caches on every op call, and a stream costs microseconds.
// Other types (shapes, enums, ...) go through a stream this thread keeps for it.
template <class A>
void append_streamed(std::string& out, const A& a) {
  thread_local std::ostringstream kept;
  thread_local bool busy = false;  // a type's operator<< may itself call cat()
  if (busy) {
    std::ostringstream os;
    os << a;
    out += os.view();
    return;
  }
  busy = true;
  kept.str(std::string());
  kept.clear();
  kept << a;
  out += kept.view();
  busy = false;
}

template <class A>
void append_one(std::string& out, const A& a) {
  using D = std::remove_cvref_t<A>;
  if constexpr (std::is_same_v<D, char> || std::is_same_v<D, signed char> || std::is_same_v<D, unsigned char>) {
    out += static_cast<char>(a);
  } else if constexpr (std::is_convertible_v<const A&, std::string_view>) {
    out += std::string_view(a);
  } else if constexpr (std::is_same_v<D, bool>) {
    out += a ? '1' : '0';
  } else if constexpr (std::is_integral_v<D>) {
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, a);
    out.append(buf, r.ptr);
  } else if constexpr (std::is_floating_point_v<D>) {
    char buf[32];
    const int n = std::snprintf(buf, sizeof buf, "%g", static_cast<double>(a));
    out.append(buf, static_cast<std::size_t>(std::max(n, 0)));
  } else if constexpr (requires { { to_string(a) } -> std::convertible_to<std::string_view>; }) {
    out += std::string_view(to_string(a));  // cutrain's enums (found by ADL), as their operator<< prints them
  } else if constexpr (requires { { a.str() } -> std::convertible_to<std::string>; }) {
    out += a.str();  // Shape, Device: their operator<< prints str()
  } else {
    append_streamed(out, a);
  }
}

// Every argument in one string, as streamed: cat("shape ", s, " has ", n, " dims").
template <class... Args>
std::string cat(const Args&... args) {
  std::string out;
  out.reserve(64);
  (append_one(out, args), ...);
  return out;
}

// The first line of a library's message, at most about 300 characters: what an error's what()
// shows of it. CUTRAIN_CUDNN_FULL_ERRORS=1 keeps the whole message.
inline std::string first_reason(std::string_view message) {
  if (config()->cudnn_full_errors) return std::string(message);
  constexpr std::size_t most = 300;
  while (!message.empty() && (message.front() == '\n' || message.front() == ' ')) message.remove_prefix(1);
  std::string_view first = message.substr(0, message.find('\n'));
  std::string out(first.substr(0, most));
  if (first.size() > most) out += "...";
  if (first.size() < message.size()) out += " [more in CudnnError::log()]";
  return out;
}

inline std::string_view file_name(const char* path) {
  std::string_view p(path);
  auto slash = p.find_last_of('/');
  return slash == std::string_view::npos ? p : p.substr(slash + 1);
}
}  // namespace detail

class Error : public std::runtime_error {
 public:
  Error(std::string_view op, std::string_view reason,
        std::source_location where = std::source_location::current())
      : std::runtime_error(detail::cat("cutrain::", op, ": ", reason, " (",
                                       detail::file_name(where.file_name()), ":", where.line(), ")")),
        op_(op) {}
  const std::string& op() const noexcept { return op_; }

 private:
  std::string op_;
};

namespace detail {
// e's message without its "cutrain::<op>: " prefix, for a caller that rethrows it inside its own
// context and op (so that the op is named once).
inline std::string reason_of(const Error& e) {
  std::string_view w = e.what();
  const std::string prefix = cat("cutrain::", e.op(), ": ");
  if (w.starts_with(prefix)) w.remove_prefix(prefix.size());
  return std::string(w);
}
}  // namespace detail

// Bad shapes, strides, layouts, parameters or values passed by the caller.
class InvalidArgument : public Error { using Error::Error; };
// Tensors on the wrong device, or a device that is not available in this build.
class DeviceError : public Error { using Error::Error; };
// A combination that cutrain (or the library under it) does not offer.
class NotImplemented : public Error { using Error::Error; };
// An allocation that failed (host memory here; the device backends' own errors say so for theirs).
class OutOfMemory : public Error { using Error::Error; };
// I/O and file format problems (data sets, caches, checkpoints).
class IoError : public Error { using Error::Error; };
// Failures reported by the NVIDIA libraries.
class CudaError : public Error { using Error::Error; };
// A cuDNN failure. what() carries the library's first reason; log() its whole message (for a
// graph no engine supports, every engine's reason: often kilobytes). CUTRAIN_CUDNN_FULL_ERRORS=1
// puts the whole message into what() too.
class CudnnError : public Error {
 public:
  using Error::Error;
  CudnnError(std::string_view op, std::string_view context, std::string_view message,
             std::source_location where = std::source_location::current())
      : Error(op, detail::cat(context, ": ", detail::first_reason(message)), where), log_(message) {}
  const std::string& log() const noexcept { return log_; }

 private:
  std::string log_;
};
class CublasError : public Error { using Error::Error; };
class NvrtcError : public Error { using Error::Error; };

}  // namespace cutrain::inline CUTRAIN_ABI

// Throws ExcType(op, message) when cond is false; the message is only built on failure.
#define CUTRAIN_REQUIRE(cond, ExcType, op, ...)                         \
  do {                                                                  \
    if (!(cond)) throw ExcType((op), ::cutrain::detail::cat(__VA_ARGS__)); \
  } while (0)
