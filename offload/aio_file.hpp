// AioFile: a file opened for the asynchronous file engine (aio_engine.hpp), with O_DIRECT where
// the file system allows it, and the errno-to-message mapping every I/O failure goes through.
//
// O_DIRECT bypasses the page cache: swapped optimizer state is read once per step and would only
// evict useful pages, and DMA straight into the caller's pinned buffer saves a copy. Some file
// systems refuse it (open fails with EINVAL: ramfs, some FUSE and network file systems, tmpfs
// before Linux 6.6); then the file is opened buffered, which takes any alignment, and one
// warning per file names the path. prefer_direct = false asks for buffered I/O outright.
//
// Ownership: AioFile owns its descriptor (closed by the destructor); movable, not copyable. The
// engine reads the descriptor from any thread while requests are in flight, so an AioFile must
// outlive every request on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zero::offload {

class AioFile {
 public:
  enum class Mode {
    read,         // an existing file, read only
    read_write,   // an existing file
    create,       // created if missing (mode 0600), truncated if present, read and write
  };

  AioFile() = default;
  // Throws zero::Error naming the path for a missing directory, a read-only file system or
  // permission (EROFS/EACCES), a full drive at creation, and any other open failure.
  AioFile(const std::string& path, Mode mode, bool prefer_direct = true);
  ~AioFile();
  AioFile(AioFile&& o) noexcept;
  AioFile& operator=(AioFile&& o) noexcept;
  AioFile(const AioFile&) = delete;
  AioFile& operator=(const AioFile&) = delete;

  int fd() const noexcept { return fd_; }
  bool is_open() const noexcept { return fd_ >= 0; }
  bool direct() const noexcept { return direct_; }
  const std::string& path() const noexcept { return path_; }
  // The file's size in bytes (fstat).
  uint64_t size() const;
  // Reserves [0, bytes) on the drive (posix_fallocate), so a full drive is found now rather than
  // by a write in the middle of a step. ENOSPC and others throw naming the path.
  void allocate(uint64_t bytes);
  void close() noexcept;

 private:
  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
};

// The message of a failed operation on `path`: what failed (op, e.g. "write of 1048576 bytes at
// offset 4096"), the system's words for err, and what to do for the errors a swap directory
// meets (ENOSPC, EIO, EROFS, EACCES, ENOENT, ENOTDIR, EINVAL under O_DIRECT, EDQUOT).
std::string io_error_message(const std::string& path, const std::string& op, int err);

}  // namespace zero::offload
