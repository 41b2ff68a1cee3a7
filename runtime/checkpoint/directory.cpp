// What a checkpoint directory must offer before a run relies on it: a save's size, a probe of
// writability, the free space, and the removal of what interrupted saves left behind.
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <set>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/file_io.hpp"
#include "runtime/checkpoint/layout.hpp"
#include "runtime/checkpoint/rank_file.hpp"
#include "core/error.hpp"

namespace zero::checkpoint {

namespace {

using namespace detail;
namespace fs = std::filesystem;

constexpr std::string_view kProbePrefix = ".zero-probe.";

// Generous upper bounds of manifest.json's text (written with one space of indentation per
// level): a piece is three integers (five when strided) of at most 20 digits on their own
// indented lines; a parameter its name (JSON-escaped: at most 6 bytes per byte) and its
// dimensions.
constexpr uint64_t kManifestFixedBytes = 1024;
constexpr uint64_t kManifestPerPiece = 128;
constexpr uint64_t kManifestPerStridedPiece = 192;
constexpr uint64_t kManifestPerRank = 256;
constexpr uint64_t kManifestPerParam = 96;
constexpr uint64_t kManifestPerDim = 32;
// The marker (three short lines) and the latest file (a tag of at most 200 bytes).
constexpr uint64_t kSmallFilesBytes = 128 + 256;

}  // namespace

uint64_t save_bytes(const SaveRequest& request, int rank) {
  std::vector<std::string> names;
  for (const ConstArray& a : request.arrays) names.push_back(a.name);
  uint64_t bytes = rank_file_bytes(request.pieces, names, request.block_elems) + kManifestPerRank;
  for (const Piece& p : request.pieces)
    bytes += p.strided() ? kManifestPerStridedPiece : kManifestPerPiece;
  if (rank == 0) {
    bytes += kManifestFixedBytes + kSmallFilesBytes + 8 * request.metadata.size();
    for (const ParamInfo& p : request.params)
      bytes += kManifestPerParam + 6 * p.name.size() + kManifestPerDim * p.shape.size();
    for (const std::string& n : names) bytes += 16 + 6 * n.size();
  }
  return bytes;
}

void probe_writable(const std::string& dir) {
  const std::string hint =
      "\nHINT: pass a --checkpoint-dir on a writable filesystem (check its permissions, that it "
      "is not mounted read-only, and its free space)";
  io::make_directories(dir);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  static std::atomic<unsigned> counter{0};
  const std::string path = join(dir, std::string(kProbePrefix) + host + "." +
                                         std::to_string(::getpid()) + "." +
                                         std::to_string(counter.fetch_add(1)));
  // A real write and fsync, not access(2): a read-only mount, a full disk or an NFS export
  // squashing root all pass access() and fail here, as a save would.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    ZERO_FAIL("cannot create a file in the checkpoint directory " + io::quote(dir) + " (" +
              io::quote(path) + "): " + io::errno_text(errno) + hint);
  const char bytes[512] = {};
  const ssize_t w = ::write(fd, bytes, sizeof bytes);
  const int write_err = errno;
  const int sync_rc = w == static_cast<ssize_t>(sizeof bytes) ? ::fsync(fd) : 0;
  const int sync_err = errno;
  ::close(fd);
  ::unlink(path.c_str());
  if (w != static_cast<ssize_t>(sizeof bytes))
    ZERO_FAIL("cannot write a file in the checkpoint directory " + io::quote(dir) + " (" +
              io::quote(path) + "): " +
              (w < 0 ? io::errno_text(write_err) : std::string("a short write")) + hint);
  if (sync_rc != 0 && sync_err != EINVAL)
    ZERO_FAIL("fsync of a file in the checkpoint directory " + io::quote(dir) + " failed: " +
              io::errno_text(sync_err) + hint);
}

Space free_space(const std::string& dir) {
  struct statvfs st {};
  if (::statvfs(dir.c_str(), &st) != 0)
    ZERO_FAIL("cannot read the free space of the checkpoint directory " + io::quote(dir) + ": " +
              io::errno_text(errno));
  // f_bavail: the blocks an unprivileged user may still use (root may use a reserve beyond it;
  // a job should not count on that).
  return {static_cast<uint64_t>(st.f_bavail) * st.f_frsize, static_cast<uint64_t>(st.f_frsize)};
}

std::vector<std::string> clean_leftovers(const std::string& dir) {
  std::vector<std::string> done;
  if (!io::is_directory(dir)) return done;
  std::set<std::string> tags;
  std::vector<std::string> stale_files;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 5 && name[0] == '.' && (name.ends_with(".tmp") || name.ends_with(".old"))) {
      const std::string tag = name.substr(1, name.size() - 5);
      try {
        check_tag(tag);
        tags.insert(tag);
      } catch (const Error&) {
        // a dot-name of someone else's: not ours to touch
      }
    } else if (name.starts_with(std::string(kLatestName) + ".tmp.") ||
               name.starts_with(kProbePrefix)) {
      stale_files.push_back(name);  // a latest update or a probe cut short by a crash
    }
  }
  if (ec)
    ZERO_FAIL("cannot list the checkpoint directory " + io::quote(dir) + ": " + ec.message());
  for (const std::string& tag : tags)
    for (std::string& line : recover_tag(dir, tag)) done.push_back(std::move(line));
  for (const std::string& name : stale_files) {
    const std::string path = join(dir, name);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      ZERO_FAIL("cannot remove " + io::quote(path) + ": " + io::errno_text(errno));
    done.push_back("removed " + io::quote(path) + ", left by an interrupted write");
  }
  return done;
}

}  // namespace zero::checkpoint
