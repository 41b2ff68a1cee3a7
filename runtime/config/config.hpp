// The run's configuration: a DeepSpeed ds_config.json, read into one struct per JSON block.
//
// Users bring the config they already have (docs/config.md has the key table): DeepSpeed's
// key names, defaults, batch-size rule, "auto" values and deprecated aliases. Every
// default lives in exactly one place, the member initializers below; every block is read,
// validated and printed by one function (blocks.cpp, zero_block.cpp).
//
// Reading never stops at the first problem: parse_config() returns every error and warning it
// found, each with the JSON path it is about, the offending value and what was expected.
//   - an unknown key inside a block we know (zero_optimization, offload_optimizer,
//     offload_param, fp16, bf16, optimizer, optimizer.params, scheduler, scheduler.params, aio,
//     activation_checkpointing, pipeline, zero_train, zero_train.model, zero_train.parallel) is
//     an error that names the nearest valid key of that block;
//   - an unknown top-level key is a warning (DeepSpeed ignores them too), with a did-you-mean
//     when a known key is close; DeepSpeed features we do not implement (tensorboard, wandb,
//     flops_profiler, ...) get one "ignored" warning each;
//   - keys DeepSpeed accepts that we do not implement yet are accepted, with one warning when
//     set to a non-default value; NVMe offload is accepted and runs as cpu offload (warned);
//   - deprecated aliases (zero_optimization: true|false|N, cpu_offload, cpu_offload_param(s),
//     cpu_offload_use_pin_memory, stage3_gather_fp16_weights_on_model_save, bfloat16,
//     aio.thread_count) are accepted with one warning naming the new key; an alias and its new
//     key both present with different values is an error.
//
// "auto" (Hugging Face Trainer style) resolves as follows; on any other key it is an error:
//   batch keys            from the other batch keys and flags; micro 1 and accumulation 1
//                         when nothing else decides them
//   optimizer.params      lr (or --lr), betas, eps, weight_decay: the defaults below
//   scheduler.params      warmup_min_lr 0, warmup_max_lr = optimizer lr, warmup_num_steps =
//                         flag or 0 (Hugging Face's default; the schedules count 0 and 1 as 2,
//                         as DeepSpeed does), total_num_steps = the job's steps (zero_train.steps)
//   gradient_clipping     1.0
//   fp16/bf16.enabled     bf16 when Environment::bf16_supported, else fp32; an explicit value
//                         in the other block wins (fp16 true keeps fp16, bf16 false keeps fp32)
//   reduce_bucket_size h*h, stage3_prefetch_bucket_size 0.9*h*h, stage3_param_persistence_
//                         threshold 10*h, h = zero_train.model's n_embd
//
// Batch rule: train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps
// x the data-parallel size, Environment::world_size / (pipeline x tensor). Any two give the third; train_batch_size or the micro-batch alone
// means accumulation 1; accumulation alone or nothing is an error (as in DeepSpeed) unless a
// batch key is "auto" or a flag gives the micro-batch. A mismatch is one error at path
// "train_batch_size" that prints all four numbers.
//
// Command-line flags (Environment::*_flag) fill keys that are absent or "auto"; a flag that
// disagrees with an explicit value in the file is an error naming both. Environment::overrides
// replace parts of the file outright (zero-train's --model, --seed, --device).
//
// Numbers that would overflow later are errors now (runtime/config/limits.hpp, docs/config.md):
// batch keys and their product at most 2^31 - 1, learning rates in [0, 1], numbers beyond a
// double (1e999), model and activation sizes within 2^53 elements. Reading is linear in the
// text's size: unknown and duplicate keys are listed up to 20 per object, then counted.
//
// Our own section. DeepSpeed ignores unknown top-level keys, so a DeepSpeed config runs here
// unchanged and a config with this section still runs under DeepSpeed:
//
//   "zero_train": {
//     "device": "auto",                 // "auto" (cuda when a GPU is present) | "cpu" | "cuda"
//     "device_memory_limit": 0,         // bytes (integer) or "24GiB", "512MiB", "1.5GB";
//                                       // 0 = the device's real capacity
//     "host_memory_limit": 0,           // the same, for pinned + pageable host memory;
//                                       // 0 = the rank's memory budget (offload/memory_budget.hpp)
//     "steps": 100,                     // optimizer steps to run
//     "max_consecutive_skipped_steps": 20, // stop after this many non-finite steps in a row
//     "weight_decay_applies_to": "matrices",  // or "all": see Ours::weight_decay_all
//     "model": {"preset": "tiny"},      // a preset (models/gpt_shape.hpp), optionally with
//                                       // n_layer/n_embd/n_head/vocab_size/seq_len overriding
//                                       // it; without "preset" all five are required
//     "parallel": {                     // the process grid (collectives/grid.hpp)
//       "pipeline": 1,                  // stages; world / (pipeline x tensor) = data-parallel
//       "tensor": 1,                    // 1 only (tensor slicing comes with issue 19)
//       "data": "auto",                 // derived; a number given must equal it
//       "schedule": "1f1b",             // "gpipe" | "1f1b" | "zb-h1"
//       "partition": "parameters"       // "uniform" | "parameters" | "flops"
//     }
//   }
//
// DeepSpeed's top-level "pipeline" block is read too: "stages" as zero_train.parallel.pipeline
// and "partition" ("uniform", "parameters"; "best", its default, = not given) as
// zero_train.parallel.partition, an error when both places are given and disagree; its other
// keys are accepted, without effect (DsPipeline).
//
// Thread-safety: parse_config and friends are pure functions of their arguments (no globals);
// a Config is a plain value.
#pragma once

