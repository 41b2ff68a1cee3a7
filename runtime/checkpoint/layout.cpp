#include "runtime/checkpoint/layout.hpp"

#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2, RENAME_EXCHANGE (glibc, _GNU_SOURCE)

#include <cerrno>
#include <cstdio>
#include <sstream>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/crc32c.hpp"
#include "runtime/checkpoint/file_io.hpp"
#include "runtime/checkpoint/manifest.hpp"
#include "core/error.hpp"

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

std::optional<uint64_t> verified_commit(const std::string& ckpt_dir, std::string* why) {
  std::string reason;
  try {
    if (!io::is_directory(ckpt_dir)) {
      reason = "it does not exist";
    } else if (const std::optional<Marker> m = read_marker(ckpt_dir); !m) {
      reason = "it has no " + std::string(kMarkerName) + " marker (its save did not finish)";
    } else {
      const std::string path = join(ckpt_dir, kManifestName);
      const std::string text = io::read_file(path, size_t{1} << 30, "checkpoint manifest");
      if (crc32c(text) != m->manifest_crc) {
        reason = "its manifest does not match the checksum in its marker";
      } else {
        (void)parse_manifest(text, path);
        return m->committed_ns;
      }
    }
  } catch (const Error& e) {
    reason = e.message();
  }
  if (why) *why = reason;
  return std::nullopt;
}

std::vector<std::string> recover_tag(const std::string& dir, const std::string& tag) {
  check_tag(tag);
  const std::string final_dir = join(dir, tag), tmp = tmp_dir(dir, tag), old = old_dir(dir, tag);
  std::vector<std::string> done;
  std::optional<uint64_t> have = verified_commit(final_dir);
  if (io::exists(tmp)) {
    const std::optional<uint64_t> staged = verified_commit(tmp);
    if (staged && (!have || *staged > *have)) {
      // Sealed but never installed: the newest complete copy of the tag. install() swaps it in
      // (the displaced dir/<tag>, older or incomplete, ends under the temporary name).
      install(dir, tag);
      have = staged;
      done.push_back("installed " + io::quote(tmp) + " as " + io::quote(final_dir) +
                     ": a complete save of '" + tag + "' that was interrupted before its rename");
    }
    if (io::exists(tmp)) {
      io::remove_tree(tmp);
      done.push_back("removed " + io::quote(tmp) + ", left by an interrupted or failed save");
    }
  }
  if (io::exists(old)) {
    const std::optional<uint64_t> previous = verified_commit(old);
    if (previous && !io::exists(final_dir)) {
      io::rename_path(old, final_dir);
      done.push_back("put " + io::quote(old) + " back as " + io::quote(final_dir) +
                     ": a replacement was interrupted between its two renames");
    } else if (!previous || have) {
      io::remove_tree(old);
      done.push_back("removed " + io::quote(old) + ", left by a replacement of '" + tag + "'");
    }
  }
  if (!done.empty()) io::fsync_dir(dir);
  return done;
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
