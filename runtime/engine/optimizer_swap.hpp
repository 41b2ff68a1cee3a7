// Optimizer state on NVMe (offload_optimizer.device "nvme"; docs/nvme-offload.md, "Optimizer
// state on NVMe"): this rank's fp32 master, Adam's m and v live in swap files instead of host
// RAM, and HostOffload's host AdamW works on them group by group through `buffer_count` pinned,
// 4096-aligned host buffers (slots).
//
// Files: one per parameter group, `opt-g<g>` in the SwapStore's rank directory
// (<nvme_path>/zero-swap/rank<r>/), holding master | m | v, each padded to 4096 bytes, so a
// group moves in one read and one write.
//
// A group's AdamW (schedule()): read the group into a slot, run AdamW on the slot, write the
// slot back. Three host streams carry that: the reader, the optimizer thread (HostOffload's) and
// the writer. With pipeline_read the reads run on the reader, so the next groups' reads (as many
// as there are free slots) overlap the current group's AdamW; without it each read runs on the
// optimizer thread just before its AdamW. Likewise pipeline_write puts the write-back on the
// writer (overlapping the next group's AdamW) or after the AdamW on the optimizer thread. Slots
// are used round robin in schedule order; a slot is reused once its previous group's write has
// completed (an event per slot), and a group's file is read once its own last write-back (the
// previous step's, maybe through another slot) has completed (an event per group). With one slot
// nothing can overlap: pipelining wants >= 2.
//
// state(g, k) on the optimizer thread, inside the AdamW task schedule() launched for g, points
// into g's slot. Anywhere else (the thread driving the Engine, between steps: set-up,
// checkpoints, parameter reads) it brings g into a separate access buffer (reading it; the group
// that was there before is written back first) and points there; flush() writes the access
// buffer back. schedule() flushes first, so a step never reads a stale file. The access path is
// synchronous and only for between steps: the caller must have synchronized the host streams.
//
// The arithmetic is untouched: AdamW reads and writes the same floats it would in RAM; only
// where they wait between steps changes, so training is bitwise that of cpu offload.
//
// Errors: the SwapStore's (a missing, read-only or full nvme_path: zero::Error naming the path)
// at construction; an I/O error during a step is thrown by the stream task that met it, and
// comes out of the next synchronize() of the streams (HostOffload::sync / wait_adam).
//
// Threading: construction, schedule(), flush(), sync() and the access path on the driving
// thread; the tasks on the three streams.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/stream.hpp"
#include "offload/aio_engine.hpp"
#include "offload/host_memory.hpp"
#include "offload/swap_store.hpp"
#include "runtime/engine/engine.hpp"

namespace zero::engine {

class OptimizerSwap {
 public:
  // Opens the file engine and the store (rank directory `rank`), makes one file per group of
  // `numel[g]` fp32 elements each (master, m, v), writes zeros to them, and allocates the slots
  // and the access buffer from `memory` (MemCategory::optimizer_states). The files are counted
  // in the device's ledger, space nvme (master: master_weights; m, v: optimizer_states), until
  // destruction.
  // `shared`: a store already open on the same nvme_path (the parameters' on NVMe, one lock per
  // rank directory), used instead of opening one; it must outlive this.
  OptimizerSwap(const NvmeOptimizerOptions& o, int rank, const std::vector<int64_t>& numel,
                offload::HostMemory& memory, offload::SwapStore* shared = nullptr);
  ~OptimizerSwap();
  OptimizerSwap(const OptimizerSwap&) = delete;
  OptimizerSwap& operator=(const OptimizerSwap&) = delete;

  // Group g's AdamW: its read into the next slot (once that slot's last write-back is done),
  // `adam` on `optimizer` (after `adam_after` when not null, and after the read), the
  // write-back. `adam_done` is recorded on `optimizer` right after `adam`: the working copy AdamW
  // wrote (HostOffload::out) is ready then, while the write-back may still run.
  void schedule(int g, Stream& optimizer, Event* adam_after, std::function<void()> adam, Event& adam_done);
  // At a step's start, with pipeline_read: reads groups 0 .. buffer_count-1 into the slots
  // schedule() will give them, so those reads run during forward and backward (the state does not
  // depend on the gradients) instead of at the optimizer step. schedule() in group order, as
  // the norm-first step runs it, then uses them; a read left unused (a skipped step) is simply
  // read again at the next prefetch (and one into a slot that goes to another group is
  // overwritten by that group's later read: the reader runs in order).
  void prefetch();
  // Group g's array k (0 master, 1 m, 2 v): see the header comment.
  float* state(int g, int k);
  // Writes the access buffer's group back (if any).
  void flush();
  // Waits for the reader and the writer (rethrowing their first error).
  void sync();
  void quiesce() noexcept;

  // The store's files on the drive (padded), and bytes moved since construction.
  uint64_t bytes_on_drive() const { return store_->bytes_on_drive(); }
  // Its own files' bytes moved (the store's engine may be shared with the parameters' swap).
  uint64_t bytes_read() const { return read_bytes_.load(); }
  uint64_t bytes_written() const { return written_bytes_.load(); }
  // Host bytes of the slots and the access buffer.
  size_t buffer_bytes() const { return buffer_bytes_; }
  const std::string& directory() const { return store_->directory(); }
  // Seconds of I/O since construction: summed over reads and writes (overlapping ones each
  // counted), the wall time with any of them in flight (busy), and the optimizer thread's time
  // waiting for a read or doing unpipelined I/O (exposed: I/O not hidden behind AdamW).
  double io_seconds() const;
  double io_busy_seconds() const;
  double io_exposed_seconds() const;

 private:
  size_t segment(int g) const { return offload::SwapStore::padded(static_cast<size_t>(numel_[static_cast<size_t>(g)]) * 4); }
  size_t group_bytes(int g) const { return 3 * segment(g); }
  static std::string file_name(int g) { return "opt-g" + std::to_string(g); }
  void read_now(int g, void* buffer);   // synchronous
  // On the reader: g's file into slot s, after the slot's and g's last write-backs.
  void read_ahead(int g, size_t s);
  void write_now(int g, const void* buffer);
  template <class Submit>
  void timed(int g, std::atomic<uint64_t>& moved, Submit&& submit);

  NvmeOptimizerOptions o_;
  std::vector<int64_t> numel_;
  MemoryLedger& ledger_;
  size_t ledger_master_ = 0, ledger_moments_ = 0;  // reserved in space nvme
  std::unique_ptr<offload::AioEngine> engine_;  // null with a shared store
  std::atomic<uint64_t> read_bytes_{0}, written_bytes_{0};
  std::unique_ptr<offload::SwapStore> own_store_;
  offload::SwapStore* store_ = nullptr;  // own_store_, or the shared one
  std::vector<offload::HostBuffer> slots_;
  offload::HostBuffer access_;
  int access_group_ = -1;
  size_t buffer_bytes_ = 0;
  size_t next_slot_ = 0;
  std::unique_ptr<Stream> reader_, writer_;
  std::vector<std::unique_ptr<Event>> slot_free_;  // per slot: its last write-back is done
  std::vector<std::unique_ptr<Event>> read_done_;  // per group (pipeline_read)
  std::vector<std::unique_ptr<Event>> written_;    // per group: its last write-back is done
  std::vector<int> prefetched_;                     // per group: the slot prefetch() read it into, or -1
  struct Times;
  std::unique_ptr<Times> times_;
};

}  // namespace zero::engine
