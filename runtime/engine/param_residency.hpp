// Parameter residency: where each group's working parameters (param_type) are, and getting them
// to the compute stream before a Unit reads them.
//
//   whole groups (stage 0-2; stage 3 groups of at most param_persistence_threshold elements):
//     the full padded buffer on every rank. At stage 1-3, after AdamW wrote this rank's range,
//     an all-gather in place fills the rest (gather_whole), waited for by the next use().
//   partitioned groups (stage 3): this rank's shard (on the host with offload_param); the full
//     buffer is all-gathered from a pool before the Units that need it, in the schedule's order
//     (`order`, one Unit per entry), prefetched ahead up to prefetch_bucket_size elements while
//     at most max_live_parameters are gathered, and released after use unless the next Unit in
//     the order uses it too.
//
// offload_param on NVMe (EngineOptions::param_nvme_path): partitioned groups past the first
// param_max_in_cpu shard elements (group order) keep their shard in a file instead
// (ParamSwap): read into a swap buffer ahead of the copy-up, in the order Units will need them,
// and written back when the optimizer step stores the new shard (store_shard). working() of such
// a group stages the shard in a buffer (set-up, checkpoint loads); flush() writes it back.
//
// Called by the schedule (use, prefetch, release_after, release_all, views), by the optimizer
// step (working, store_shard, gather_whole) and by checkpoints (wait_gathers, release_all,
// working, flush).
//
// Ownership and threading: owns the working buffers, the pooled gathered buffers and, with
// offload_param, the host shards (from HostOffload's memory, which outlives them). Only the
// thread driving the Engine calls it. The all-gathers run on the communicator's stream; use()
// makes the compute stream wait for them (the host only with timers); release_after() and
// release_all() block the host until the compute stream has passed the Unit.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "offload/copy_engine.hpp"
#include "offload/host_memory.hpp"
#include "runtime/engine/context.hpp"
#include "runtime/engine/param_swap.hpp"

namespace zero::engine {

class ParamResidency {
 public:
  explicit ParamResidency(Context& x) : x_(x) {}

  // Which groups are whole (needed by the memory plan, before anything is allocated).
  void plan();
  // The working buffers (zeros) or, with offload_param, the host shards (from `host`); `copies`
  // brings those up before their all-gather. `store`: the swap files of the shards on NVMe (null
  // without param_nvme_path); it must outlive this.
  void allocate(offload::HostMemory* host, offload::CopyEngine* copies, offload::SwapStore* store = nullptr);

  bool whole(int g) const { return whole_[static_cast<size_t>(g)]; }
  // Where this rank's owned range of group g starts in its working buffer.
  int64_t work_owned_begin(int g) const { return whole(g) ? x_.owned_begin[static_cast<size_t>(g)] : 0; }
  // The working copy of element `k` of this rank's owned range of group g: in the full buffer
  // of a whole group, in the shard (device, or host with offload_param) otherwise.
  unsigned char* working(int g, int64_t k);
  // The working buffer of group g (full when whole, else this rank's device shard).
  const Tensor& work(int g) const { return work_[static_cast<size_t>(g)]; }
  bool shard_on_host(int g) const { return x_.off_param && !whole(g); }
  // offload_param on NVMe: group g's shard lives on the drive (decided by plan()).
  bool shard_on_drive(int g) const { return !drive_.empty() && drive_[static_cast<size_t>(g)]; }
  // The optimizer step's new shard of a group on the drive: written back (asynchronously).
  void store_shard(int g, const void* src, size_t bytes) { swap_->store(g, src, bytes); }
  // Shards staged through working() go to the drive; every write has finished.
  void flush() { if (swap_) swap_->flush(); }
  // The parameter tier on the drive (zeros without it).
  ParamNvmeCounters nvme_counters() const { return swap_ ? swap_->counters() : ParamNvmeCounters{}; }
  // offload_param: the host shard of partitioned group g (empty when it is on the drive).
  offload::HostBuffer& host_shard(int g) { return h_shard_[static_cast<size_t>(g)]; }

  // The Units' order for stage 3's prefetching and releasing: one entry per Unit pass of a step.
  void set_order(std::vector<int> order) { order_ = std::move(order); }

  // Views of Unit `unit`'s parameters (present: whole, or gathered).
  std::vector<Tensor> views(int unit) const;
  // Unit `unit` is about to run: its groups' all-gathers (stage 3, or the step-end all-gather of
  // a whole group at stage 1-3) must have landed before the compute stream reads them.
  void use(int unit);
  // Stage 3: gathers ahead the groups of the Units at order[from], order[from + 1], ...
  void prefetch(size_t from);
  // Stage 3: order[pos] has been enqueued; release what the gathered prefix of what follows does
  // not need. Waits for the compute stream (the engine's one-Unit bound at stage 3).
  void release_after(size_t pos);
  // Stage 3: no gathered copy survives (the shards are about to change).
  void release_all();

  // Stage 1-3: this rank wrote its range of whole group g (after `after`, null: already done);
  // all-gather the group in place. The next use() waits for it.
  void gather_whole(int g, Event* after);
  // Stage 1-3, all ranks wrote their ranges: gather every whole group now (checkpoint loads).
  void gather_whole_now();
  // Waits for every all-gather in flight (before reading or writing working parameters), or
  // for group g's.
  void wait_gathers();
  void wait_gather(int g) { gathering_[static_cast<size_t>(g)].wait(); }
  // Waits for every all-gather, errors dropped (an exception is unwinding).
  void quiesce() noexcept;

 private:
  // Starts reading the shards on the drive the Units from order[pos_] on will need.
  void read_ahead();
  bool present(int g) const { return whole_[static_cast<size_t>(g)] || gathered_[static_cast<size_t>(g)]; }
  void gather_group(int g);

  Context& x_;
  offload::CopyEngine* copies_ = nullptr;
  std::vector<bool> whole_;        // working parameters held whole
  std::vector<Tensor> work_;       // whole: full padded buffer; else (stage 3) this rank's shard
  std::vector<Tensor> gathered_;   // stage 3, not whole: the full buffer while Units need it
  // The all-gather filling gathered_[g] (stage 3) or, after the optimizer step, work_[g] (whole
  // groups at stage 1-3); a Unit reading the group waits for it first.
  std::vector<coll::Work> gathering_;
  std::vector<offload::HostBuffer> h_shard_;  // offload_param: partitioned groups' shards (RAM)
  std::vector<bool> drive_;        // offload_param on NVMe: the shard is in a file instead
  std::unique_ptr<ParamSwap> swap_;
  size_t pos_ = 0;                 // stage 3: where in order_ the step is (read-ahead start)
  std::vector<int> order_;         // stage 3: Units in the order the step runs them
  int64_t live_elems_ = 0;         // stage 3: elements gathered (present or in flight), not whole
  Pool pool_;
};

}  // namespace zero::engine
