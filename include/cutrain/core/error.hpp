// Errors are exceptions whose message names the op, the reason and where it was thrown.
#pragma once

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace cutrain {

namespace detail {
// Streams every argument into one string: cat("shape ", s, " has ", n, " dims").
template <class... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
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

// Bad shapes, strides, layouts, parameters or values passed by the caller.
class InvalidArgument : public Error { using Error::Error; };
// Tensors on the wrong device, or a device that is not available in this build.
class DeviceError : public Error { using Error::Error; };
// A combination that cutrain (or the library under it) does not offer.
class NotImplemented : public Error { using Error::Error; };
// I/O and file format problems (data sets, caches, checkpoints).
class IoError : public Error { using Error::Error; };
// Failures reported by the NVIDIA libraries.
class CudaError : public Error { using Error::Error; };
class CudnnError : public Error { using Error::Error; };
class CublasError : public Error { using Error::Error; };
class NvrtcError : public Error { using Error::Error; };

}  // namespace cutrain

// Throws ExcType(op, message) when cond is false; the message is only built on failure.
#define CUTRAIN_REQUIRE(cond, ExcType, op, ...)                         \
  do {                                                                  \
    if (!(cond)) throw ExcType((op), ::cutrain::detail::cat(__VA_ARGS__)); \
  } while (0)
