// The Engine: drives a Model's Units through gradient-accumulation micro-batches and one AdamW
// step, with the model state laid out by the Partitioner and partitioned by ZeRO stage:
//
//   stage  working params (param_type)      gradients (param_type / fp32)        fp32 master, m, v
//   0      full, every rank                 full; all-reduce at the boundary     full, every rank
//   1      full                             full; reduce-scatter at the boundary 1/N shard
//   2      full                             per micro-batch, each group's        1/N shard
//                                           gradient is reduce-scattered as soon
//                                           as its Unit's backward is done, into
//                                           a shard (fp32 accumulator when there
//                                           is accumulation, else param_type);
//                                           the full buffer is freed
//   3      1/N shard; each Unit's groups    as stage 2                           1/N shard
//          all-gathered before its forward
//          and its backward, freed after
//
// With fp32 parameters the master copy is the working parameter itself (no second fp32 copy).
// The objective is the mean of the micro-batch losses over ranks and accumulation steps: the
// Units' gradients are summed (the collectives' fp32 rank-order sum), and 1 / (ranks x steps),
// the clip coefficient and the loss scale are folded into Adam's gradient scale.
//
// Communication (DeepSpeed's zero_optimization knobs, in elements; see docs/engine.md):
//   stage 0/1  each group's all-reduce / reduce-scatter starts, in place, as soon as its Unit's
//              backward of the last micro-batch is done (overlap_comm), else at the boundary.
//   stage 2/3  each group's reduce-scatter starts after its Unit's backward of every micro-batch;
//              the full gradient buffers waiting for or in reduction hold at most
//              reduce_bucket_size elements (at least one group).
//   stage 1/2  each group's all-gather of the updated parameters starts right after AdamW wrote
//              its shard and is waited for only before the next forward reads the group.
//   stage 3    groups are all-gathered before use in the recorded order (the Units' forward,
//              then backward, per micro-batch), prefetched ahead up to prefetch_bucket_size
//              elements (at least the next Unit) while at most max_live_parameters elements
//              are gathered; a group is
//              released after use unless the next Unit in the order uses it (the head's
//              parameters between forward and backward) or it is persistent (groups of at most
//              param_persistence_threshold elements are kept whole, like stage 2, and gathered
//              once per step after AdamW). The first groups of the next step are prefetched at
//              the end of the optimizer step.
// overlap_comm = false waits for every collective when it is issued.
//
// The host enqueues a Unit while the compute stream runs the one before it (stages 0-2; at stage 3
// it waits for each Unit, whose gathered parameters it then releases). With EngineOptions::timers the
// step reports per-phase times, the communication stream's busy time and the exposed part of it
// (time the host waited on a collective with the compute stream idle).
//
// Backends: the same code drives the cpu and the cuda backend. Everything the engine does to its
// state between the Units' kernels (zeroing, accumulating, rounding, norms, AdamW of a
// device-resident shard) is enqueued on the compute stream through StateKernels
// (state_kernels.hpp); the host reads device memory only through stream-ordered copies.
// The communicator must be of the device's kind (NCCL for cuda).
//
// Threading: one thread drives an Engine. The compute stream and the communicator's stream are
// ordered by events at every hand-off (context.hpp; the pieces behind this class: engine_state.hpp).
#pragma once

#include <functional>
#include <utility>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator.hpp"
#include "offload/aio_options.hpp"
#include "offload/copy_engine.hpp"
#include "offload/aio_options.hpp"
#include "offload/host_memory.hpp"
#include "optim/adam.hpp"
#include "optim/loss_scaler.hpp"
#include "core/unit.hpp"
#include "runtime/engine/param_swap.hpp"
#include "runtime/engine/partition.hpp"
#include "runtime/pipeline/schedule.hpp"

