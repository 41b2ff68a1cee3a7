// Private to the stream backends (cpu_stream.cpp, cuda/stream.cpp): the record of a stream's
// first error, shared by that stream, every event recorded after it and every stream that took
// it over by waiting on such an event. See stream.hpp for the error model.
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <string>

namespace zero::detail {

struct StreamFailure {
  StreamFailure(std::exception_ptr e, std::string where)
      : error(std::move(e)), stream(std::move(where)) {}
  const std::exception_ptr error;
  const std::string stream;       // the stream whose task threw
  std::atomic<bool> seen{false};  // rethrown to some caller, or already logged
};

// The exception's what(), for logs.
inline std::string describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception not derived from std::exception";
  }
}

[[noreturn]] inline void rethrow(const std::shared_ptr<StreamFailure>& f) {
  f->seen = true;
  std::rethrow_exception(f->error);
}

}  // namespace zero::detail
