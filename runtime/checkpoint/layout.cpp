#include "runtime/checkpoint/layout.hpp"

#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc, _GNU_SOURCE)

#include <cerrno>
#include <cstdio>
#include <sstream>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/file_io.hpp"
#include "runtime/core/error.hpp"

namespace zero::checkpoint::detail {

namespace {
constexpr std::string_view kMarkerFirstLine = "zero-checkpoint complete";
}

void check_tag(const std::string& tag) {
  const bool chars_ok =
      tag.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+=-") ==
      std::string::npos;
  if (tag.empty() || tag.size() > 200 || !chars_ok || tag[0] == '.' || tag == kLatestName)
    ZERO_FAIL("invalid checkpoint tag '" + tag +
              "': a tag is 1-200 characters of letters, digits and . _ + = -, does not start "
              "with '.' and is not \"latest\"\nHINT: use a tag such as \"global_step1000\"");
}

std::string join(const std::string& dir, std::string_view name) {
  if (dir.empty()) return std::string(name);
  return dir.back() == '/' ? dir + std::string(name) : dir + "/" + std::string(name);
}

std::string tmp_dir(const std::string& dir, const std::string& tag) {
  return join(dir, "." + tag + ".tmp");
}
std::string old_dir(const std::string& dir, const std::string& tag) {
  return join(dir, "." + tag + ".old");
}

std::string marker_text(const Marker& m) {
  char crc[9];
  std::snprintf(crc, sizeof crc, "%08x", m.manifest_crc);
  return std::string(kMarkerFirstLine) + "\nmanifest_crc32c " + crc + "\ncommitted_unix_ns " +
         std::to_string(m.committed_ns) + "\n";
}

std::optional<Marker> read_marker(const std::string& ckpt_dir) {
  const std::string path = join(ckpt_dir, kMarkerName);
  if (!io::exists(path)) return std::nullopt;
  const std::string text = io::read_file(path, 4096, "checkpoint marker");
  std::istringstream in(text);
  std::string first, k1, k2, crc;
  Marker m;
  std::getline(in, first);
  if (first == kMarkerFirstLine && (in >> k1 >> crc >> k2 >> m.committed_ns) &&
      k1 == "manifest_crc32c" && k2 == "committed_unix_ns" && crc.size() == 8 &&
      crc.find_first_not_of("0123456789abcdef") == std::string::npos) {
    m.manifest_crc = static_cast<uint32_t>(std::stoul(crc, nullptr, 16));
    return m;
  }
  ZERO_FAIL("checkpoint marker " + io::quote(path) +
            " is malformed\nHINT: the checkpoint directory is damaged; load an earlier checkpoint");
}

void install(const std::string& dir, const std::string& tag, bool swap) {
  const std::string tmp = tmp_dir(dir, tag), final_dir = join(dir, tag);
  if (!io::exists(final_dir)) {
    io::rename_path(tmp, final_dir);
    io::fsync_dir(dir);
    return;
  }
  // One atomic step where the filesystem can swap two names: readers see the old checkpoint or
  // the new one under dir/<tag>; the old one ends under the temporary name and is removed.
  if (swap) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      io::fsync_dir(dir);
      io::remove_tree(tmp);
      return;
    }
    const int err = errno;
    if (err != EINVAL && err != ENOSYS && err != EOPNOTSUPP)
      ZERO_FAIL("cannot swap " + io::quote(tmp) + " and " + io::quote(final_dir) + ": " +
                io::errno_text(err));
  }
  // Two renames (NFS and others cannot swap). Between them dir/<tag> is missing and the old
  // checkpoint, complete, is dir/.<tag>.old: load() and latest() fall back to it (resolve), and
  // the next begin_save() of the tag puts it back.
  const std::string old = old_dir(dir, tag);
  io::remove_tree(old);
  io::rename_path(final_dir, old);
  io::rename_path(tmp, final_dir);
  io::fsync_dir(dir);
  io::remove_tree(old);
}

std::string resolve(const std::string& dir, const std::string& tag) {
  const std::string path = join(dir, tag);
  if (io::exists(path)) return path;
  const std::string old = old_dir(dir, tag);
  try {
    if (io::is_directory(old) && read_marker(old)) return old;
  } catch (const std::exception&) {
    // A damaged leftover is no recovery candidate.
  }
  return path;
}

}  // namespace zero::checkpoint::detail
