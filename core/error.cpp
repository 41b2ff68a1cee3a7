#include "core/error.hpp"

#include <cstring>

namespace zero {

namespace {
std::string compose(const std::string& library, const std::string& message,
                    const std::string& statement, const std::string& file, int line) {
  std::string s = library == "zero" ? message : library + " error: " + message;
  if (!file.empty()) {
    s += "\n  ";
    if (!statement.empty()) s += "in " + statement + " ";
    s += "at " + file + ":" + std::to_string(line);
  }
  return s;
}
}  // namespace

Error::Error(std::string library, std::string message, std::string statement, std::string file,
             int line)
    : std::runtime_error(compose(library, message, statement, file, line)),
      library_(std::move(library)),
      message_(std::move(message)),
      statement_(std::move(statement)),
      file_(std::move(file)),
      line_(line) {}

namespace detail {

const char* short_path(const char* file) noexcept {
  // Paths are shown relative to the checkout. __FILE__ is absolute (CMake passes absolute
  // paths), so strip the source directory this library was built from; a file compiled
  // elsewhere (another checkout) falls back to the earliest top-level folder name.
#ifdef ZERO_SOURCE_DIR
  static constexpr char source_dir[] = ZERO_SOURCE_DIR "/";
  if (std::strncmp(file, source_dir, sizeof source_dir - 1) == 0) return file + sizeof source_dir - 1;
#endif
  static const char* const roots[] = {"/core/",   "/runtime/", "/collectives/", "/optim/",
                                      "/offload/", "/models/",  "/bench/",       "/tests/"};
  const char* best = nullptr;
  for (const char* r : roots) {
    const char* p = std::strstr(file, r);
    if (p && (!best || p < best)) best = p;
  }
  return best ? best + 1 : file;
}

void throw_error(const char* library, std::string message, const char* statement,
                 const char* file, int line) {
  throw Error(library, std::move(message), statement ? statement : "", short_path(file), line);
}

void throw_errno(int err, const char* statement, const char* file, int line) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may or may not be buf).
  const char* msg = strerror_r(err, buf, sizeof buf);
  std::string text = std::string(msg) + " (errno " + std::to_string(err) + ")";
  throw Error("system", std::move(text), statement, short_path(file), line);
}

}  // namespace detail
}  // namespace zero
