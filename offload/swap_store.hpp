// SwapStore: named tensors' bytes on a drive, one file each, read and written through the
// asynchronous file engine -- where the NVMe tier keeps swapped optimizer state and parameters.
//
// Layout: <nvme_path>/zero-swap/rank<r>/<name>.swp, one directory per rank so ranks sharing a
// node (and a drive) never touch each other's files. Each file holds padded(bytes) bytes: the
// tensor's size rounded up to kAioAlignment, because O_DIRECT moves whole 4096-byte blocks (see
// aio_options.hpp). A caller's buffer for read() / write() must therefore be 4096-aligned and
// padded(bytes) long (HostMemory's buffers are page-aligned); write() stores the padding bytes
// too, read() overwrites them.
//
// The directory is checked at construction: nvme_path missing, not a directory, read-only or
// not writable by us are each a zero::Error naming the path and what to do. If its file system
// refuses O_DIRECT, the store warns once, naming the directory, and uses buffered I/O for all
// its files. create() reserves the file's space (fallocate), so a drive too small for the state
// fails at creation, naming the file, rather than in the middle of a step; a write that still
// meets a full drive fails in wait() with ENOSPC.
//
// Exclusive use: the rank directory is locked (flock on .lock) for the store's life; a second
// store on the same directory -- another job given the same nvme_path -- is an error.
//
// Removal and crashes: the destructor deletes the files, the lock, its rank directory and, once
// empty, zero-swap (whichever store leaves last). A process that dies without running destructors (SIGKILL, a crash, an abort)
// leaves its files behind; the next store on the same nvme_path and rank deletes such left-over
// *.swp files at construction (the lock proves their owner is gone) and says so. Until then
// they use space: `rm -r <nvme_path>/zero-swap` removes them by hand.
//
// Ownership and lifetime: the engine must outlive the store. Every request on a tensor must have
// been waited for before remove() of it or destruction of the store. Thread-safety: members may
// be called from any thread (one lock around the table of tensors).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "offload/aio_engine.hpp"
#include "offload/aio_file.hpp"

namespace zero::offload {

class SwapStore {
 public:
  SwapStore(AioEngine& engine, const std::string& nvme_path, int rank, bool prefer_direct = true);
  ~SwapStore();
  SwapStore(const SwapStore&) = delete;
  SwapStore& operator=(const SwapStore&) = delete;

  // bytes rounded up to kAioAlignment: the size of a tensor's file and of its I/O buffers.
  static size_t padded(size_t bytes) noexcept {
    return (bytes + kAioAlignment - 1) / kAioAlignment * kAioAlignment;
  }

  // A new tensor of `bytes` bytes. Names are [A-Za-z0-9._-], not starting with '.'; a name in use
  // is an error.
  void create(const std::string& name, size_t bytes);
  // The whole tensor: padded(bytes) bytes from / into buffer.
  AioHandle write(const std::string& name, const void* buffer);
  AioHandle read(const std::string& name, void* buffer);
  // A range of it: [offset, offset + length) within padded(bytes); aligned on a direct file.
  AioHandle write(const std::string& name, const void* buffer, size_t length, uint64_t offset);
  AioHandle read(const std::string& name, void* buffer, size_t length, uint64_t offset);
  // Closes and deletes the tensor's file.
  void remove(const std::string& name);

  bool contains(const std::string& name) const;
  size_t bytes(const std::string& name) const;  // as created (unpadded)
  uint64_t bytes_on_drive() const;              // sum of padded sizes (the ledger's nvme tier)
  const std::string& directory() const noexcept { return dir_; }
  bool direct() const noexcept { return direct_; }
  AioEngine& engine() const noexcept { return engine_; }

 private:
  struct Tensor {
    AioFile file;
    size_t bytes = 0;
  };
  const Tensor& find(const std::string& name) const;  // under mu_
  // find(name), checked that [offset, offset + length) lies inside its padded bytes; under mu_.
  const Tensor& ranged(const std::string& name, const char* what, size_t length, uint64_t offset) const;
  std::string file_of(const std::string& name) const { return dir_ + "/" + name + ".swp"; }

  AioEngine& engine_;
  std::string dir_;           // <nvme_path>/zero-swap/rank<r>
  std::string parent_;        // <nvme_path>/zero-swap
  bool made_parent_ = false;  // we created parent_ (so we try to remove it)
  bool direct_ = true;
  int lock_fd_ = -1;
  mutable std::mutex mu_;  // tensors_
  std::map<std::string, Tensor> tensors_;
};

}  // namespace zero::offload
