// The metrics file of zero-train: JSON lines appended to one file, written by rank 0.
//
// Why not stdio: fprintf into a FILE* buffers, and a failure (a full disk, /dev/full, an NFS
// server gone, EIO) only sets a flag that nobody reads, so a run could lose every line and still
// exit 0. Here every line is one write(2) of the whole line, checked; close() syncs a regular file
// (write-back errors, e.g. ENOSPC on a delayed allocation or EIO on NFS, surface only at fsync or
// close) and checks close(2). Every failure throws zero::Error naming the file, the system's
// reason (errno text) and what to do.
//
// Lines are appended with O_APPEND, so a resumed run adds after the interrupted one's lines and
// two writers never overwrite each other's bytes.
//
// Ownership and thread-safety: owns its descriptor (the destructor closes it, ignoring errors:
// call close() where they matter). One thread at a time.
#pragma once

#include <string>
#include <string_view>

namespace zero::train {

class MetricsFile {
 public:
  // Opens `path` for appending, creating it (mode 0644) if missing. Throws zero::Error naming
  // the path with the system's reason (a missing directory, no permission, a read-only file
  // system, a directory of that name...).
  static MetricsFile open(const std::string& path);

  MetricsFile(MetricsFile&& other) noexcept;
  MetricsFile& operator=(MetricsFile&& other) noexcept;
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;
  ~MetricsFile();

  const std::string& path() const noexcept { return path_; }
  // Appends `line` and a newline, whole. Throws zero::Error when the write fails.
  void append(std::string_view line);
  // fsync (regular files only: a device or a pipe has nothing to sync) and close(2); throws
  // zero::Error on failure. Idempotent.
  void close();

 private:
  MetricsFile(int fd, std::string path) noexcept : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

}  // namespace zero::train
