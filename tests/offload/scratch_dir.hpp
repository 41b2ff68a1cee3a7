// Test fixtures of the NVMe tier's tests: a temporary directory removed at the end, and a small
// file system mounted on one (tmpfs with size=, read-only tmpfs, ramfs without O_DIRECT) for the
// failure cases. Mounting needs root (CAP_SYS_ADMIN); where it is refused, a test SKIPs.
#pragma once

#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace zero::test {

struct ScratchDir {
  std::string path;
  ScratchDir() {
    char tmpl[] = "/tmp/zero-aio-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

// fstype "tmpfs" or "ramfs", options like "size=1m", flags like MS_RDONLY.
struct ScratchMount {
  ScratchDir dir;
  bool mounted = false;
  std::string why;
  ScratchMount(const char* fstype, const char* options, unsigned long flags = 0) {
    if (::mount(fstype, dir.path.c_str(), fstype, flags, options) == 0)
      mounted = true;
    else
      why = std::string("mount -t ") + fstype + " failed: " + std::strerror(errno);
  }
  ~ScratchMount() {
    if (mounted) ::umount2(dir.path.c_str(), MNT_DETACH);
  }
  const std::string& path() const { return dir.path; }
};

}  // namespace zero::test
