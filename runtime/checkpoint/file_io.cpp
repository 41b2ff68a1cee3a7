#include "runtime/checkpoint/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "core/error.hpp"

namespace zero::checkpoint::io {

namespace fs = std::filesystem;

std::string quote(std::string_view path) { return "'" + std::string(path) + "'"; }

std::string errno_text(int err) {
  char buf[256];
  const char* msg = strerror_r(err, buf, sizeof buf);  // GNU: returns the message pointer
  return std::string(msg) + " (errno " + std::to_string(err) + ")";
}

namespace {
std::string with_hint(std::string msg, std::string_view hint) {
  if (!hint.empty()) msg += "\nHINT: " + std::string(hint);
  return msg;
}
}  // namespace

File File::open_read(const std::string& path, std::string_view what, std::string_view hint) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    ZERO_FAIL(with_hint(
        "cannot open " + std::string(what) + " " + quote(path) + ": " + errno_text(errno), hint));
  return File(fd, path, std::string(what));
}

File File::create(const std::string& path, std::string_view what, std::string_view hint) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    ZERO_FAIL(with_hint(
        "cannot create " + std::string(what) + " " + quote(path) + ": " + errno_text(errno), hint));
  return File(fd, path, std::string(what));
}

File::File(File&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)), what_(std::move(o.what_)) {
  o.fd_ = -1;
}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    what_ = std::move(o.what_);
    o.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t File::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0)
    ZERO_FAIL("cannot stat " + what_ + " " + quote(path_) + ": " + errno_text(errno));
  return static_cast<uint64_t>(st.st_size);
}

void File::write_all(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    // At most 1 GiB per call: Linux writes at most 0x7ffff000 bytes at once anyway.
    const ssize_t w = ::write(fd_, p, bytes < (size_t{1} << 30) ? bytes : (size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0)
      ZERO_FAIL("writing " + what_ + " " + quote(path_) + " failed: " + errno_text(errno) +
                "\nHINT: check the free space and quota of the checkpoint filesystem");
    p += w;
    bytes -= static_cast<size_t>(w);
  }
}

void File::pread_exact(void* data, size_t bytes, uint64_t offset, std::string_view what) const {
  char* p = static_cast<char*>(data);
  uint64_t at = offset;
  size_t left = bytes;
  while (left > 0) {
    const ssize_t r = ::pread(fd_, p, left < (size_t{1} << 30) ? left : (size_t{1} << 30),
                              static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      ZERO_FAIL("reading " + std::string(what) + " of " + what_ + " " + quote(path_) +
                " failed: " + errno_text(errno));
    if (r == 0)
      ZERO_FAIL(what_ + " " + quote(path_) + " is truncated: reading " + std::string(what) +
                " needs bytes [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) +
                ") but the file ends at " + std::to_string(at) +
                "\nHINT: the file was cut short (interrupted copy or full disk); restore it or "
                "load an earlier checkpoint");
    p += r;
    at += static_cast<uint64_t>(r);
    left -= static_cast<size_t>(r);
  }
}

void File::sync() {
  if (::fsync(fd_) != 0)
    ZERO_FAIL("fsync of " + what_ + " " + quote(path_) + " failed: " + errno_text(errno));
}

void File::close() {
  const int fd = fd_;
  fd_ = -1;
  if (fd >= 0 && ::close(fd) != 0)
    ZERO_FAIL("closing " + what_ + " " + quote(path_) + " failed: " + errno_text(errno));
}

bool exists(const std::string& path) noexcept {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) noexcept {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_directories(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec || !is_directory(path))
    ZERO_FAIL("cannot create the directory " + quote(path) + ": " +
              (ec ? ec.message() : std::string("a file of that name exists")) +
              "\nHINT: check that the checkpoint path is writable");
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) ZERO_FAIL("cannot remove " + quote(path) + ": " + ec.message());
}

void rename_path(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0)
    ZERO_FAIL("cannot rename " + quote(from) + " to " + quote(to) + ": " + errno_text(errno));
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) ZERO_FAIL("cannot open the directory " + quote(dir) + ": " + errno_text(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // Some filesystems cannot fsync a directory (EINVAL): their renames are then as durable as
  // they get, which is not an error of ours.
  if (rc != 0 && err != EINVAL)
    ZERO_FAIL("fsync of the directory " + quote(dir) + " failed: " + errno_text(err));
}

std::string parent_dir(const std::string& path) {
  const std::string p = fs::path(path).parent_path().string();
  return p.empty() ? "." : p;
}

void write_file_atomic(const std::string& path, std::string_view contents, std::string_view what) {
  // Unique per process and call: concurrent writers never share a temporary file.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  try {
    File f = File::create(tmp, what);
    f.write_all(contents.data(), contents.size());
    // Flushed before the rename: otherwise a crash could leave the new name on a file whose
    // contents never reached the disk.
    f.sync();
    f.close();
    rename_path(tmp, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_dir(parent_dir(path));
}

std::string read_file(const std::string& path, size_t max_bytes, std::string_view what,
                      std::string_view hint) {
  File f = File::open_read(path, what, hint);
  const uint64_t n = f.size();
  if (n > max_bytes)
    ZERO_FAIL(std::string(what) + " " + quote(path) + " has " + std::to_string(n) +
              " bytes, more than the " + std::to_string(max_bytes) + " expected of it");
  std::string s(static_cast<size_t>(n), '\0');
  f.pread_exact(s.data(), s.size(), 0, "the contents");
  return s;
}

}  // namespace zero::checkpoint::io
