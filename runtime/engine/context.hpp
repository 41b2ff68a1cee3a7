// The ground the engine's pieces share: the model, the device, the compute stream, the
// data-parallel communicator, the options and the partition; this rank's owned ranges; the
// hand-offs between the compute stream and the communicator's stream; the step's timers.
//
// The pieces of a step each hold a reference to one Context and own their own state:
//   ParamResidency  (param_residency.hpp)  where each group's working parameters are
//   GradReduction   (grad_reduction.hpp)   gradients from backward to the reduced shard
//   HostOffload     (host_offload.hpp)     ZeRO-Offload's host side (offload_optimizer)
//   OptimizerStep   (optimizer_step.hpp)   norm, overflow, clipping, AdamW, the speculative step
//   the schedule    (schedule.hpp)         which Unit runs forward or backward when
// docs/design.md "The engine's pieces" says who calls whom.
//
// Threading: the thread driving the Engine calls everything here; comm_busy_ns and comm_t0 are
// also touched by tasks on the communicator's stream, adam_ns by the host optimizer thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "collectives/communicator.hpp"
#include "core/device.hpp"
#include "core/stream.hpp"
#include "core/tensor.hpp"
#include "core/unit.hpp"
#include "optim/host_adam.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/partition.hpp"
#include "runtime/engine/state_kernels.hpp"

namespace zero::engine {

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds (and nanoseconds where another thread adds), filled with EngineOptions::timers;
// Engine::step resets the per-step ones and reports them in StepStats::time.
struct StepTimers {
  std::atomic<int64_t> comm_busy_ns{0};  // on the communicator's stream, since construction
  int64_t comm_busy_reported_ns = 0;     // the part already reported
  double comm_t0 = 0;                    // touched only on the communicator's stream
  double exposed = 0;                    // the host waiting on a collective, compute idle
  double forward = 0, backward = 0;      // the host's time in each phase
  double d2h = 0, h2d = 0;               // offload: waits for copies down / up
  double adam_waited = 0;                // offload: waits for the host optimizer thread
  double p2p_wait = 0;                   // pipeline: waits for a neighbouring stage
  std::atomic<int64_t> adam_ns{0};       // offload: AdamW time on the host optimizer thread
  void reset_step() {
    forward = backward = exposed = d2h = h2d = adam_waited = p2p_wait = 0;
    adam_ns = 0;
  }
};

struct Context {
  Context(Model& m, Device& d, Stream& c, coll::Communicator& k, EngineOptions opt,
          PipelinePlace pl = {}, TensorPlace tp = {});

  Model& model;
  Device& dev;
  Stream& compute;
  coll::Communicator& comm;
  EngineOptions o;
  Partition part;
  int rank, world;
  DType dtype = DType::f32;              // of the working parameters and the gradients
  bool off = false, off_param = false;   // offload_optimizer, offload_param
  PipelinePlace place;                   // a pipeline stage's (inactive otherwise)
  TensorPlace tensor;                    // a tensor rank's (inactive otherwise)

  // The elements this rank updates, concatenated group by group: the whole padded model at
  // stage 0, the rank's shards otherwise (set by plan_owned()).
  std::vector<int64_t> owned_begin;  // per group: first owned element within the group
  std::vector<int64_t> owned_off;    // per group: offset within the concatenation
  int64_t owned_total = 0;
  void plan_owned();
  int64_t owned_len(int g) const {
    return o.stage == 0 ? part.group(g).padded_numel : part.group(g).shard_numel;
  }
  // The pieces of parameters inside this rank's owned range of group g; shard_offset is
  // relative to the owned range's start.
  std::vector<Partition::Piece> owned_pieces(int g) const;
  // Per group, the parts of the owned range the gradient norm counts, as (offset within the
  // owned range, length): all of it, except the parameters counted elsewhere (counted()).
  // Set by plan_owned().
  std::vector<std::vector<std::pair<int64_t, int64_t>>> norm_runs;
  // Whether parameter `p` (this model's index) is a tied copy (PipelinePlace::tied).
  bool tied(int p) const;
  // Whether this rank counts parameter `p` in the gradient norm and saves it: not a tied copy
  // another pipeline stage owns (PipelinePlace::owns_tied), and not a replicated parameter on a
  // tensor rank other than 0 (TensorPlace: the same gradient is on every rank of the group).
  bool counted(int p) const;

