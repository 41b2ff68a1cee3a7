#include "offload/aio_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.hpp"
#include "core/log.hpp"

namespace zero::offload {

namespace {

std::string errno_text(int err) {
  char buf[256];
  const char* msg = strerror_r(err, buf, sizeof buf);  // GNU: may return a static string
  const char* name = nullptr;
  switch (err) {
    case ENOSPC: name = "ENOSPC"; break;
    case EIO: name = "EIO"; break;
    case EROFS: name = "EROFS"; break;
    case EACCES: name = "EACCES"; break;
    case EPERM: name = "EPERM"; break;
    case ENOENT: name = "ENOENT"; break;
    case ENOTDIR: name = "ENOTDIR"; break;
    case EINVAL: name = "EINVAL"; break;
    case EDQUOT: name = "EDQUOT"; break;
    default: break;
  }
  return std::string(msg) + " (" + (name ? name : "errno " + std::to_string(err)) + ")";
}

const char* hint(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return "the drive under nvme_path is full (or the quota is spent): free space there or "
             "point nvme_path at a drive with room for the swapped state";
    case EIO:
      return "the drive or file system reported an I/O error: check the kernel log (dmesg) and "
             "the drive's health; the swap file's contents are not to be trusted";
    case EROFS:
      return "the file system is mounted read-only: point nvme_path at a writable directory";
    case EACCES:
    case EPERM:
      return "this process may not write there: fix the directory's permissions or point "
             "nvme_path at one it owns";
    case ENOENT:
      return "the file or its directory does not exist: create the directory, or fix nvme_path";
    case ENOTDIR:
      return "a component of the path is not a directory: fix nvme_path";
    case EINVAL:
      return "with O_DIRECT, offsets, lengths and buffer addresses must be multiples of 4096 "
             "bytes (see offload/aio_options.hpp)";
    default:
      return "check the path and the drive";
  }
}

}  // namespace

std::string io_error_message(const std::string& path, const std::string& op, int err) {
  return path + ": " + op + " failed: " + errno_text(err) + ". What to do: " + hint(err) + ".";
}

AioFile::AioFile(const std::string& path, Mode mode, bool prefer_direct) : path_(path) {
  int flags = O_CLOEXEC;
  switch (mode) {
    case Mode::read: flags |= O_RDONLY; break;
    case Mode::read_write: flags |= O_RDWR; break;
    case Mode::create: flags |= O_RDWR | O_CREAT | O_TRUNC; break;
  }
  if (prefer_direct) {
    fd_ = ::open(path.c_str(), flags | O_DIRECT, 0600);
    if (fd_ >= 0) {
      direct_ = true;
      return;
    }
    if (errno != EINVAL) ZERO_FAIL(io_error_message(path, "open", errno));
    // EINVAL at open with O_DIRECT: the file system has no direct I/O. Buffered I/O still works,
    // through the page cache (more memory traffic, and the cache holds swapped state).
    log::warn(path + ": the file system refuses O_DIRECT (EINVAL at open); using buffered I/O "
                     "through the page cache for this file");
  }
  fd_ = ::open(path.c_str(), flags, 0600);
  if (fd_ < 0) ZERO_FAIL(io_error_message(path, "open", errno));
}

AioFile::~AioFile() { close(); }

AioFile::AioFile(AioFile&& o) noexcept
    : path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)), direct_(o.direct_) {}

AioFile& AioFile::operator=(AioFile&& o) noexcept {
  if (this != &o) {
    close();
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    direct_ = o.direct_;
  }
  return *this;
}

void AioFile::close() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

uint64_t AioFile::size() const {
  struct stat st{};
  if (::fstat(fd_, &st) != 0) ZERO_FAIL(io_error_message(path_, "fstat", errno));
  return static_cast<uint64_t>(st.st_size);
}

void AioFile::allocate(uint64_t bytes) {
  if (bytes == 0) return;
  // fallocate(2), not posix_fallocate: where the file system cannot reserve space, glibc's
  // emulation writes single bytes, which an O_DIRECT descriptor refuses. No reservation there:
  // a full drive then shows at the first write instead.
  if (::fallocate(fd_, 0, 0, static_cast<off_t>(bytes)) == 0) return;
  if (errno == EOPNOTSUPP) return;
  ZERO_FAIL(io_error_message(path_, "reserving " + std::to_string(bytes) + " bytes", errno));
}

}  // namespace zero::offload
