// ZeRO-Offload's host side (EngineOptions::offload_optimizer): this rank's fp32 master, Adam's m
// and v, and the reduced gradient shard live in host memory, and AdamW runs on the host.
//
// Each group's reduced shard lands (land(): copied down, e bytes per element, the host waiting
// for the copy), and a host thread (`worker`) adds it to the fp32 accumulator (stage 2/3 with
// accumulation) and, once it is final, takes its squared norm. AdamW runs on a second host
// thread (`optimizer`, run_adam()), so that the last group's norm, which the step's all-reduce
// waits for, never queues behind the AdamW of the groups before it. The updated working copy of
// each group is written into `out` and goes up (copy_up()). Same arithmetic, same order as the
// device path: the results are bitwise the same.
//
// The speculative host step keeps a second bank of master, m and v (state(g, k, true)): AdamW
// run ahead writes it, and OptimizerStep flips which bank is current when it keeps the result.
//
// With EngineOptions::nvme (optimizer state on NVMe) master, m and v are not in host RAM: an
// OptimizerSwap (optimizer_swap.hpp) keeps them in swap files and state() points into its swap
// buffers; run_adam() reads the group in before AdamW and writes it back after. There is no
// second bank then: allocate() turns the speculative step off (said once at info level).
//
// Host buffers are allocated from `memory()`, which outlives them (ParamResidency's offloaded
// shards included: the engine declares this first).
//
// Threading: the thread driving the Engine calls every method; the work it launches runs on the
// two host threads, and the wait_* calls block the driving thread until they are done.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "offload/copy_engine.hpp"
#include "offload/host_memory.hpp"
#include "runtime/engine/context.hpp"
#include "runtime/engine/optimizer_swap.hpp"

namespace zero::engine {

class HostOffload {
 public:
  // Opens the host memory (pinned per `pin`), the copy engine and the two host threads.
  HostOffload(Context& x, offload::PinPolicy pin);
  ~HostOffload();

  offload::HostMemory& memory() { return *host_; }
  offload::CopyEngine& copies() { return *copies_; }

  // The buffers for this rank's owned range (owned_total elements). With `second_bank` also the
  // speculative step's second copy of master, m and v; returns false (with a warning) when host
  // memory cannot hold it, and with NVMe offload (no second bank on the drive). With NVMe
  // offload: opens the swap files under nvme.path (`swap_rank`: the rank directory).
  // `shared`: the engine's store when the parameters are on the same nvme_path (one per rank
  // directory), used instead of opening another.
  bool allocate(bool second_bank, int swap_rank = 0, offload::SwapStore* shared = nullptr);

  // Group g's reduced gradient shard of this micro-batch is complete at device pointer `shard`:
  // bring it down and, on the worker thread, accumulate it and (last) take its squared norm.
  void land(int g, const void* shard, bool last);
  // Where this rank's reduced gradient of group g is on the host, and its type.
  const unsigned char* grad(int g) const;
  DType grad_type() const { return h_acc_ ? DType::f32 : x_.dtype; }
  // The squared norm of group g's final gradient shard (after wait_norms()).
  double partial_norm(int g) const { return partial_[static_cast<size_t>(g)]; }

  // AdamW's fp32 state of group g's owned range from element lo on: k = 0 master, 1 m, 2 v, in
  // the first or the second bank. With NVMe offload see OptimizerSwap::state (valid only inside
  // the AdamW task of the sub-group starting at lo; between steps use its read_state /
  // write_state).
  float* state(int g, int k, bool second_bank, int64_t lo = 0) const;
  // Group g's updated working copy (owned range, param_type) on its way up. With NVMe offload it
  // is written over the landed gradient (the same bytes: AdamW reads each element's gradient
  // before it writes its copy), so host memory holds one owned-size 16-bit buffer, not two; the
  // next landing comes after the copy up. Without NVMe it has its own buffer, because the
  // speculative step may have to run AdamW again from the gradient.
  unsigned char* out(int g) const;
  // Copies group g's updated working copy up to `dst` (device), waiting for the copy.
  void copy_up(int g, void* dst, size_t bytes);

  // Runs `adam(lo, n)` over group g's owned range on the optimizer thread (after g's landing when
  // `after_landing`): in one call, or with NVMe offload once per sub-group; wait_adam(g) waits
  // for the last one.
  void run_adam(int g, std::function<void(int64_t lo, int64_t n)> adam, bool after_landing);
  void wait_adam(int g) { wait_worker(*adam_done_[static_cast<size_t>(g)]); }
  // At a step's start: with NVMe offload and pipeline_read, the first groups' state is read
  // during forward and backward (OptimizerSwap::prefetch).
  void prefetch_state() {
    if (swap_) swap_->prefetch();
  }
  // Waits for the last landed group's norm.
  void wait_norms() { wait_worker(*norms_done_); }
  // Waits for both host threads.
  void sync() {
    worker_->synchronize();
    optimizer_->synchronize();
    if (swap_) swap_->sync();
  }
  void sync_counted();  // sync(), the wait counted as host AdamW not hidden
  void quiesce() noexcept;
  // Fresh accumulator for the next step.
  void clear();

  offload::CopyCounters counters() const { return copies_->counters(); }
  std::string summary() const { return host_->summary(); }
  // The NVMe swap (null without it).
  OptimizerSwap* swap() const { return swap_.get(); }

 private:
  // The driving thread waiting for a host thread, counted as host AdamW not hidden
  // (conservative: part of such a wait may be accumulation or a norm).
  void wait_worker(Event& e);

  Context& x_;
  std::unique_ptr<offload::HostMemory> host_;  // outlives the buffers below
  std::unique_ptr<OptimizerSwap> swap_;        // NVMe offload; its tasks end in quiesce()
  std::unique_ptr<offload::CopyEngine> copies_;
  std::unique_ptr<Stream> worker_, optimizer_;  // cpu executors on either backend
  std::vector<std::unique_ptr<Event>> adam_done_;  // per group, recorded on optimizer_
  std::vector<std::unique_ptr<Event>> land_done_;  // per group: its landed shard was used
  std::unique_ptr<Event> norms_done_;              // the last landed group's norm was taken
  offload::HostBuffer h_land_;   // owned_total x e: this micro-batch's reduced shard, landed
  offload::HostBuffer h_acc_;    // owned_total fp32: accumulator (stage 2/3, accumulation)
  std::vector<char> acc_fresh_;  // per group: not landed this step yet (its h_acc_ part is stale)
  offload::HostBuffer h_out_;    // owned_total x e: AdamW's updated working copy, going up
                                 // (empty with NVMe offload: h_land_ holds it)
  const offload::HostBuffer& out_buffer() const { return h_out_ ? h_out_ : h_land_; }
  offload::HostBuffer h_master_, h_m_, h_v_;     // owned_total fp32
  offload::HostBuffer h_master2_, h_m2_, h_v2_;  // the speculative step's second bank
  std::vector<double> partial_;  // per group: local squared norm of the final gradient shard
};

}  // namespace zero::engine