namespace zero {

// Optimizer state on NVMe (EngineOptions::nvme; runtime/engine/optimizer_swap.hpp).
struct NvmeOptimizerOptions {
  std::string path;             // offload_optimizer.nvme_path; empty: the state stays in RAM
  int buffer_count = 4;         // offload_optimizer.buffer_count: pinned swap buffers, >= 1
  bool pipeline_read = false;   // offload_optimizer.pipeline_read: reads overlap AdamW
  bool pipeline_write = false;  // offload_optimizer.pipeline_write: writes overlap AdamW
  // zero_optimization.sub_group_size: the most elements of state swapped (and held in a host
  // buffer) at once; a group larger than this moves in pieces. >= 1.
  int64_t sub_group_size = 1'000'000'000;
  offload::AioOptions aio;      // the "aio" block
  bool enabled() const noexcept { return !path.empty(); }
};

struct EngineOptions {
  int stage = 0;                                // ZeRO stage 0..3
  int gradient_accumulation_steps = 1;
  ScalarType param_type = ScalarType::f32;      // working parameters and gradients: fp32/bf16/fp16
  optim::AdamParams adam;                       // weight_decay: see weight_decay_all
  // false: adam.weight_decay applies to the parameters the model declares (ParamSpec::
  // weight_decay); true: to every parameter (DeepSpeed's single parameter group).
  bool weight_decay_all = false;
  float gradient_clipping = 0.0f;               // max global norm; 0 = off
  std::optional<optim::LossScalerOptions> loss_scaler;  // fp16: dynamic or static scaling
  // The learning rate of the t-th applied optimizer step (t = 1, 2, ...; a skipped fp16
  // overflow step does not count, as in DeepSpeed, nor does it advance Adam's t).
  std::function<float(int64_t t)> lr = [](int64_t) { return 1e-3f; };
  // Adam's (beta1, beta2) for applied step t, when a schedule moves them (OneCycle's
  // cycle_momentum); empty: adam.beta1 / adam.beta2.
  std::function<std::pair<float, float>(int64_t t)> betas;
  uint64_t seed = 0;                            // parameter initialisation (init_param_values)
  std::optional<long long> number_checkpoints;  // activation checkpointing (checkpoint_plan)
  // activation_checkpointing.partition_activations: with tensor slices (TensorPlace), each rank
  // of a tensor group keeps only its 1/T of a checkpointed Unit's input, all-gathered again
  // before the Unit recomputes (the result is bitwise the same). No effect without both, nor on
  // a model whose activations are sharded already (Model::sharded_activations: sequence parallel).
  bool partition_activations = false;
  // activation_checkpointing.cpu_checkpointing: what each checkpointed Unit keeps (its input, or
  // its part with partition_activations) waits in pinned host memory between the Unit's forward
  // and its backward, copied on the side streams (activation_offload.hpp; bitwise the same
  // training). No effect without activation checkpointing.
  bool cpu_checkpointing = false;

  // Communication (zero_optimization keys; elements). Defaults are DeepSpeed's except the
  // persistence threshold, which the config mapping sets (DeepSpeed: 100000).
  bool overlap_comm = true;                      // false: wait for each collective at once
  int64_t reduce_bucket_size = 500'000'000;      // stage 2/3: full gradients in reduction
  int64_t prefetch_bucket_size = 50'000'000;     // stage 3: elements gathered ahead; 0 = none
  int64_t max_live_parameters = 1'000'000'000;   // stage 3: bound on gathered elements
  int64_t param_persistence_threshold = 0;       // stage 3: groups this small stay gathered
  bool timers = false;                           // StepStats::time (wall_clock_breakdown)

