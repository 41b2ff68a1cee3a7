#include "offload/swap_store.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"

namespace zero::offload {

namespace {

// mkdir that accepts an existing directory; returns whether it made one.
bool make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) == 0) return true;
  if (errno == EEXIST) return false;
  ZERO_FAIL(io_error_message(path, "creating the swap directory", errno));
}

bool valid_name(const std::string& n) {
  if (n.empty() || n.size() > 200 || n[0] == '.') return false;
  for (char c : n)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

// Deletes *.swp files a dead process left in dir (we hold the directory's lock, so their owner
// has exited); returns how many.
int remove_leftovers(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n.size() > 4 && n.compare(n.size() - 4, 4, ".swp") == 0) stale.push_back(dir + "/" + n);
  }
  ::closedir(d);
  for (const std::string& p : stale) ::unlink(p.c_str());
  return static_cast<int>(stale.size());
}

}  // namespace

SwapStore::SwapStore(AioEngine& engine, const std::string& nvme_path, int rank,
                     bool prefer_direct)
    : engine_(engine) {
  ZERO_REQUIRE(!nvme_path.empty(),
               "nvme_path is empty: NVMe offload needs a directory on the drive to swap to. "
               "What to do: set nvme_path to such a directory (e.g. /local_nvme)");
  struct stat st{};
  if (::stat(nvme_path.c_str(), &st) != 0) {
    if (errno == ENOENT)
      ZERO_FAIL("nvme_path '" + nvme_path + "' does not exist. What to do: create it (mkdir -p) "
                "on the drive meant for swapping, or fix nvme_path");
    ZERO_FAIL(io_error_message(nvme_path, "checking nvme_path", errno));
  }
  ZERO_REQUIRE(S_ISDIR(st.st_mode), "nvme_path '" + nvme_path +
                                        "' is not a directory. What to do: point nvme_path at a "
                                        "directory on the drive meant for swapping");
  parent_ = nvme_path + "/zero-swap";
  dir_ = parent_ + "/rank" + std::to_string(rank);
  made_parent_ = make_dir(parent_);  // EROFS / EACCES surface here, naming the path
  make_dir(dir_);

  const std::string lock = dir_ + "/.lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) ZERO_FAIL(io_error_message(lock, "creating the lock file", errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    ZERO_FAIL(dir_ + " is in use by another process (another job or rank given the same "
                     "nvme_path and rank). What to do: give each job its own nvme_path");
  }
  try {
    if (const int n = remove_leftovers(dir_); n > 0)
      log::rank_info(dir_ + ": removed " + std::to_string(n) +
                     " swap file(s) left by a process that did not exit cleanly");
    // One probe decides direct or buffered for the whole directory, so a file system without
    // O_DIRECT is reported once (AioFile warns, naming the probe's path) and not per tensor.
    const std::string probe = dir_ + "/probe.swp";
    AioFile f(probe, AioFile::Mode::create, prefer_direct);
    direct_ = f.direct();
    f.close();
    ::unlink(probe.c_str());
  } catch (...) {
    // The destructor will not run: release the lock and the directories here.
    ::unlink(lock.c_str());
    ::close(lock_fd_);
    ::rmdir(dir_.c_str());
    if (made_parent_) ::rmdir(parent_.c_str());
    throw;
  }
}

SwapStore::~SwapStore() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [name, t] : tensors_) {
    t.file.close();
    ::unlink(file_of(name).c_str());
  }
  tensors_.clear();
  if (lock_fd_ >= 0) {
    ::unlink((dir_ + "/.lock").c_str());
    ::close(lock_fd_);  // releases the flock
  }
  ::rmdir(dir_.c_str());                      // fails harmlessly if someone put files there
  // zero-swap goes with the last store to leave, whoever made it (fails harmlessly while other
  // ranks use it): the rank that made it often finishes first.
  ::rmdir(parent_.c_str());
}

void SwapStore::create(const std::string& name, size_t bytes) {
  ZERO_REQUIRE(valid_name(name), "SwapStore: tensor name '" + name +
                                     "' is not usable as a file name: use letters, digits, '.', "
                                     "'_' and '-', not starting with '.'");
  std::lock_guard<std::mutex> lock(mu_);
  ZERO_REQUIRE(!tensors_.count(name),
               "SwapStore: tensor '" + name + "' already exists in " + dir_);
  Tensor t;
  t.file = AioFile(file_of(name), AioFile::Mode::create, direct_);
  t.bytes = bytes;
  try {
    t.file.allocate(padded(bytes));
  } catch (...) {
    t.file.close();
    ::unlink(file_of(name).c_str());
    throw;
  }
  tensors_.emplace(name, std::move(t));
}

const SwapStore::Tensor& SwapStore::find(const std::string& name) const {
  auto it = tensors_.find(name);
  ZERO_REQUIRE(it != tensors_.end(), "SwapStore: no tensor '" + name + "' in " + dir_ +
                                         " (create it first)");
  return it->second;
}

AioHandle SwapStore::write(const std::string& name, const void* buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  const Tensor& t = find(name);
  return engine_.write(t.file, buffer, padded(t.bytes), 0);
}

AioHandle SwapStore::read(const std::string& name, void* buffer) {
  std::lock_guard<std::mutex> lock(mu_);
  const Tensor& t = find(name);
  return engine_.read(t.file, buffer, padded(t.bytes), 0);
}

AioHandle SwapStore::write(const std::string& name, const void* buffer, size_t length,
                           uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_.write(ranged(name, "write", length, offset).file, buffer, length, offset);
}

AioHandle SwapStore::read(const std::string& name, void* buffer, size_t length,
                          uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_.read(ranged(name, "read", length, offset).file, buffer, length, offset);
}

const SwapStore::Tensor& SwapStore::ranged(const std::string& name, const char* what, size_t length,
                                           uint64_t offset) const {
  const Tensor& t = find(name);
  ZERO_REQUIRE(offset + length <= padded(t.bytes),
               "SwapStore: " + std::string(what) + " of [" + std::to_string(offset) + ", " +
                   std::to_string(offset + length) + ") is past the end of tensor '" + name +
                   "' (" + std::to_string(padded(t.bytes)) + " bytes padded)");
  return t;
}

void SwapStore::remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tensors_.find(name);
  ZERO_REQUIRE(it != tensors_.end(), "SwapStore: no tensor '" + name + "' to remove in " + dir_);
  it->second.file.close();
  ::unlink(file_of(name).c_str());
  tensors_.erase(it);
}

bool SwapStore::contains(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return tensors_.count(name) > 0;
}

size_t SwapStore::bytes(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return find(name).bytes;
}

uint64_t SwapStore::bytes_on_drive() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t sum = 0;
  for (const auto& [name, t] : tensors_) sum += padded(t.bytes);
  return sum;
}

}  // namespace zero::offload
