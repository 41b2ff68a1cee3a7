// The one error type of the runtime, and the checked-call macros that produce it.
//
// Every call into a foreign API goes through one macro per API:
//   ZERO_CHECK_SYS(expr)     POSIX calls: -1 (or a null pointer) means failure, errno says why
//   ZERO_CHECK_MPI(expr)     in mpi_check.hpp       (needs <mpi.h>)
//   ZERO_CHECK_CUDA(expr)    in cuda/checks.hpp     (cuda backend only)
//   ZERO_CHECK_CUBLAS(expr)  in cuda/checks.hpp
//   ZERO_CHECK_NCCL(expr)    in cuda/checks.hpp
// and a failure throws zero::Error carrying the library's name, the statement text, file:line
// and the library's own message. what() reads, for example:
//   CUDA error: invalid device ordinal (cudaErrorInvalidDevice)
//     in cudaSetDevice(-1) at core/cuda/device.cpp:42
//
// User-facing errors (bad config, bad flag, bad file) use the same type with library "zero" and
// a message that says what was wrong, where, and what to do; ZERO_FAIL / ZERO_REQUIRE build them.
// Thread-safety: Error is an immutable value; throwing it from any thread is fine.
#pragma once

#include <cerrno>
#include <stdexcept>
#include <string>

namespace zero {

class Error : public std::runtime_error {
 public:
  // library: "CUDA", "cuBLAS", "NCCL", "MPI", "system", or "zero" for our own checks.
  // statement: the source text of the failed call (empty for user-facing errors).
  Error(std::string library, std::string message, std::string statement = {},
        std::string file = {}, int line = 0);

  const std::string& library() const noexcept { return library_; }
  const std::string& message() const noexcept { return message_; }
  const std::string& statement() const noexcept { return statement_; }
  const std::string& file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  std::string library_, message_, statement_, file_;
  int line_;
};

namespace detail {
[[noreturn]] void throw_error(const char* library, std::string message, const char* statement,
                              const char* file, int line);
[[noreturn]] void throw_errno(int err, const char* statement, const char* file, int line);
// Source path relative to the repository root, so messages do not carry the build machine's paths.
const char* short_path(const char* file) noexcept;
}  // namespace detail

}  // namespace zero

// A POSIX-style call failed when it returned -1 (or, for pointer results, null); errno says why.
#define ZERO_CHECK_SYS(expr)                                                        \
  do {                                                                              \
    errno = 0;                                                                      \
    if (!::zero::detail::sys_ok((expr)))                                            \
      ::zero::detail::throw_errno(errno, #expr, __FILE__, __LINE__);                \
  } while (0)

// An internal invariant or a user-facing precondition. msg is any expression convertible to
// std::string; it is evaluated only on failure.
#define ZERO_REQUIRE(cond, msg)                                                     \
  do {                                                                              \
    if (!(cond)) ::zero::detail::throw_error("zero", (msg), #cond, __FILE__, __LINE__); \
  } while (0)

#define ZERO_FAIL(msg) ::zero::detail::throw_error("zero", (msg), "", __FILE__, __LINE__)

namespace zero::detail {
inline bool sys_ok(int rc) noexcept { return rc != -1; }
inline bool sys_ok(long rc) noexcept { return rc != -1; }
inline bool sys_ok(const void* p) noexcept { return p != nullptr; }
}  // namespace zero::detail