#include <array>
#include <climits>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "models/gpt_shape.hpp"
#include "core/device_kind.hpp"

namespace zero::config {

// ---- diagnostics and what a config is resolved against ----------------------------------------

struct Diagnostic {
  enum class Severity { warning, error };
  Severity severity;    // error: the config is not valid; warning: valid, but the user should know
  std::string path;     // JSON path ("zero_optimization.offload_optimizer.device"); "" = the file
  std::string message;  // what is wrong, the offending value, what is expected
};

// What the config is resolved against. The flags come from the command line; empty = not given.
struct Environment {
  int world_size = 1;  // MPI ranks, all of them; data-parallel size = this / (pipeline x tensor)
  bool bf16_supported = true;                            // decides fp16/bf16 "auto"
  // Parts of the file the command line replaces before anything is read (zero-train's --model,
  // --seed, --device), so that everything derived from them ("auto" bucket sizes from n_embd)
  // agrees. Applied in order; a path whose parent is not an object in the file is left alone
  // (the reader reports the parent).
  struct Override {
    std::string path;    // JSON path of the key replaced ("zero_train.model"); parents created
    std::string json;    // its new value, as JSON text
    std::string origin;  // the flag, for messages ("--model my_model.json")
  };
  std::vector<Override> overrides;
  std::optional<long long> micro_batch_flag;             // train_micro_batch_size_per_gpu
  std::optional<long long> grad_accum_flag;              // gradient_accumulation_steps
  std::optional<long long> steps_flag;                   // zero_train.steps
  std::optional<long long> warmup_steps_flag;            // scheduler.params.warmup_num_steps
  std::optional<double> lr_flag;                         // optimizer.params.lr
  std::optional<double> watchdog_timeout_flag;           // zero_train.watchdog_timeout
};

// ---- the blocks ---------------------------------------------------------------------------------

enum class Precision { fp32, fp16, bf16 };
std::string_view to_string(Precision p) noexcept;

// train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps (top level),
// always resolved: train_batch_size == micro x accumulation x world size.
struct Batch {
  long long train_batch_size = 1;                // samples per optimizer step, all ranks together
  long long train_micro_batch_size_per_gpu = 1;  // samples per rank per forward/backward
  long long gradient_accumulation_steps = 1;     // micro-batches per optimizer step
};

// "fp16": 16-bit parameters and compute with (dynamic) loss scaling.
struct Fp16 {
  bool enabled = false;                        // fp16 params/compute
  bool auto_cast = false;                      // not implemented: cast module inputs to fp16
  double loss_scale = 0.0;                     // 0 = dynamic scaling, else this static scale
  int initial_scale_power = 16;                // dynamic: the first scale is 2^this
  long long loss_scale_window = 1000;          // clean steps before the scale doubles
  int hysteresis = 2;                          // overflows tolerated before the scale halves
  bool consecutive_hysteresis = false;         // refill hysteresis on every clean step
  double min_loss_scale = 1.0;                 // the floor: reaching it is a clear error
  bool fp16_master_weights_and_grads = false;  // not implemented: fp16 master copy
};

// "bf16" (old name "bfloat16"): bf16 parameters and compute, no loss scaling.
struct Bf16 {
  bool enabled = false;                // bf16 params/compute
  bool immediate_grad_update = false;  // not implemented: apply grads as they arrive
  bool check_grad_overflow = false;    // not implemented: overflow check in bf16
};

enum class OptimizerType { Adam, AdamW };
std::string_view to_string(OptimizerType t) noexcept;

// "optimizer.params" for Adam and AdamW.
struct AdamParams {
  double lr = 1e-3;                         // learning rate (the schedule's base)
  std::array<double, 2> betas{0.9, 0.999};  // moment decay rates, each in [0, 1)
  double eps = 1e-8;                        // added to sqrt(v)
  double weight_decay = 0.0;                // decoupled (AdamW) or L2 (adam_w_mode false)
  bool adam_w_mode = true;                  // decoupled weight decay; forced true by AdamW
  bool bias_correction = true;              // divide the moments by 1 - beta^t
  bool amsgrad = false;                     // not supported: true is an error
  bool torch_adam = false;                  // not implemented: DeepSpeed's torch.optim switch
};

// "optimizer". Absent: AdamW with the defaults above.
struct Optimizer {
  OptimizerType type = OptimizerType::AdamW;  // "Adam" or "AdamW", case-insensitive
  AdamParams params;                          // "params"
  bool legacy_fusion = false;                 // not implemented: DeepSpeed's old fused path
};

// ---- "scheduler": DeepSpeed's LR schedules, DeepSpeed's parameter names and defaults ---------

enum class WarmupType { log, linear };  // log: min + (max-min)*ln(step+1)/ln(N); linear

struct WarmupLR {
  double warmup_min_lr = 0.0;                   // LR at step 0
  double warmup_max_lr = 1e-3;                  // LR after warmup (stays there)
  long long warmup_num_steps = 1000;            // warmup length N
  WarmupType warmup_type = WarmupType::log;     // "log" or "linear"
  long long last_batch_iteration = -1;          // resume point; -1 = fresh start
};

struct WarmupDecayLR : WarmupLR {
  long long total_num_steps = 0;  // required: LR decays linearly back to warmup_min_lr here
};

struct WarmupCosineLR {
  long long total_num_steps = 0;             // required: end of the cosine
  double warmup_min_ratio = 0.0;             // LR at step 0, as a ratio of the optimizer lr
  long long warmup_num_steps = 1000;         // warmup length
  double cos_min_ratio = 1e-4;               // LR at the end, as a ratio of the optimizer lr
  WarmupType warmup_type = WarmupType::log;  // "log" or "linear"
  long long last_batch_iteration = -1;       // resume point; -1 = fresh start
};

struct OneCycle {
  double cycle_min_lr = 0.0;               // required: LR at the cycle's ends
  double cycle_max_lr = 0.0;               // required: LR at the cycle's peak
  double decay_lr_rate = 0.0;              // LR decay after the cycle
  long long cycle_first_step_size = 2000;  // steps of the rising half
  long long cycle_second_step_size = 2000;  // steps of the falling half (absent: = first)
  long long cycle_first_stair_count = 0;   // stairs in the rising half (0 = smooth)
  long long cycle_second_stair_count = 0;  // stairs in the falling half (absent: = first)
  long long decay_step_size = 0;           // steps between decays after the cycle
  bool cycle_momentum = true;              // cycle beta1 inversely to the LR
  double cycle_min_mom = 0.8;              // momentum at the LR peak
  double cycle_max_mom = 0.9;              // momentum at the cycle's ends
  double decay_mom_rate = 0.0;             // momentum decay after the cycle
  long long last_batch_iteration = -1;     // resume point; -1 = fresh start
};

struct LRRangeTest {
  double lr_range_test_min_lr = 1e-3;        // starting LR
  long long lr_range_test_step_size = 2000;  // steps per increase
  double lr_range_test_step_rate = 1.0;      // increase per step_size
  bool lr_range_test_staircase = false;      // stepwise instead of continuous
  long long last_batch_iteration = -1;       // resume point; -1 = fresh start
};

struct Scheduler {
  // monostate: no "scheduler" block, the LR stays at optimizer.params.lr.
  std::variant<std::monostate, WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest>
      params;