  // Offload (offload_optimizer / offload_param with device "cpu"; docs/offload.md):
  // offload_optimizer (stages 1-3): the fp32 master, Adam's m and v and the reduced gradient
  // shard live in host memory and AdamW runs on the host; each group's reduced shard goes down
  // (16-bit) as its reduction completes, the updated 16-bit shard comes back up.
  // offload_param (stage 3, with offload_optimizer): the 16-bit parameter shards live in host
  // memory and are copied up ahead of their all-gather.
  bool offload_optimizer = false;
  bool offload_param = false;
  // offload_param on NVMe (device "nvme"; docs/nvme-offload.md "Parameters on NVMe"): non-empty,
  // the partitioned shards past the first param_max_in_cpu elements (group order) live in files
  // under <param_nvme_path>/zero-swap/rank<r>/, read through at most param_buffer_count pinned
  // buffers of at most param_buffer_size elements (a shard larger than that is refused) ahead
  // of their all-gather and written back after each optimizer step. Bitwise the same training
  // as offload_param on the host. `aio`: the file engine's settings (the config's "aio" block).
  std::string param_nvme_path;
  int param_buffer_count = 5;
  int64_t param_buffer_size = 100'000'000;
  int64_t param_max_in_cpu = 1'000'000'000;
  offload::AioOptions aio;
  offload::PinPolicy pin = offload::PinPolicy::preferred;
  int host_threads = 0;  // AdamW's oneTBB threads (offload/thread_budget.hpp); 0 = the default
  // offload_optimizer: run each group's host AdamW as soon as its final gradient has landed,
  // during backward, into a second copy of master, m and v (12 bytes per parameter of the
  // shard, host), guessing that the step will be applied unclipped; kept when the global norm
  // agrees, dropped (and AdamW run again after the norm) when it does not. Results are bitwise
  // the same either way. After a clipped or skipped step the next step does not guess.
  // (zero_train.speculative_host_step; docs/offload.md.)
  bool speculative_host_step = true;
  // offload_optimizer with device "nvme" (docs/nvme-offload.md, "Optimizer state on NVMe"):
  // master, m and v in swap files under nvme.path instead of host RAM. Empty path: host RAM.
  NvmeOptimizerOptions nvme;
};

// The checks Engine's constructor makes on its options alone (stage, accumulation, bucket sizes,
// parameter type, the offload combinations), for callers that want them before they open a
// device (zero-train --validate). Throws zero::Error naming the ds_config.json key.
void check_engine_options(const EngineOptions& o);

struct StepStats {
  int64_t step = 0;         // optimizer steps taken (skipped ones included)
  double loss = 0;          // mean loss over this rank's micro-batches
  float grad_norm = 0;      // global norm of the (unscaled, averaged) gradient
  float lr = 0;
  double loss_scale = 1;     // the scale this step's gradients were computed at
  double next_loss_scale = 1;  // the scale of the next step (fp16 dynamic: lower after an overflow)
  bool applied = true;      // false: non-finite gradients (fp16 overflow, bf16 check), step skipped
  // Offload with speculative_host_step: whether this step's AdamW ran during backward and was
  // kept, ran and was dropped (clipping, overflow), or did not run ahead.
  enum class Speculation { none, kept, dropped } speculation = Speculation::none;
  // Seconds, filled with EngineOptions::timers. forward/backward/optimizer: the host's time in
  // each phase (waits included). comm_busy: the communicator's stream running this engine's
  // collectives since the previous step's report; comm_exposed: the host waiting on a
  // collective while the compute stream was idle. hidden() = 1 - exposed / busy.
  // With offload: d2h / h2d, the host waiting for gradient copies down / parameter copies up;
  // host_adam, the host optimizer thread's time in AdamW; host_adam_waited, the part of it the
  // driving thread spent blocked waiting for AdamW (the rest overlapped other work).
  struct Times {
    double forward = 0, backward = 0, optimizer = 0, comm_busy = 0, comm_exposed = 0;
    double d2h = 0, h2d = 0, host_adam = 0, host_adam_waited = 0;
    // Pipeline stages: the whole step on the host (wall), and the part the host was blocked on
    // a neighbouring stage (a receive it needed, or its sends at the end): the stage's measured
    // bubble is p2p_wait / step.
    double step = 0, p2p_wait = 0;
    double bubble() const noexcept { return step > 0 ? p2p_wait / step : 0.0; }
    double hidden() const noexcept { return comm_busy > 0 ? 1.0 - comm_exposed / comm_busy : 1.0; }
    double host_adam_hidden() const noexcept {
      return host_adam > 0 ? 1.0 - host_adam_waited / host_adam : 1.0;
    }
  } time;
};

// Where an Engine sits in a pipeline (docs/pipeline.md, "Composition"): it was built over one
// stage's view of the model (pipeline::stage_model), and its communicator is the stage's
// data-parallel group. make_pipeline_stage (pipeline_stage.hpp) fills this from a cut and the
// grid's pipeline communicator.
struct PipelinePlace {
  coll::Communicator* pipe = nullptr;  // this data-parallel index's stages; rank in it = stage
  int stage = 0, stages = 1;
  // The view's parameter index -> the whole model's (pipeline::StageModel::to_original): the
  // index checkpoints save under and the order the global norm sums in.
  std::vector<int> to_original;
  // Parameters another stage holds a copy of (a GPT's wte: the embedding on the first stage, the
  // head on the last), as view indices. Their gradients are summed over `tied_comm` (the stages
  // holding them, same data-parallel index) before the data-parallel reduction, so every copy
  // takes the same step; the lowest of those stages (`owns_tied`) counts them in the norm and
  // saves them.
  std::vector<int> tied;
  coll::Communicator* tied_comm = nullptr;
  bool owns_tied = true;
  bool active() const noexcept { return pipe != nullptr; }
  int prev() const noexcept { return stage > 0 ? stage - 1 : -1; }
  int next() const noexcept { return stage + 1 < stages ? stage + 1 : -1; }
};

// Where an Engine sits on the tensor axis (docs/tensor-parallel.md, "The engine"): its model is
// one tensor rank's part of the whole (models::make_gpt_tensor_parallel): every parameter's
// ParamSpec::slice is sliced or replicated, with rank comm->rank() and degree comm->size(). The
// Units run the tensor collectives themselves; the Engine's communicator is the data-parallel
// group of this (tensor, pipeline) coordinate, and the Engine adds what spans the tensor group:
// the gradient norm (and with it the overflow check and clipping) is summed over `comm`, a
// replicated parameter counted once (by tensor rank 0: its gradient is the same on every rank
// of the group, computed from the same whole tensors). The checkpoint pieces of a sliced
// parameter are mapped to the whole parameter's elements, a replicated one is saved by tensor
// rank 0, and set_parameters takes whole values and keeps this rank's slice.
struct TensorPlace {
  coll::Communicator* comm = nullptr;  // the grid's tensor communicator; null: no tensor axis
  bool active() const noexcept { return comm != nullptr && comm->size() > 1; }
};

class Engine {
 public:
  // `model` (its Units enqueue on `compute`), `device`, `compute` and `comm` must outlive the
  // Engine. `comm` is a communicator over the data-parallel ranks (rank i owns shard i).
  // Allocates and initialises the model state. Throws zero::Error for a bad option, OutOfMemory
  // when the state does not fit the device.
  // `place`: this Engine is one pipeline stage (above); its pointers must outlive the Engine.
  // `tensor`: the model is one tensor rank's slice (above); the communicator must outlive the
  // Engine and be of the device's kind. Throws zero::Error when a parameter's slice disagrees
  // with it (another rank or degree, or a sliced model without a tensor communicator).
  Engine(Model& model, Device& device, Stream& compute, coll::Communicator& comm,
         EngineOptions options, PipelinePlace place = {}, TensorPlace tensor = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // One optimizer step: micro-batches m = 0 .. gradient_accumulation_steps-1 from next(m)
  // (already on the device), each forward then backward; then reduction, clipping and AdamW.
  // Collective: every rank calls it.
  StepStats step(const std::function<Batch(int micro)>& next);

  // One pipeline stage's part of one optimizer step (docs/pipeline.md, "The executor"): this
  // Engine was built with a PipelinePlace and runs `list` (its stage's instructions, e.g.
  // pipeline::one_f_one_b(p, m, stage)) in order, exchanging boundary tensors with the
  // neighbouring stages over place.pipe. next(mb) is asked at `load` (the first stage needs the
  // features, the last the targets; both get the same micro-batch). Activations travel with a
  // small header (scalar type and shape) so a receiver needs no knowledge of the model; a
  // gradient has the shape of the activation this stage sent. Collective over the whole grid:
  // every rank calls it with its stage's list. The gradient norm, the overflow check and the
  // loss cover all stages (StepStats::loss is the mean loss of the step on every stage).
  StepStats pipeline_step(const pipeline::Stage& list, const std::function<Batch(int micro)>& next);

  // The current fp32 value of parameter p (the master copy), gathered from the ranks that own
  // it. Collective over the engine's communicator. In a pipeline p is an index into this
  // stage's VIEW (the model the Engine was built over; the whole model's parameter
  // place.to_original[p]). On a tensor rank, this rank's slice (the ParamSpec's shape).
  std::vector<float> parameter(int p);

  // Per-rank model-state bytes this engine holds between steps, by ledger category: the ZeRO
  // paper's formula evaluated for the padded parameter count Psi_p (a multiple of the world size),
  // stage, world size N and dtype (e bytes):
  //   parameters  e Psi_p (stage 0-2), e Psi_p / N (stage 3)
  //   gradients   e Psi_p (stage 0-1; + 4 Psi_p, the fp32 sum of the micro-batches, with 16-bit
  //               parameters and accumulation), at stage 2-3 a shard: e Psi_p / N with one
  //               micro-batch per step, 4 Psi_p / N (fp32 accumulator) with accumulation
  //   master      4 Psi_p (stage 0) or 4 Psi_p / N; none with fp32 parameters (e = 4: the
  //               parameters are the master copy)
  //   optimizer   8 Psi_p (stage 0) or 8 Psi_p / N   (Adam m and v)
  // With bf16/fp16 and one micro-batch that is 16 Psi, 4 Psi + 12 Psi/N, 2 Psi + 14 Psi/N and
  // 16 Psi / N: the paper's K = 12. At stage 3 a persistent group (param_persistence_threshold)
  // counts e Psi_g whole instead of its shard. During a step, on top of this: activations, and
  // at stage 2/3 full gradient buffers (the tied embedding's group, the Unit being computed and
  // the groups in reduction, at most reduce_bucket_size elements or one group), at stage 3 the
  // gathered parameters (at most max_live_parameters elements plus the current Unit's groups):
  // transient_bound() bounds them.
  struct ModelStateBytes {
    size_t parameters = 0, gradients = 0, master = 0, optimizer = 0;
    size_t total() const noexcept { return parameters + gradients + master + optimizer; }
  };
  ModelStateBytes expected_model_state() const;
  // With offload: the model state in host memory (ledger: host column), by the same categories:
  //   parameters  e Psi_o (the updated 16-bit shard on its way up; none with the optimizer state
  //               on NVMe, which writes it over the landed gradient) + with offload_param the
  //               partitioned groups' shards (on NVMe: those kept under param_max_in_cpu, plus
  //               the swap buffers, min(param_buffer_count, shards on the drive) x the largest
  //               of those shards rounded up to 4096 bytes)
  //   gradients   e Psi_o (the reduced shard as it lands) + 4 Psi_o (fp32 accumulator, stage 2/3
  //               with accumulation)
  //   master      4 Psi_o; optimizer 8 Psi_o        (Psi_o = Psi_p / N, this rank's shard)
  //               each twice with speculative_host_step (the second copy AdamW writes ahead)
  // and expected_model_state() is then what stays on the device: the parameters (none of the
  // partitioned groups with offload_param) and at stage 1 the full gradient. Without offload:
  // all zero.
  ModelStateBytes expected_host_state() const;
  // Bytes the offload path moved since construction (D2H: gradients; H2D: updated parameters,
  // and with offload_param the shards ahead of their all-gathers). Zero without offload.
  offload::CopyCounters offload_traffic() const;
  // offload_param on NVMe: bytes of parameter shards on the drive, read and written since
  // construction, and the swap buffers' host bytes (zeros without it).
  engine::ParamNvmeCounters param_nvme_counters() const;
  // With the optimizer state on NVMe (EngineOptions::nvme): its files on the drive by the same
  // categories (master 4 Psi_o, optimizer 8 Psi_o, each sub-group's array padded to 4096 bytes);
  // with it, expected_host_state() holds no master and, as optimizer, only the swap buffers
  // ((buffer_count + 1) x the largest sub-group's 12 bytes per element). Zero without.
  ModelStateBytes expected_nvme_state() const;
  // The NVMe swaps' traffic since construction (optimizer state and parameter shards): bytes
  // read and written, their files' bytes; of the optimizer state's swap: seconds
  // of I/O (summed over requests; busy: wall time with any in flight), and the part the host
  // optimizer thread waited for (I/O not hidden behind AdamW): hidden = 1 - exposed / busy.
  // Completed I/O only: the last groups' write-backs may still run into the next step, unless
  // `settle` waits for them first (exact per-step counts, at the cost of that overlap).
  struct NvmeTraffic {
    uint64_t read = 0, written = 0, on_drive = 0;
    double io_seconds = 0, busy_seconds = 0, exposed_seconds = 0;
  };
  NvmeTraffic nvme_traffic(bool settle = false) const;
  // The most bytes the pooled transient buffers (ledger: comm_buffers) can reach, from the
  // partition and the communication options above.
  size_t transient_bound() const;
  // Rank 0's start-up report: the formula line and the device's ledger table.
  std::string memory_report() const;

  // Checkpoints (runtime/checkpoint; docs/checkpoint-format.md). Collective over `host_comm`, a
  // cpu (MPI) communicator over the same ranks as the engine's (on the cpu backend the engine's
  // own); for a pipeline stage, over the whole grid (every stage's every data-parallel rank, the
  // world). Call between steps.
  //
  // Pipelines ("Pipeline checkpoints" in the format doc): a checkpoint is always the WHOLE
  // model's, in the format a data-parallel run writes: each stage saves the pieces of its view's
  // parameters under the whole model's indices and names (the table is assembled from every
  // stage), a tied parameter (a GPT's wte) once, by the stage with place.owns_tied; the counters
  // and rank 0's metadata once. The layout (stages, data-parallel size, cut) is recorded in the
  // metadata (engine.pipeline) for information only. load_checkpoint reads it, or any
  // data-parallel checkpoint, at any depth and data-parallel size: each stage takes its view's
  // parameters (every holder of a tied one gets the same values); a plain Engine loads a
  // pipeline checkpoint likewise.
  //
  // save_checkpoint writes dir/tag: per parameter element, the fp32 master (the working
  // parameters themselves when they are fp32 without offload), Adam's exp_avg and exp_avg_sq, as
  // pieces of the rank that owns them (stage 0: rank 0 writes all); the manifest's metadata holds
  // the engine's counters (steps, applied steps, which drive Adam's t and the LR schedule), the
  // loss scaler's state, and `user_metadata` (a JSON object: the caller's data position etc.).
  // Atomic: a crash at any point leaves the previous checkpoints of dir loadable. A state that
  // holds a NaN or infinity is not saved: zero::Error on every rank, nothing written.
  // load_checkpoint refuses such values as well (a damaged checkpoint), naming the rank file.
  //
  // load_checkpoint restores all of that from dir/tag, saved at any world size and stage (the
  // checkpoint re-slices to this partition); the working parameters become the master rounded
  // to the parameter type, exactly what the step that saved had. Returns user_metadata. Throws
  // zero::Error on every rank when any rank fails (a missing, incomplete or corrupt checkpoint,
  // another model), naming the file and the failing rank; the engine is unchanged then.
  void save_checkpoint(const std::string& dir, const std::string& tag, coll::Communicator& host_comm,
                       const std::string& user_metadata = "{}");
  std::string load_checkpoint(const std::string& dir, const std::string& tag,
                              coll::Communicator& host_comm);
  int64_t steps_taken() const noexcept;    // optimizer steps so far (skipped ones included)
  // Bytes save_checkpoint writes from this rank (checkpoint::save_bytes of its request: its rank
  // file exactly, a bound of its part of the manifest); summed over the ranks, what one
  // checkpoint needs on disk. Not collective; reads no state.
  uint64_t checkpoint_bytes() const;

  // Replaces every parameter's value (values[p]: parameter p, whole, row-major, as
  // checkpoint::import_safetensors returns them): the fp32 master and the working copy; Adam's
  // moments start at zero again. Collective over the engine's communicator; between steps.
  // In a pipeline, values is indexed by the WHOLE model's parameters (every stage is passed the
  // same vector, e.g. import_safetensors of the whole model's table, as zero-train's
  // --init-from does) and the stage takes values[place.to_original[i]] for its view's
  // parameter i; the others are not read (they may be empty).
  void set_parameters(const std::vector<std::vector<float>>& values);

  // The mean loss of `batch` under the current parameters: forward only, nothing changes
  // (evaluation on held-out data). With `argmax`, also the model's most likely next token at
  // every position (the last Unit's output read as logits [.., V]; ties to the lower id), for
  // exact-match scoring. Collective at stage 3 (the Units' groups are gathered); between steps.
  double evaluate(const Batch& batch, std::vector<int32_t>* argmax = nullptr);
  // evaluate() for an Engine built with a PipelinePlace (pipeline_evaluate.cpp): the stage's
  // Units forward on the previous stage's activation (the first stage: on `batch`), the output
  // sent to the next stage; the last stage computes the loss (and `argmax`), and both are
  // broadcast over place.pipe, so every stage returns the same. `batch` matters on the first
  // stage (tokens) and the last (targets) only. Collective over the pipeline (and, at stage 3,
  // the stage's data group): every stage calls it with the same `argmax` (null or not).
  double pipeline_evaluate(const Batch& batch, std::vector<int32_t>* argmax = nullptr);

  const Partition& partition() const noexcept;
  const EngineOptions& options() const noexcept;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace zero
