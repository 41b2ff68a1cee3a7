#include "runtime/engine/from_config.hpp"

#include <algorithm>
#include <memory>

#include "runtime/config/to_offload.hpp"
#include "runtime/config/to_optim.hpp"

namespace zero {

EngineOptions engine_options(const config::Config& c, DeviceKind kind) {
  EngineOptions o;
  o.stage = c.zero.stage;
  o.gradient_accumulation_steps = static_cast<int>(c.batch.gradient_accumulation_steps);
  switch (c.precision()) {
    case config::Precision::fp16: o.param_type = ScalarType::f16; break;
    case config::Precision::bf16: o.param_type = ScalarType::bf16; break;
    case config::Precision::fp32: o.param_type = ScalarType::f32; break;
  }
  if (c.fp16.enabled) o.loss_scaler = config::to_loss_scaler_options(c.fp16, c.bf16);

  const config::AdamParams& a = c.optimizer.params;
  o.adam.beta1 = static_cast<float>(a.betas[0]);
  o.adam.beta2 = static_cast<float>(a.betas[1]);
  o.adam.eps = static_cast<float>(a.eps);
  o.adam.weight_decay = static_cast<float>(a.weight_decay);
  o.adam.adam_w_mode = c.optimizer.type == config::OptimizerType::AdamW || a.adam_w_mode;
  o.adam.bias_correction = a.bias_correction;

  // DeepSpeed's scheduler: the t-th applied step runs at iteration last_batch_iteration + t
  // (optim::LrCursor's convention: it starts at last_batch_iteration and steps after each
  // applied step). The lambda shares ownership of the schedule.
  const optim::ScheduleSpec spec = config::to_schedule_spec(c.scheduler);
  std::shared_ptr<const optim::LrSchedule> sched = optim::make_lr_schedule(spec, a.lr);
  const int64_t start = spec.last_batch_iteration;
  o.lr = [sched, start](int64_t t) { return static_cast<float>(sched->lr(start + t - 1)); };
  if (sched->beta1(start) || sched->beta2(start)) {  // OneCycle with cycle_momentum
    const float b1 = o.adam.beta1, b2 = o.adam.beta2;
    o.betas = [sched, start, b1, b2](int64_t t) {
      return std::pair<float, float>{static_cast<float>(sched->beta1(start + t - 1).value_or(b1)),
                                     static_cast<float>(sched->beta2(start + t - 1).value_or(b2))};
    };
  }

  o.gradient_clipping = static_cast<float>(c.gradient_clipping);
  o.seed = static_cast<uint64_t>(c.seed);
  o.number_checkpoints = c.activation_checkpointing.number_checkpoints;
  o.partition_activations = c.activation_checkpointing.partition_activations;
  o.cpu_checkpointing = c.activation_checkpointing.cpu_checkpointing;

  o.overlap_comm = c.zero.overlap_comm;
  o.reduce_bucket_size = c.zero.reduce_bucket_size;
  o.prefetch_bucket_size = c.zero.stage3_prefetch_bucket_size;
  o.max_live_parameters = c.zero.stage3_max_live_parameters;
  o.param_persistence_threshold = c.zero.stage3_param_persistence_threshold;
  o.timers = c.wall_clock_breakdown;
  // offload_optimizer to nvme: the state in swap files (optimizer_swap.hpp); offload_param to
  // nvme: the stage-3 parameter shards in swap files (param_swap.hpp, param_nvme_path).
  o.offload_optimizer = c.zero.offload_optimizer.enabled();
  if (c.zero.offload_optimizer.device == config::OffloadDevice::nvme) {
    const config::OffloadOptimizer& oo = c.zero.offload_optimizer;
    o.nvme.path = oo.nvme_path.value_or("");
    o.nvme.buffer_count = static_cast<int>(oo.buffer_count);
    o.nvme.pipeline_read = oo.pipeline_read;
    o.nvme.pipeline_write = oo.pipeline_write;
    o.nvme.sub_group_size = c.zero.sub_group_size;
    o.nvme.aio = config::to_aio_options(c.aio);
  }
  o.offload_param = c.zero.offload_param.enabled();
  if (c.zero.offload_param.device == config::OffloadDevice::nvme) {
    const config::OffloadParam& op = c.zero.offload_param;
    o.param_nvme_path = op.nvme_path.value_or("");
    o.param_buffer_count = static_cast<int>(std::min<long long>(op.buffer_count, 1 << 20));
    o.param_buffer_size = op.buffer_size;
    o.param_max_in_cpu = op.max_in_cpu;
    o.aio = config::to_aio_options(c.aio);
  }
  const bool pin = (!o.offload_optimizer || c.zero.offload_optimizer.pin_memory) &&
                   (!o.offload_param || c.zero.offload_param.pin_memory);
  o.pin = pin ? offload::PinPolicy::preferred : offload::PinPolicy::off;
  o.speculative_host_step = c.ours.speculative_host_step.value_or(kind != DeviceKind::cpu);
  o.weight_decay_all = c.ours.weight_decay_all;
  // What the Engine's constructor would refuse, refused now: zero-train --validate calls this
  // function too, so a config it accepts does not fail at start.
  check_engine_options(o);
  return o;
}

}  // namespace zero