  bool enabled() const noexcept { return params.index() != 0; }
  std::string_view type_name() const noexcept;  // "WarmupLR", ...; "" when none
};

// ---- "zero_optimization" ----------------------------------------------------------------------

enum class OffloadDevice { none, cpu, nvme };
std::string_view to_string(OffloadDevice d) noexcept;

// "zero_optimization.offload_optimizer": fp32 master weights, Adam moments and the optimizer
// step on the host. nvme: master and moments in swap files under nvme_path (stages 1-3;
// docs/nvme-offload.md).
struct OffloadOptimizer {
  OffloadDevice device = OffloadDevice::none;  // none, cpu or nvme (stages 1-3)
  std::optional<std::string> nvme_path;        // nvme only: a directory on a fast drive
  long long buffer_count = 4;                  // nvme only: swap buffers
  bool pin_memory = true;                      // page-locked host buffers
  bool pipeline_read = false;                  // nvme: reads overlap host AdamW
  bool pipeline_write = false;                 // nvme: writes overlap host AdamW
  bool fast_init = false;                      // not implemented: nvme fast init
  double ratio = 1.0;                          // not implemented: share of states offloaded

  bool enabled() const noexcept { return device != OffloadDevice::none; }
};

// "zero_optimization.offload_param" (stage 3 only): the 16-bit parameter shards on the host, or
// with "nvme" in files under nvme_path beyond max_in_cpu elements (docs/nvme-offload.md).
struct OffloadParam {
  OffloadDevice device = OffloadDevice::none;  // none, cpu or nvme; stage 3 only
  std::optional<std::string> nvme_path;        // nvme only
  long long buffer_count = 5;                  // nvme only: swap buffers
  long long buffer_size = 100'000'000;         // nvme only: elements per swap buffer
  long long max_in_cpu = 1'000'000'000;        // nvme only: elements kept in host RAM
  bool pin_memory = true;                      // page-locked host buffers

