// ParamSwap: stage 3's 16-bit parameter shards on the drive (offload_param.device "nvme"), read
// into a few pinned host buffers ahead of their copy-up and all-gather, written back after the
// optimizer step changed them. ParamResidency decides which groups live here (the rest of its
// host shards stay in RAM, up to offload_param.max_in_cpu elements) and when to read ahead.
//
// Files: one per group, "param-g<g>" in the SwapStore (offload/swap_store.hpp), padded to 4096
// bytes, counted in the ledger's nvme space (parameters). Host memory: at most `buffer_count` buffers of `buffer_bytes` each (padded), allocated
// at construction; a group's shard must fit one buffer (add() refuses a larger one, naming
// offload_param.buffer_size).
//
// A buffer is free, or holds one group: reading (in flight), clean (the drive's bytes), staged
// (written through stage(), not yet on the drive) or writing (new bytes on their way to the
// drive; also valid to read from). Clean and writing buffers are a cache: a group that is there
// is not read again. A group is in at most one buffer.
//
//   read_ahead(next)  starts reads of the groups in `next` (the order they will be needed) into
//                     free buffers or ones holding groups not in `next`; never blocks on a read
//   acquire(g)        the buffer holding g's shard, read now if it is not ahead; held until
//                     release(g) (one group at a time is enough: the copy-up waits)
//   store(g, src)     g's new shard: copied into a buffer and written to the drive (async)
//   stage(g)          g's shard to write in place (set-up, checkpoint loads); flush() writes
//                     it back and waits for every write
//
// Ownership and threading: the store, its engine and the host memory outlive this; only the
// thread driving the Engine calls it. Errors of the drive (I/O error, full drive) are the
// store's zero::Error, naming the file, thrown from whichever call waits for the request.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/ledger.hpp"
#include "offload/host_memory.hpp"
#include "offload/swap_store.hpp"

namespace zero::engine {

// What the parameter tier on the drive holds and has moved (Engine::param_nvme_counters()).
struct ParamNvmeCounters {
  uint64_t bytes_on_drive = 0;  // the shards' files, padded
  uint64_t bytes_read = 0;      // since construction
  uint64_t bytes_written = 0;   // since construction
  uint64_t host_buffer_bytes = 0;  // the swap buffers in host memory
  // Copy-ups that found their shard in a buffer, ready (read ahead, or still there), and those
  // that waited for a read (not read ahead, or not finished yet): the read-ahead's hit rate.
  uint64_t ready_uses = 0;
  uint64_t waited_uses = 0;
};

class ParamSwap {
 public:
  ParamSwap(offload::SwapStore& store, offload::HostMemory& host, int buffer_count, size_t buffer_bytes);
  ~ParamSwap();
  ParamSwap(const ParamSwap&) = delete;
  ParamSwap& operator=(const ParamSwap&) = delete;

  // Group g's shard (`bytes`) lives on the drive from now on (its file reserved, zeros).
  void add(int g, size_t bytes);
  bool holds(int g) const { return static_cast<size_t>(g) < bytes_.size() && bytes_[static_cast<size_t>(g)] > 0; }

  void read_ahead(const std::vector<int>& next);
  offload::HostBuffer& acquire(int g);
  void release(int g);
  void store(int g, const void* src, size_t bytes);
  unsigned char* stage(int g);
  void flush();
  // Waits for every request in flight, errors dropped (an exception is unwinding).
  void quiesce() noexcept;

  ParamNvmeCounters counters() const;

 private:
  enum class State { free, reading, clean, staged, writing };
  struct Buffer {
    offload::HostBuffer mem;
    State state = State::free;
    int group = -1;
    offload::AioHandle io;
    uint64_t used = 0;  // tick of its last use, for eviction
    bool held = false;  // acquired
  };
  static std::string name(int g) { return "param-g" + std::to_string(g); }
  int find(int g) const;                 // the buffer holding g, or -1
  // The buffer holding g's shard, read now if it is not there, the read waited for; `count`: a
  // copy-up (ready_uses / waited_uses).
  int bring(int g, bool count);
  void settle(Buffer& b);                // waits for its request; staged -> written and clean
  // A buffer to put a group into: free, else the least recently used one not held and, when
  // `keep` is given, holding no group in it. -1 when none (only with `keep`).
  int take(const std::vector<int>* keep);

  offload::SwapStore& store_;
  MemoryLedger& ledger_;
  size_t ledger_bytes_ = 0;  // reserved in the ledger's nvme space (the files)
  std::vector<Buffer> bufs_;
  std::vector<size_t> bytes_;  // per group: shard bytes on the drive (0: not here)
  size_t buffer_bytes_ = 0;
  uint64_t tick_ = 0;
  uint64_t read_ = 0, written_ = 0;
  uint64_t ready_uses_ = 0, waited_uses_ = 0;
};

}  // namespace zero::engine
