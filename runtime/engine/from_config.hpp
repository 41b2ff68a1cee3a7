// The engine's options from a DeepSpeed config (runtime/config/config.hpp): the one place that
// says which ds_config.json key drives which EngineOptions field.
//
//   zero_optimization.stage                         stage
//   gradient_accumulation_steps                     gradient_accumulation_steps
//   fp16.enabled / bf16.enabled                     param_type (fp16 / bf16, else fp32)
//   fp16.*                                          loss_scaler (fp16 only)
//   optimizer.params                                adam (betas, eps, weight_decay, adam_w_mode,
//                                                   bias_correction) and the base lr
//   scheduler                                       lr (and OneCycle's betas): the schedule at
//                                                   DeepSpeed's iteration last_batch_iteration
//                                                   + t - 1 for applied step t
//   gradient_clipping                               gradient_clipping
//   seed (zero_train's)                             seed
//   activation_checkpointing.number_checkpoints     number_checkpoints
//   zero_optimization.overlap_comm                  overlap_comm (DeepSpeed's default: stage 3)
//   zero_optimization.reduce_bucket_size            reduce_bucket_size
//   zero_optimization.stage3_prefetch_bucket_size   prefetch_bucket_size
//   zero_optimization.stage3_max_live_parameters    max_live_parameters
//   zero_optimization.stage3_param_persistence_threshold   param_persistence_threshold
//   wall_clock_breakdown                            timers
//   zero_optimization.offload_optimizer.device      offload_optimizer; "nvme": nvme (path,
//                                                   buffer_count, pipeline_read/_write, aio)
//   zero_optimization.sub_group_size (nvme)          nvme.sub_group_size
//   zero_optimization.offload_param.device          offload_param; "nvme": param_nvme_path
//   offload_param.nvme_path, buffer_count, buffer_size, max_in_cpu (nvme)
//                                                   param_nvme_path, param_buffer_count,
//                                                   param_buffer_size, param_max_in_cpu
//   aio.* (with offload_param nvme)                 aio (config::to_aio_options)
//   offload_*.pin_memory                            pin: preferred (true) or off (false)
//   zero_train.weight_decay_applies_to              weight_decay_all ("all"; "matrices": false)
//
// Keys the engine reads no field for, and why (docs/engine.md): allgather_bucket_size (the
// step-end all-gather is in place, one per group: it needs no bucket buffer), contiguous_gradients
// (always: gradients live in flat per-group buffers), stage3_max_reuse_distance (a group is kept
// when the next Unit uses it), stage3_model_persistence_threshold, sub_group_size without NVMe
// (host AdamW already runs in cache-sized chunks; only the swap needs the cut).
#pragma once

#include "runtime/config/config.hpp"
#include "runtime/engine/engine.hpp"

namespace zero {

// Builds the LR schedule and runs check_engine_options on the result, so that everything the
// Engine's constructor checks about its options alone is checked here, before any device is
// opened (zero-train's --validate and start-up both call this). Throws zero::Error naming the
// ds_config.json key when the scheduler's parameters make no sense (optim::make_lr_schedule) or
// the options are refused.
// `kind`: the device the run trains on (decides what an absent speculative_host_step means).
EngineOptions engine_options(const config::Config& c, DeviceKind kind);

}  // namespace zero