  // Stage 0/1 with 16-bit parameters and accumulation: an fp32 sum of the micro-batches' full
  // gradients (GradReduction). Stage 2/3 with offload: an fp32 host accumulator of the landed
  // shards (HostOffload).
  bool fp32_full_sum() const {
    return o.stage <= 1 && o.gradient_accumulation_steps > 1 && dtype != DType::f32;
  }
  bool host_fp32_acc() const {
    return off && o.stage >= 2 && (o.gradient_accumulation_steps > 1 || dtype == DType::f32);
  }

  std::unique_ptr<optim::HostAdam> adam;  // AdamW on the host (cpu kernels, offload)
  // The state arithmetic on the compute stream (accumulation, rounding, norms, AdamW of a
  // device-resident shard): host tasks on cpu, kernels on cuda.
  std::unique_ptr<StateKernels> kern;
  StepTimers timers;

  size_t esize() const { return size_of(dtype); }
  unsigned char* at(const Tensor& t, int64_t elems, size_t elem_size) const {
    return static_cast<unsigned char*>(t.data()) + static_cast<size_t>(elems) * elem_size;
  }
  // A view of parameter `param` (its shape and type) inside the group buffer `base`.
  Tensor view(const Tensor& base, int param) const;

  // A copy between any two buffers this device reaches (device memory, host memory), done when
  // it returns: a stream-ordered copy on the compute stream, then a wait. For set-up,
  // checkpoints and parameter reads, never inside a step.
  void copy_now(void* dst, const void* src, size_t bytes);
  // n fp32 values from the host, rounded to t, into `dst`, now: device memory, or host memory
  // when `host` (an offloaded parameter shard).
  void upload_as(void* dst, DType t, const float* vals, int64_t n, bool host = false);

  // The compute stream's work so far, as an event a collective can start after. Every hand-off
  // from compute to communication goes through it: a reduction must not read a gradient the
  // compute stream is still adding to.
  Event* compute_point() {
    compute.record(*compute_done_);
    return compute_done_.get();
  }
  // Issues one collective, `issue(after)`. With timers it is bracketed on the communicator's
  // stream by clock reads (after its `after` event: waiting for the compute stream is not
  // communication), which add its duration to comm_busy_ns.
  template <class F>
  coll::Work post(F&& issue, Event* after) {
    if (!o.timers) return issue(after);
    Stream& cs = comm.stream();
    if (after) cs.wait(*after);
    cs.launch_host([this] { timers.comm_t0 = now_seconds(); });
    coll::Work w = issue(nullptr);
    cs.launch_host([this] {
      timers.comm_busy_ns += static_cast<int64_t>((now_seconds() - timers.comm_t0) * 1e9);
    });
    return w;
  }
  // The host needs collective `w` done. With timers, the compute stream is drained first (it
  // runs at most one Unit behind; its time is not communication) and the wait is counted as
  // exposed communication.
  void wait_comm(coll::Work& w);
  // How far the host runs ahead of the compute stream (stages 0-2): after enqueueing a Unit it
  // waits for the Unit before it, so the GPU runs one Unit while the host enqueues the next (a
  // wait for the Unit just enqueued would leave the GPU idle for every launch), and at most two
  // Units' transient memory is alive. Nothing the host touches depends on it: everything that
  // reads what a Unit wrote is stream-ordered (StateKernels, collectives' `after` events).
  void unit_fence() {
    compute.record(*fence_[fence_next_]);
    fence_next_ ^= 1;
    fence_[fence_next_]->synchronize();  // the previous Unit's point (never recorded: at once)
  }

 private:
  std::unique_ptr<Event> compute_done_, fence_[2];
  int fence_next_ = 0;
};

// The transient full-size buffers of stage 2/3 (gradients of a group during backward, gathered
// parameters) come from pools kept across steps: freshly mapped memory page-faults on every
// touch (measured: stage 2 a fifth slower than stage 0 when each micro-batch allocated them).
// A buffer is reused only for a group of exactly its size (the transformer blocks share one
// size; sizing every buffer for the largest group, the embedding, cost GPT-2 small 296 MB per
// rank at stage 2). How many are in use at once is bounded by the communication options
// (Engine::transient_bound()); the ledger counts them as communication buffers, apart from the
// model state the ZeRO formula describes.
struct Pool {
  std::vector<Tensor> free;
  Tensor take(Device& d, int64_t elems, ScalarType t) {
    for (size_t i = 0; i < free.size(); ++i)
      if (free[i].numel() == elems) {
        Tensor x = std::move(free[i]);
        free.erase(free.begin() + static_cast<std::ptrdiff_t>(i));
        return x;
      }
    return Tensor::empty(d, Shape{elems}, t, MemCategory::comm_buffers);
  }
  void give(Tensor& t) {
    if (t) free.push_back(std::move(t));
    t = Tensor();
  }
};

}  // namespace zero::engine
