// Optimizer state on NVMe (offload_optimizer.device "nvme"; docs/nvme-offload.md, "Optimizer
// state on NVMe"): this rank's fp32 master, Adam's m and v live in swap files instead of host
// RAM, and HostOffload's host AdamW works on them sub-group by sub-group through `buffer_count`
// pinned, 4096-aligned host buffers (slots).
//
// Sub-groups (DeepSpeed's zero_optimization.sub_group_size): each parameter group's owned range
// is cut into consecutive runs of at most sub_group_size elements, the unit that moves between
// the drive and a slot. The slots and the access buffer are sized for the largest sub-group, so
// host memory for the state is (buffer_count + 1) x 12 bytes x sub_group_size at most, whatever
// the model's size. A group with nothing owned has one empty sub-group (no file, no I/O).
//
// Files: one per sub-group, `opt-g<g>` (a group in one piece) or `opt-g<g>.<j>`, in the
// SwapStore's rank directory (<nvme_path>/zero-swap/rank<r>/), holding master | m | v, each
// padded to 4096 bytes, so a sub-group moves in one read and one write.
//
// A group's AdamW (schedule()): per sub-group, read it into a slot, run AdamW on the slot, write
// the slot back. Three host streams carry that: the reader, the optimizer thread (HostOffload's)
// and the writer. With pipeline_read the reads run on the reader, so the next sub-groups' reads
// (as many as there are free slots) overlap the current one's AdamW; without it each read runs
// on the optimizer thread just before its AdamW. Likewise pipeline_write puts the write-back on
// the writer (overlapping the next AdamW) or after the AdamW on the optimizer thread. Slots are
// used round robin in schedule order; a slot is reused once its previous sub-group's write has
// completed (an event per slot), and a sub-group's file is read once its own last write-back
// (the previous step's, maybe through another slot) has completed (an event per sub-group). With
// one slot nothing can overlap: pipelining wants >= 2.
//
// state(g, k, lo) on the optimizer thread, inside the AdamW task schedule() launched for the
// sub-group of g starting at element lo, points into that sub-group's slot. Between steps (the
// thread driving the Engine: set-up, checkpoints, parameter reads) read_state() / write_state()
// copy any range of a group's state out or in through a separate access buffer that holds one
// sub-group (reading it; the sub-group that was there before is written back first); flush()
// writes the access buffer back. schedule() flushes first, so a step never reads a stale file.
// The access path is synchronous and only for between steps: the caller must have synchronized
// the host streams.
//
// The arithmetic is untouched: AdamW reads and writes the same floats it would in RAM, element
// by element, so cutting a group changes no bit; only where they wait between steps changes, so
// training is bitwise that of cpu offload.
//
// Errors: the SwapStore's (a missing, read-only or full nvme_path: zero::Error naming the path)
// at construction; an I/O error during a step is thrown by the stream task that met it, and
// comes out of the next synchronize() of the streams (HostOffload::sync / wait_adam).
//
// Threading: construction, schedule(), read_state(), write_state(), flush(), sync() on the
// driving thread; the tasks on the three streams.
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
  // Opens the file engine and the store (rank directory `rank`), cuts group g's `numel[g]`
  // owned elements into sub-groups of at most o.sub_group_size, makes one file per sub-group
  // (master, m, v in fp32), writes zeros to them, and allocates the slots and the access buffer
  // from `memory` (MemCategory::optimizer_states). The files are counted in the device's ledger,
  // space nvme (master: master_weights; m, v: optimizer_states), until destruction.
  // `shared`: a store already open on the same nvme_path (the parameters' on NVMe, one lock per
  // rank directory), used instead of opening one; it must outlive this.
  OptimizerSwap(const NvmeOptimizerOptions& o, int rank, const std::vector<int64_t>& numel,
                offload::HostMemory& memory, offload::SwapStore* shared = nullptr);
  ~OptimizerSwap();
  OptimizerSwap(const OptimizerSwap&) = delete;
  OptimizerSwap& operator=(const OptimizerSwap&) = delete;

  // AdamW on one sub-group: elements [lo, lo + n) of the group's owned range.
  using Adam = std::function<void(int64_t lo, int64_t n)>;
  // Group g's AdamW, sub-group by sub-group: each one's read into the next slot (once that slot's
  // last write-back is done), `adam(lo, n)` on `optimizer` (after `adam_after` when not null, and
  // after the read), the write-back. `adam_done` is recorded on `optimizer` right after the last
  // sub-group's `adam`: the working copy AdamW wrote (HostOffload::out) is ready then, while
  // write-backs may still run.
  void schedule(int g, Stream& optimizer, Event* adam_after, Adam adam, Event& adam_done);
  // At a step's start, with pipeline_read: reads sub-groups 0 .. buffer_count-1 (in group order)
  // into the slots schedule() will give them, so those reads run during forward and backward
  // (the state does not depend on the gradients) instead of at the optimizer step. schedule() in
  // group order, as the norm-first step runs it, then uses them; a read left unused (a skipped
  // step) is simply read again at the next prefetch (and one into a slot that goes to another
  // sub-group is overwritten by that one's later read: the reader runs in order).
  void prefetch();
  // Inside the AdamW task of g's sub-group starting at `lo`: its array k (0 master, 1 m, 2 v),
  // element lo first. Anywhere else an error (use read_state / write_state).
  float* state(int g, int k, int64_t lo) const;
  // Between steps: group g's array k, elements [off, off + n), copied to dst / from src (null:
  // zeros), through the access buffer.
  void read_state(int g, int k, int64_t off, float* dst, int64_t n);
  void write_state(int g, int k, int64_t off, const float* src, int64_t n);
  // Writes the access buffer's sub-group back (if any).
  void flush();
  // Waits for the reader and the writer (rethrowing their first error).
  void sync();
  void quiesce() noexcept;

  int sub_groups() const noexcept { return static_cast<int>(units_.size()); }
  // The sizes of the sub-groups a group of `numel` owned elements is cut into (one, maybe empty,
  // when numel <= sub_group_size): what the constructor makes and the memory plan counts.
  static std::vector<int64_t> cut(int64_t numel, int64_t sub_group_size);
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
  struct Unit {  // one sub-group
    int group = 0;
    int64_t lo = 0, n = 0;  // elements [lo, lo + n) of the group's owned range
    std::string file;
  };
  size_t segment(size_t u) const { return offload::SwapStore::padded(static_cast<size_t>(units_[u].n) * 4); }
  size_t unit_bytes(size_t u) const { return 3 * segment(u); }
  // The sub-group of g holding element `off` of its owned range.
  size_t unit_at(int g, int64_t off) const;
  // Brings sub-group u into the access buffer (writing back the one there).
  unsigned char* access(size_t u);
  template <class Copy>
  void access_range(int g, int k, int64_t off, int64_t n, Copy&& copy);
  void read_now(size_t u, void* buffer);   // synchronous
  // On the reader: u's file into slot s, after the slot's and u's last write-backs.
  void read_ahead(size_t u, size_t s);
  void write_now(size_t u, const void* buffer);
  template <class Submit>
  void timed(size_t u, std::atomic<uint64_t>& moved, Submit&& submit);

  NvmeOptimizerOptions o_;
  std::vector<Unit> units_;
  std::vector<size_t> first_unit_;  // per group, and one past the last group
  MemoryLedger& ledger_;
  size_t ledger_master_ = 0, ledger_moments_ = 0;  // reserved in space nvme
  std::unique_ptr<offload::AioEngine> engine_;  // null with a shared store
  std::atomic<uint64_t> read_bytes_{0}, written_bytes_{0};
  std::unique_ptr<offload::SwapStore> own_store_;
  offload::SwapStore* store_ = nullptr;  // own_store_, or the shared one
  std::vector<offload::HostBuffer> slots_;
  offload::HostBuffer access_;
  int64_t access_unit_ = -1;
  size_t buffer_bytes_ = 0;
  size_t next_slot_ = 0;
  std::unique_ptr<Stream> reader_, writer_;
  std::vector<std::unique_ptr<Event>> slot_free_;  // per slot: its last write-back is done
  std::vector<std::unique_ptr<Event>> read_done_;  // per sub-group (pipeline_read)
  std::vector<std::unique_ptr<Event>> written_;    // per sub-group: its last write-back is done
  std::vector<int> prefetched_;                     // per sub-group: the slot prefetch() read it into, or -1
  struct Times;
  std::unique_ptr<Times> times_;
};

}  // namespace zero::engine