  bool enabled() const noexcept { return device != OffloadDevice::none; }
};

struct Zero {
  int stage = 0;                                       // 0, 1, 2, 3
  bool contiguous_gradients = true;                    // gradients copied into one flat buffer
  bool reduce_scatter = true;                          // reduce-scatter, not all-reduce, stages 1-2
  long long reduce_bucket_size = 500'000'000;          // elements per gradient bucket
  bool allgather_partitions = true;                    // all-gather, not broadcasts, after the step
  long long allgather_bucket_size = 500'000'000;       // elements per all-gather bucket
  bool overlap_comm = false;                           // own stream; absent: true iff stage 3
  bool round_robin_gradients = false;                  // spread gradient copies over ranks
  long long sub_group_size = 1'000'000'000;            // elements per optimizer sub-group
  OffloadOptimizer offload_optimizer;                  // "offload_optimizer"
  OffloadParam offload_param;                          // "offload_param"
  long long stage3_prefetch_bucket_size = 50'000'000;  // elements prefetched ahead (0 = none)
  long long stage3_param_persistence_threshold = 100'000;  // params this small stay gathered
  long long stage3_model_persistence_threshold = LLONG_MAX;  // bound on all kept gathered
  long long stage3_max_live_parameters = 1'000'000'000;  // bound on elements gathered at once
  long long stage3_max_reuse_distance = 1'000'000'000;   // keep what is reused this soon
  bool stage3_gather_16bit_weights_on_model_save = false;  // consolidated 16-bit model on save
  // Accepted for DeepSpeed compatibility, not implemented (warned when not the default):
  bool load_from_fp32_weights = true;                  // restore master weights from fp32
  bool elastic_checkpoint = false;                     // re-slice optimizer state on load
  bool ignore_unused_parameters = true;                // tolerate params without gradients
  bool legacy_stage1 = false;                          // DeepSpeed's old stage 1
  bool use_multi_rank_bucket_allreduce = true;         // DeepSpeed's bucket all-reduce variant
  long long zero_hpz_partition_size = 1;               // ZeRO++ hierarchical partition
  bool zero_quantized_weights = false;                 // ZeRO++ quantized weights
  bool zero_quantized_nontrainable_weights = false;    // ZeRO++ quantized frozen weights
  bool zero_quantized_gradients = false;               // ZeRO++ quantized gradients
  long long mics_shard_size = -1;                      // MiCS shard group size (-1 = off)
  bool mics_hierarchical_params_gather = false;        // MiCS hierarchical gather
  bool memory_efficient_linear = true;                 // DeepSpeed's linear autograd function
  bool pipeline_loading_checkpoint = false;            // pipelined checkpoint load
  bool override_module_apply = true;                   // stage-3 module.apply hook
  long long stage3_module_granularity_threshold = 0;   // leaf-module fetch granularity
  bool stage3_use_all_reduce_for_fetch_params = false; // all-reduce instead of all-gather
  bool log_trace_cache_warnings = false;               // stage-3 trace cache logging
};

// "aio": the NVMe swapper's async I/O (optimizer state and parameters on NVMe).
struct Aio {
  long long block_size = 1'048'576;     // bytes per I/O request
  long long queue_depth = 8;            // requests in flight
  long long intra_op_parallelism = 1;   // I/O threads (old name: thread_count)
  bool single_submit = false;           // submit requests one at a time
  bool overlap_events = true;           // overlap submission and completion
  bool use_gds = false;                 // GPUDirect Storage
};

// "activation_checkpointing": number_checkpoints selects how many transformer blocks keep only
// their input and recompute their activations in backward (zero::checkpoint_plan spreads them
// evenly; null or 0 = none, >= n_layer = all). The other knobs are accepted and warned about.
struct ActivationCheckpointing {
  bool partition_activations = false;             // checkpointed inputs split over the tensor group
  bool contiguous_memory_optimization = false;    // not implemented: one buffer for them
  bool cpu_checkpointing = false;                 // keep them in pinned host memory
  std::optional<long long> number_checkpoints;    // checkpointed blocks; null = none
  bool synchronize_checkpoint_boundary = false;   // device sync at each checkpoint
  bool profile = false;                           // time the checkpointed forwards
};

// ---- the process grid: "zero_train.parallel" and DeepSpeed's "pipeline" ----------------------

// The pipeline's schedule (issue 18): fill-drain (GPipe), one-forward-one-backward, and the
// zero-bubble ZB-H1 (backward split into input- and weight-gradient passes).
enum class PipelineSchedule { gpipe, one_f_one_b, zb_h1 };  // "gpipe", "1f1b", "zb-h1"
std::string_view to_string(PipelineSchedule s) noexcept;

// How the model's Units are cut into stages: the same number of Units per stage, balanced
// parameter counts (DeepSpeed's "uniform" and "parameters"), or balanced FLOPs.
enum class StagePartition { uniform, parameters, flops };
std::string_view to_string(StagePartition p) noexcept;

// "zero_train.parallel": the world as data x pipeline x tensor ranks (collectives/grid.hpp),
// always resolved: data * pipeline * tensor == Environment::world_size.
struct Parallel {
  int pipeline = 1;  // pipeline stages (DeepSpeed: pipeline.stages); at most the model's Units
  int tensor = 1;    // tensor slices (Megatron's tensor-model-parallel size; docs/tensor-parallel.md)
  // With tensor > 1: LayerNorm/residual regions split by token across the tensor group
  // (Korthikanti et al.; models::GptOptions::sequence_parallel).
  bool sequence_parallel = false;
  int data = 1;      // derived: world / (pipeline x tensor); given, it must equal that
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;  // "schedule"
  StagePartition partition = StagePartition::parameters;      // DeepSpeed's default method
};

// DeepSpeed's own top-level "pipeline" block. Its "stages" and "partition" are read into
// zero_train.parallel (they mean the same; both given and different is an error); these four
// are accepted and warned about when not the default: they tune DeepSpeed's PipelineModule
// (per-layer seeds, its own checkpoint interval) and its tensor-parallel boundary transfers.
struct DsPipeline {
  bool seed_layers = false;                      // no effect: a seed per layer
  long long activation_checkpoint_interval = 0;  // no effect: see activation_checkpointing
  bool pipe_partitioned = true;                  // no effect: split activations over tensor ranks
  bool grad_partitioned = true;                  // no effect: split gradients over tensor ranks
};

// "zero_train": our own section (see the top of this file for its JSON shape).
struct Ours {
  std::optional<DeviceKind> device;   // nullopt = "auto": cuda when a GPU is present, else cpu
  long long device_memory_limit = 0;  // bytes the run may use on the device; 0 = its capacity
  long long host_memory_limit = 0;    // bytes the run may use on the host; 0 = the rank's budget
  // Which parameters optimizer.params.weight_decay applies to: false = "matrices", those the
  // model declares (ParamSpec::weight_decay: weight matrices and embeddings, not biases or
  // LayerNorm gains; as Hugging Face's Trainer and Megatron do); true = "all", as DeepSpeed does
  // with a plain "optimizer" block (one parameter group). Key "weight_decay_applies_to".
  bool weight_decay_all = false;
  long long steps = 100;              // optimizer steps to run (also "auto" total_num_steps)
  // offload: host AdamW during backward (EngineOptions). Absent or null: on for cuda, off on the
  // cpu backend, where it would run on the cores backward uses and only cost the second bank
  // (docs/offload.md, "On the cpu backend").
  std::optional<bool> speculative_host_step;
  double watchdog_timeout = 20;       // s of a rank's silence before the job ends; 0 = off
  // Stop the run (exit 1) when this many optimizer steps in a row did not train (non-finite
  // gradients or loss; runtime/engine/step_guard.hpp); 0 = never.
  long long max_consecutive_skipped_steps = 20;
  std::string model_preset = "tiny";  // the preset "model" started from; "" = explicit shape
  models::GptShape model = models::kGptPresets[0].shape;  // the GPT shape (preset "tiny")
  Parallel parallel;                  // "parallel": the process grid and the pipeline schedule
};

struct Config {
  Batch batch;                                       // the three batch keys, resolved
  long long steps_per_print = 10;                    // log interval in steps
  bool wall_clock_breakdown = false;                 // per-phase timers in the log
  double gradient_clipping = 1.0;                    // global L2-norm clip; 0 = off
  bool prescale_gradients = false;                   // divide gradients before the reduction
  double gradient_predivide_factor = 1.0;            // divisor applied before the reduction
  std::optional<Precision> communication_data_type;  // gradient reduction dtype; null = model's
  long long seed = 1234;                             // ours: the run's random seed
  Optimizer optimizer;                               // "optimizer"
  Scheduler scheduler;                               // "scheduler"
  Fp16 fp16;                                         // "fp16"
  Bf16 bf16;                                         // "bf16"
  Zero zero;                                         // "zero_optimization"
  Aio aio;                                           // "aio"
  ActivationCheckpointing activation_checkpointing;  // "activation_checkpointing"
  DsPipeline pipeline;                               // "pipeline" (DeepSpeed's)
  Ours ours;                                         // "zero_train"

