// "zero_optimization": the ZeRO stage, buckets, stage-3 knobs and the two offload blocks, with
// every key DeepSpeed accepts and its legacy forms:
//   "zero_optimization": true | false | N           -> {"stage": 1 | 0 | N}
//   cpu_offload: true                               -> offload_optimizer.device "cpu"
//   cpu_offload_param(s): true                      -> offload_param.device "cpu"
//   cpu_offload_use_pin_memory                      -> pin_memory of both offload blocks
//   stage3_gather_fp16_weights_on_model_save        -> stage3_gather_16bit_weights_on_model_save
// and DeepSpeed's un-prefixed spellings of the stage3_* keys (prefetch_bucket_size, ...).
#include <string>

#include "runtime/config/config.hpp"
#include "runtime/config/json_io.hpp"

namespace zero::config::detail {
namespace {

constexpr Choice<OffloadDevice> kOffloadDevices[] = {
    {"none", OffloadDevice::none},
    {"cpu", OffloadDevice::cpu},
    {"nvme", OffloadDevice::nvme},
};

template <class Io>
void visit(Io& io, OffloadOptimizer& o) {
  io.choice("device", o.device, kOffloadDevices);
  io.key("nvme_path", o.nvme_path);
  io.key("buffer_count", o.buffer_count, {.min = 0});
  io.key("pin_memory", o.pin_memory);
  io.key("pipeline_read", o.pipeline_read);
  io.key("pipeline_write", o.pipeline_write);
  io.key("fast_init", o.fast_init, {.not_implemented = true});
  io.key("ratio", o.ratio, {.min = 0, .max = 1, .not_implemented = true});
}

template <class Io>
void visit(Io& io, OffloadParam& o) {
  io.choice("device", o.device, kOffloadDevices);
  io.key("nvme_path", o.nvme_path);
  io.key("buffer_count", o.buffer_count, {.min = 0});
  io.key("buffer_size", o.buffer_size, {.min = 0});
  io.key("max_in_cpu", o.max_in_cpu, {.min = 0});
  io.key("pin_memory", o.pin_memory);
}

// A deprecated boolean that stands for `<block>.device: "cpu"` (true) or "none" (false).
void offload_alias(Reader& io, std::string_view alias, std::string_view block,
                   OffloadDevice& device, std::string& device_origin) {
  const std::size_t errors = io.session().error_count();
  bool on = false;
  io.key(alias, on);
  if (io.session().source(io.path_of(alias)) != Source::value) return;
  const std::string target = io.path_of(block) + ".device";
  io.warn(alias, "deprecated; use '" + target + "': \"cpu\" instead");
  if (io.session().error_count() != errors) return;
  const OffloadDevice wanted = on ? OffloadDevice::cpu : OffloadDevice::none;
  if (io.session().source(target) == Source::value || !device_origin.empty()) {
    if (device != wanted)
      io.error(alias, std::string(on ? "true" : "false") + " contradicts " +
                          (device_origin.empty() ? "'" + target + "'" : "'" + device_origin + "'") +
                          " (\"" + std::string(to_string(device)) + "\"); keep only '" + target +
                          "'");
    return;
  }
  device = wanted;
  device_origin = io.path_of(alias);
}

// cpu_offload_use_pin_memory: pin_memory of both offload blocks, unless they say otherwise.
void pin_memory_alias(Reader& io, Zero& z) {
  constexpr std::string_view alias = "cpu_offload_use_pin_memory";
  const std::size_t errors = io.session().error_count();
  bool pin = false;
  io.key(alias, pin);
  if (io.session().source(io.path_of(alias)) != Source::value) return;
  io.warn(alias, "deprecated; use 'pin_memory' inside " + io.path_of("offload_optimizer") +
                     " and " + io.path_of("offload_param") + " instead");
  if (io.session().error_count() != errors) return;
  const auto apply = [&](std::string_view block, bool& member) {
    const std::string target = io.path_of(block) + ".pin_memory";
    if (io.session().source(target) != Source::value) member = pin;
    else if (member != pin)
      io.error(alias, std::string(pin ? "true" : "false") + " contradicts '" + target + "' (" +
                          (member ? "true" : "false") + "); keep only '" + target + "'");
  };
  apply("offload_optimizer", z.offload_optimizer.pin_memory);
  apply("offload_param", z.offload_param.pin_memory);
}

// The offload combinations DeepSpeed allows: optimizer offload with stages 1-3, parameter
// offload with stage 3, nvme with stage 3 only; nvme needs a path. Ours differ: optimizer state
// on nvme works at stages 1-3 (it is the same host optimizer, swapped), and parameter offload
// needs optimizer offload.
void check_offload(Reader& io, const Zero& z, const std::string& optimizer_origin,
                   const std::string& param_origin) {
  const std::string stage = "zero_optimization.stage is " + std::to_string(z.stage);
  const auto check = [&](std::string_view block, OffloadDevice device,
                         const std::optional<std::string>& nvme_path, const std::string& origin,
                         bool param) {
    if (device == OffloadDevice::none) return;
    const std::string at = origin.empty() ? io.path_of(block) + ".device" : origin;
    const std::string what = std::string(param ? "parameter" : "optimizer") + " offload to \"" +
                             std::string(to_string(device)) + "\"";
    if (param && z.stage != 3) {
      io.session().error(at, what + " needs stage 3 (" + stage +
                                 "); set \"stage\": 3 or remove " + std::string(block));
    } else if (device == OffloadDevice::nvme && param && z.stage != 3) {
      io.session().error(at, what + " needs stage 3 (" + stage +
                                 "); set \"stage\": 3 or offload to \"cpu\"");
    } else if (z.stage == 0) {
      io.session().error(at, what + " needs stage 1, 2 or 3 (" + stage +
                                 "); set a stage or remove " + std::string(block));
    }
    if (device == OffloadDevice::nvme) {
      if (!nvme_path || nvme_path->empty())
        io.session().error(io.path_of(block) + ".nvme_path",
                           "missing: device \"nvme\" needs nvme_path, a directory on a fast "
                           "local drive");
    }
  };
  check("offload_optimizer", z.offload_optimizer.device, z.offload_optimizer.nvme_path,
        optimizer_origin, false);
  check("offload_param", z.offload_param.device, z.offload_param.nvme_path, param_origin, true);
  // DeepSpeed allows parameter offload alone (the optimizer then runs on the GPU); zero-train's
  // host optimizer is what writes the offloaded shards, so it needs optimizer offload too.
  if (z.stage == 3 && z.offload_param.enabled() && !z.offload_optimizer.enabled())
    io.session().error(param_origin.empty() ? io.path_of("offload_param") + ".device" : param_origin,
                       "parameter offload without optimizer offload is not supported by "
                       "zero-train (its host optimizer writes the offloaded parameter shards); "
                       "add \"offload_optimizer\": {\"device\": \"cpu\"} or remove offload_param");
}

template <class Io>
void visit(Io& io, Zero& z, const Ours& ours) {
  // Hugging Face sizes the "auto" buckets from the hidden size h.
  const auto h = [&ours] { return static_cast<long long>(ours.model.n_embd); };
  io.key("stage", z.stage, {.min = 0, .max = 3});
  io.key("allgather_partitions", z.allgather_partitions);
  io.key("allgather_bucket_size", z.allgather_bucket_size, {.min = 1});
  io.key("overlap_comm", z.overlap_comm);
  if constexpr (Io::reading) {
    if (io.session().source(io.path_of("overlap_comm")) == Source::absent)
      z.overlap_comm = z.stage == 3;  // DeepSpeed's default depends on the stage
  }
  io.key("reduce_scatter", z.reduce_scatter);
  io.key("reduce_bucket_size", z.reduce_bucket_size,
         {.min = 1, .auto_later = [h] { return h() * h(); }});
  io.key("contiguous_gradients", z.contiguous_gradients);
  io.key("round_robin_gradients", z.round_robin_gradients);
  io.block("offload_optimizer", z.offload_optimizer,
           [](auto& b, OffloadOptimizer& o) { visit(b, o); });
  io.block("offload_param", z.offload_param, [](auto& b, OffloadParam& o) { visit(b, o); });
  io.key("sub_group_size", z.sub_group_size, {.min = 1});
  io.key("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size,
         {.min = 0,
          .auto_later = [h] { return static_cast<long long>(0.9 * static_cast<double>(h() * h())); },
          .aliases = {{.name = "prefetch_bucket_size", .deprecated = false}}});
  io.key("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold,
         {.min = 0,
          .auto_later = [h] { return 10 * h(); },
          .aliases = {{.name = "param_persistence_threshold", .deprecated = false}}});
  io.key("stage3_model_persistence_threshold", z.stage3_model_persistence_threshold,
         {.min = 0, .aliases = {{.name = "model_persistence_threshold", .deprecated = false}}});
  io.key("stage3_max_live_parameters", z.stage3_max_live_parameters,
         {.min = 0, .aliases = {{.name = "max_live_parameters", .deprecated = false}}});
  io.key("stage3_max_reuse_distance", z.stage3_max_reuse_distance,
         {.min = 0, .aliases = {{.name = "max_reuse_distance", .deprecated = false}}});
  io.key("stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save,
         {.aliases = {{.name = "gather_16bit_weights_on_model_save", .deprecated = false},
                      {.name = "stage3_gather_fp16_weights_on_model_save", .deprecated = true}}});
  // DeepSpeed compatibility: accepted, warned when not the default.
  const Opts<bool> kNi{.not_implemented = true};
  io.key("load_from_fp32_weights", z.load_from_fp32_weights, kNi);
  io.key("elastic_checkpoint", z.elastic_checkpoint, kNi);
  io.key("ignore_unused_parameters", z.ignore_unused_parameters, kNi);
  io.key("legacy_stage1", z.legacy_stage1, kNi);
  io.key("use_multi_rank_bucket_allreduce", z.use_multi_rank_bucket_allreduce, kNi);
  io.key("zero_hpz_partition_size", z.zero_hpz_partition_size,
         {.min = 0, .not_implemented = true});
  io.key("zero_quantized_weights", z.zero_quantized_weights, kNi);
  io.key("zero_quantized_nontrainable_weights", z.zero_quantized_nontrainable_weights, kNi);
  io.key("zero_quantized_gradients", z.zero_quantized_gradients, kNi);
  io.key("mics_shard_size", z.mics_shard_size, {.min = -1, .not_implemented = true});
  io.key("mics_hierarchical_params_gather", z.mics_hierarchical_params_gather, kNi);
  io.key("memory_efficient_linear", z.memory_efficient_linear, kNi);
  io.key("pipeline_loading_checkpoint", z.pipeline_loading_checkpoint, kNi);
  io.key("override_module_apply", z.override_module_apply, kNi);
  io.key("stage3_module_granularity_threshold", z.stage3_module_granularity_threshold,
         {.min = 0,
          .aliases = {{.name = "module_granularity_threshold", .deprecated = false}},
          .not_implemented = true});
  io.key("stage3_use_all_reduce_for_fetch_params", z.stage3_use_all_reduce_for_fetch_params,
         {.aliases = {{.name = "use_all_reduce_for_fetch_params", .deprecated = false}},
          .not_implemented = true});
  io.key("log_trace_cache_warnings", z.log_trace_cache_warnings, kNi);

  if constexpr (Io::reading) {
    std::string optimizer_origin, param_origin;  // the deprecated key that set a device, if any
    offload_alias(io, "cpu_offload", "offload_optimizer", z.offload_optimizer.device,
                  optimizer_origin);
    offload_alias(io, "cpu_offload_param", "offload_param", z.offload_param.device, param_origin);
    offload_alias(io, "cpu_offload_params", "offload_param", z.offload_param.device, param_origin);
    pin_memory_alias(io, z);
    check_offload(io, z, optimizer_origin, param_origin);
  }
}

}  // namespace

void visit_zero_optimization(Reader& top, Zero& zero, const Ours& ours) {
  const Json* v = top.find("zero_optimization");
  if (v != nullptr && (v->is_boolean() || v->is_number())) {
    // The oldest form: a switch (true = stage 1) or the stage itself.
    top.known("zero_optimization");
    long long stage = 0;
    if (v->is_boolean()) {
      stage = v->get<bool>() ? 1 : 0;
    } else if (!convert(*v, stage) || stage < 0 || stage > 3) {
      top.error("zero_optimization",
                "expected an object, true, false or a stage 0..3, got " + describe(*v));
      stage = 0;
    }
    top.warn("zero_optimization", "deprecated form; use \"zero_optimization\": {\"stage\": " +
                                      std::to_string(stage) + "} instead");
    zero.stage = static_cast<int>(stage);
    static const Json kEmpty = Json::object();
    Reader rest(top.session(), kEmpty, "zero_optimization", false);
    visit(rest, zero, ours);
    rest.finish();
    return;
  }
  top.block("zero_optimization", zero, [&ours](Reader& r, Zero& z) { visit(r, z, ours); });
}

void visit_zero_optimization(Writer& top, Zero& zero, const Ours& ours) {
  top.block("zero_optimization", zero, [&ours](Writer& w, Zero& z) { visit(w, z, ours); });
}

}  // namespace zero::config::detail
