// POSIX file helpers of the checkpoint code (private to runtime/checkpoint): whole writes, exact
// positioned reads, fsync of files and directories, atomic replacement of small files.
//
// Every failure throws zero::Error whose message names the path, says what failed with the
// system's text, and (where the caller gave one) ends with a HINT line.
//
// Thread-safety: a File is used by one thread at a time; the free functions are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace zero::checkpoint::io {

// 'path', quoted for messages.
std::string quote(std::string_view path);
// "No such file or directory (errno 2)".
std::string errno_text(int err);

// An open file descriptor; closed by the destructor (errors ignored there: call close() where
// they matter, i.e. after writing).
class File {
 public:
  // Read-only. Throws "cannot open <what> 'path': <errno text>" plus `hint` when given.
  static File open_read(const std::string& path, std::string_view what, std::string_view hint = {});
  // Write-only, created (mode 0644) or truncated.
  static File create(const std::string& path, std::string_view what, std::string_view hint = {});

  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const noexcept { return path_; }
  uint64_t size() const;
  void write_all(const void* data, size_t bytes);
  // Reads exactly `bytes` at `offset`; a short read is reported as a truncated file, naming
  // `what` (e.g. "the header").
  void pread_exact(void* data, size_t bytes, uint64_t offset, std::string_view what) const;
  void sync();
  void close();

 private:
  File(int fd, std::string path, std::string what) noexcept
      : fd_(fd), path_(std::move(path)), what_(std::move(what)) {}
  int fd_ = -1;
  std::string path_, what_;
};

bool exists(const std::string& path) noexcept;
bool is_directory(const std::string& path) noexcept;
// mkdir -p; throws naming the path.
void make_directories(const std::string& path);
// rm -r; a missing path is fine. Throws naming the path.
void remove_tree(const std::string& path);
// rename(2), throwing naming both paths.
void rename_path(const std::string& from, const std::string& to);
// fsync of a directory: makes the creations, renames and removals of its entries durable.
void fsync_dir(const std::string& dir);
// Writes `contents` to a temporary file beside `path`, fsyncs it, renames it over `path` and
// fsyncs the directory: readers see the old file or the new one, never a mix.
void write_file_atomic(const std::string& path, std::string_view contents, std::string_view what);
// A whole file of at most `max_bytes` bytes (larger: an error naming the file and `what`).
std::string read_file(const std::string& path, size_t max_bytes, std::string_view what,
                      std::string_view hint = {});
// The directory part of a path ("." when none).
std::string parent_dir(const std::string& path);

}  // namespace zero::checkpoint::io