  // The dtype of parameters and compute: fp16 or bf16 when enabled, else fp32.
  Precision precision() const noexcept;
  // The dtype gradients are reduced in: communication_data_type, else precision().
  Precision communication_precision() const noexcept;
};

struct LoadResult {
  Config config;                        // meaningful only when ok()
  std::vector<Diagnostic> diagnostics;  // every error and warning, in the order found
  bool ok() const noexcept;             // no error among the diagnostics
};

// ---- the API ------------------------------------------------------------------------------------

// Parses and validates `json_text` against `env`. Messages carry JSON paths, not the source
// name: print them with format_diagnostic(d, source_name), which puts the name in front.
// A JSON syntax error is one error at path "" giving line and column and what to check.
LoadResult parse_config(std::string_view json_text, std::string_view source_name,
                        const Environment& env);

// Reads `path` and parses it. An unreadable file (missing, a directory, no permission) is one
// error at path "" that names the file and says to check --config.
LoadResult load_config_file(const std::string& path, const Environment& env);

// The effective config as JSON: every key, every default filled in, "auto" resolved, DeepSpeed's
// key names (no deprecated aliases), our "zero_train" section last. parse_config() of this text
// with the same Environment gives the same Config. The scheduler block is left out when there
// is no scheduler.
std::string effective_config_json(const Config& c, int indent = 2);

// One line: "<source>: error: <path>: <message>" (or "warning"; no "<path>: " when path is "").
std::string format_diagnostic(const Diagnostic& d, std::string_view source_name);

}  // namespace zero::config
