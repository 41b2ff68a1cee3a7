#include "runtime/train/metrics_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace zero::train {

namespace {

std::string errno_text(int err) {
  char buf[256];
  const char* msg = strerror_r(err, buf, sizeof buf);  // GNU: returns the message
  return std::string(msg) + " (errno " + std::to_string(err) + ")";
}

std::string quoted(const std::string& path) { return "'" + path + "'"; }

const char* const kWriteHint =
    "\nHINT: free space on that file system (or fix the device), or give --metrics a path on "
    "another one; a run with --checkpoint-dir continues from its last checkpoint with --resume";

bool is_regular(int fd) {
  struct stat st {};
  return ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

MetricsFile MetricsFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    ZERO_FAIL("cannot open the metrics file " + quoted(path) + " for appending: " + errno_text(err) +
              "\nHINT: check that its directory exists and is writable (or give --metrics "
              "another path)");
  }
  return MetricsFile(fd, path);
}

MetricsFile::MetricsFile(MetricsFile&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }

MetricsFile& MetricsFile::operator=(MetricsFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

MetricsFile::~MetricsFile() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsFile::append(std::string_view line) {
  ZERO_REQUIRE(fd_ >= 0, "the metrics file " + quoted(path_) + " is closed");
  std::string text(line);
  text.push_back('\n');
  // Where the file ended, to cut a partly written line off again: the file stays whole JSON
  // lines even when the disk fills in the middle of one.
  const bool regular = is_regular(fd_);
  const off_t before = regular ? ::lseek(fd_, 0, SEEK_END) : -1;
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t w = ::write(fd_, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : EIO;
      if (before >= 0 && left != text.size()) (void)::ftruncate(fd_, before);
      ZERO_FAIL("writing the metrics file " + quoted(path_) + " failed: " + errno_text(err) +
                kWriteHint);
    }
    p += w;
    left -= static_cast<size_t>(w);
  }
}

void MetricsFile::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  if (is_regular(fd) && ::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ZERO_FAIL("writing the metrics file " + quoted(path_) + " failed at fsync: " + errno_text(err) +
              kWriteHint);
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ZERO_FAIL("closing the metrics file " + quoted(path_) + " failed: " + errno_text(err) + kWriteHint);
  }
}

}  // namespace zero::train
