// Every block of ds_config.json except zero_optimization (zero_block.cpp): its keys, ranges,
// "auto" rules and aliases, written once as a visit() over a Reader or a Writer; then
// parse_config() and effective_config_json(), which drive those visits.
#include <algorithm>
#include <string>
#include <variant>
#include <vector>

#include "runtime/config/batch.hpp"
#include "runtime/config/config.hpp"
#include "runtime/config/json_io.hpp"
#include "runtime/config/limits.hpp"

namespace zero::config {
namespace detail {
namespace {

// ---- choice tables ------------------------------------------------------------------------------

constexpr Choice<std::optional<Precision>> kCommTypes[] = {
    {"fp32", Precision::fp32},     {"float32", Precision::fp32}, {"float", Precision::fp32},
    {"fp16", Precision::fp16},     {"float16", Precision::fp16}, {"half", Precision::fp16},
    {"bf16", Precision::bf16},     {"bfloat16", Precision::bf16},
};

constexpr Choice<OptimizerType> kOptimizerTypes[] = {
    {"AdamW", OptimizerType::AdamW},
    {"Adam", OptimizerType::Adam},
};

// Index into Scheduler::params' variant.
constexpr Choice<int> kSchedulerTypes[] = {
    {"WarmupLR", 1}, {"WarmupDecayLR", 2}, {"WarmupCosineLR", 3}, {"OneCycle", 4}, {"LRRangeTest", 5},
};

constexpr Choice<WarmupType> kWarmupTypes[] = {
    {"log", WarmupType::log},
    {"linear", WarmupType::linear},
};

constexpr Choice<bool> kDecaySets[] = {
    {"matrices", false},
    {"all", true},
};

constexpr Choice<std::optional<DeviceKind>> kDevices[] = {
    {"auto", std::nullopt},
    {"cpu", DeviceKind::cpu},
    {"cuda", DeviceKind::cuda},
};

// Top-level DeepSpeed features zero-train does not use: one "ignored" warning each.
constexpr std::string_view kIgnoredFeatures[] = {
    "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "comms_logger",
    "monitor_config", "elasticity", "autotuning", "data_efficiency", "curriculum_learning",
    "checkpoint", "data_types", "compile", "amp", "sparse_attention",
    "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "memory_breakdown",
    "dump_state", "sparse_gradients", "nebula", "compression_training", "hybrid_engine",
    "eigenvalue", "progressive_layer_drop", "quantize_training", "weight_quantization", "timers",
    "dataloader_drop_last", "disable_allgather", "fp32_allreduce", "graph_harvesting",
    "use_data_before_expert_parallelism", "seq_parallel_communication_data_type",
    "torch_autocast", "vocabulary_size", "tensor_parallel", "expert_parallel",
};

// ---- precision ----------------------------------------------------------------------------------

template <class Io>
void visit(Io& io, Fp16& f) {
  io.key("enabled", f.enabled, {.auto_value = false});  // see resolve_precision()
  io.key("auto_cast", f.auto_cast, {.not_implemented = true});
  io.key("loss_scale", f.loss_scale, {.min = 0});
  io.key("initial_scale_power", f.initial_scale_power, {.min = 0, .max = 64});
  io.key("loss_scale_window", f.loss_scale_window, {.min = 1});
  io.key("hysteresis", f.hysteresis, {.min = 1});
  io.key("consecutive_hysteresis", f.consecutive_hysteresis);
  io.key("min_loss_scale", f.min_loss_scale, {.min = 0, .min_open = true});
  io.key("fp16_master_weights_and_grads", f.fp16_master_weights_and_grads,
         {.not_implemented = true});
}

template <class Io>
void visit(Io& io, Bf16& b) {
  io.key("enabled", b.enabled, {.auto_value = false});  // see resolve_precision()
  io.key("immediate_grad_update", b.immediate_grad_update, {.not_implemented = true});
  io.key("check_grad_overflow", b.check_grad_overflow, {.not_implemented = true});
}

// fp16/bf16 "enabled": "auto" means bf16 where supported, else fp32. An explicit value in the
// other block wins: fp16 true keeps fp16; bf16 true or false is kept as written.
void resolve_precision(Session& s, Config& c) {
  const Source f = s.source("fp16.enabled");
  Source b = s.source("bf16.enabled");
  if (b == Source::absent) b = s.source("bfloat16.enabled");
  if (f != Source::auto_value && b != Source::auto_value) return;
  if (f == Source::value && c.fp16.enabled) return;
  if (b == Source::value) return;
  c.fp16.enabled = false;
  c.bf16.enabled = s.env.bf16_supported;
}

// ---- optimizer ----------------------------------------------------------------------------------

// Every learning rate (optimizer.params.lr and the schedules' lrs) is in [0, kMaxLr]. Adam moves
// each weight by about lr per step whatever the gradient's scale, so an lr of 1 already moves
// every weight by 50 times its initial size (std 0.02) per step: anything above is a typo or a
// unit mistake, and 1e30 would overflow fp32 within a step.
constexpr double kMaxLr = 1.0;
constexpr std::string_view kLrHint =
    "Adam moves every weight by about lr per step, so a learning rate above 1 destroys any model "
    "(typical values: 1e-5 to 1e-3)";

template <class Io>
void visit(Io& io, AdamParams& a, OptimizerType type) {
  const AdamParams defaults;  // what "auto" means: the defaults (lr: the --lr flag first)
  io.key("lr", a.lr,
         {.min = 0, .max = kMaxLr, .auto_value = defaults.lr, .flag = &io.env().lr_flag,
          .flag_name = "--lr", .hint = kLrHint});
  io.key("betas", a.betas, {.min = 0, .max = 1, .max_open = true, .auto_value = defaults.betas});
  io.key("eps", a.eps, {.min = 0, .min_open = true, .auto_value = defaults.eps});
  io.key("weight_decay", a.weight_decay, {.min = 0, .auto_value = defaults.weight_decay});
  io.key("bias_correction", a.bias_correction);
  io.key("adam_w_mode", a.adam_w_mode);
  io.key("amsgrad", a.amsgrad);
  io.key("torch_adam", a.torch_adam, {.not_implemented = true});
  if constexpr (Io::reading) {
    if (a.amsgrad)
      io.error("amsgrad", "true is not supported (zero-train implements Adam/AdamW without "
                          "AMSGrad); set it to false or remove it");
    if (type == OptimizerType::AdamW && !a.adam_w_mode) {
      io.warn("adam_w_mode", "false is overridden: optimizer type AdamW always uses decoupled "
                             "weight decay (use type Adam for L2 regularisation)");
      a.adam_w_mode = true;
    }
  }
}

template <class Io>
void visit(Io& io, Optimizer& o) {
  io.choice("type", o.type, kOptimizerTypes,
            {.case_insensitive = true,
             .required = io.given(),
             .hint = "other DeepSpeed optimizers (Lamb, OneBitAdam, SGD, Adagrad, ...) are not "
                     "supported by zero-train"});
  io.block("params", o.params, [&o](auto& p, AdamParams& a) { visit(p, a, o.type); });
  io.key("legacy_fusion", o.legacy_fusion, {.not_implemented = true});
}

// ---- scheduler ----------------------------------------------------------------------------------

template <class Io>
void visit_schedule(Io&, std::monostate&, const Config&) {}

template <class Io>
void visit_schedule(Io& io, WarmupLR& p, const Config& c) {
  io.key("warmup_min_lr", p.warmup_min_lr,
         {.min = 0, .max = kMaxLr, .auto_value = 0.0, .hint = kLrHint});
  io.key("warmup_max_lr", p.warmup_max_lr,
         {.min = 0, .max = kMaxLr, .auto_later = [&c] { return c.optimizer.params.lr; },
          .hint = kLrHint});
  // "auto": Hugging Face's Trainer writes its warmup steps there (--warmup_steps, else
  // ceil(--warmup_ratio x total steps); 0 by default). 0 and 1 count as 2, as in DeepSpeed.
  io.key("warmup_num_steps", p.warmup_num_steps,
         {.min = 0,
          .auto_value = 0LL,
          .flag = &io.env().warmup_steps_flag,
          .flag_name = "--warmup-steps"});
  io.choice("warmup_type", p.warmup_type, kWarmupTypes);
  io.key("last_batch_iteration", p.last_batch_iteration, {.min = -1});
}

// The job's steps, for "total_num_steps": "auto".
std::function<long long()> job_steps(const Config& c) {
  return [&c] { return c.ours.steps; };
}

template <class Io>
void warn_total_below_warmup(Io& io, const long long& total, const long long& warmup) {
  if constexpr (Io::reading) {
    // After the deferred "auto" values: total_num_steps may be one of them.
    io.session().deferred.push_back([&io_session = io.session(), at = io.path_of("total_num_steps"),
                                     &total, &warmup] {
      if (total < warmup)
        io_session.warn(at, std::to_string(total) + " is less than warmup_num_steps " +
                                std::to_string(warmup) + ": the schedule never leaves warmup");
    });
  }
}

template <class Io>
void visit_schedule(Io& io, WarmupDecayLR& p, const Config& c) {
  visit_schedule(io, static_cast<WarmupLR&>(p), c);
  io.key("total_num_steps", p.total_num_steps,
         {.min = 1, .auto_later = job_steps(c), .required = true});
  warn_total_below_warmup(io, p.total_num_steps, p.warmup_num_steps);
}

template <class Io>
void visit_schedule(Io& io, WarmupCosineLR& p, const Config& c) {
  io.key("total_num_steps", p.total_num_steps,
         {.min = 1, .auto_later = job_steps(c), .required = true});
  io.key("warmup_min_ratio", p.warmup_min_ratio, {.min = 0, .max = 1});
  io.key("warmup_num_steps", p.warmup_num_steps,
         {.min = 0,
          .auto_value = 0LL,
          .flag = &io.env().warmup_steps_flag,
          .flag_name = "--warmup-steps"});
  io.key("cos_min_ratio", p.cos_min_ratio, {.min = 0, .max = 1});
  io.choice("warmup_type", p.warmup_type, kWarmupTypes);
  io.key("last_batch_iteration", p.last_batch_iteration, {.min = -1});
  warn_total_below_warmup(io, p.total_num_steps, p.warmup_num_steps);
}

template <class Io>
void visit_schedule(Io& io, OneCycle& p, const Config&) {
  bool second_step_given = true, second_stair_given = true;
  if constexpr (Io::reading) {
    second_step_given = io.find("cycle_second_step_size") != nullptr;
    second_stair_given = io.find("cycle_second_stair_count") != nullptr;
  }
  io.key("cycle_min_lr", p.cycle_min_lr, {.min = 0, .max = kMaxLr, .required = true, .hint = kLrHint});
  io.key("cycle_max_lr", p.cycle_max_lr, {.min = 0, .max = kMaxLr, .required = true, .hint = kLrHint});
  io.key("decay_lr_rate", p.decay_lr_rate, {.min = 0});
  io.key("cycle_first_step_size", p.cycle_first_step_size, {.min = 1});
  io.key("cycle_second_step_size", p.cycle_second_step_size, {.min = 1});
  io.key("cycle_first_stair_count", p.cycle_first_stair_count, {.min = 0});
  io.key("cycle_second_stair_count", p.cycle_second_stair_count, {.min = 0});
  io.key("decay_step_size", p.decay_step_size, {.min = 0});
  io.key("cycle_momentum", p.cycle_momentum);
  io.key("cycle_min_mom", p.cycle_min_mom, {.min = 0, .max = 1});
  io.key("cycle_max_mom", p.cycle_max_mom, {.min = 0, .max = 1});
  io.key("decay_mom_rate", p.decay_mom_rate, {.min = 0});
  io.key("last_batch_iteration", p.last_batch_iteration, {.min = -1});
  // DeepSpeed: the falling half mirrors the rising half unless told otherwise.
  if (!second_step_given) p.cycle_second_step_size = p.cycle_first_step_size;
  if (!second_stair_given) p.cycle_second_stair_count = p.cycle_first_stair_count;
}

template <class Io>
void visit_schedule(Io& io, LRRangeTest& p, const Config&) {
  io.key("lr_range_test_min_lr", p.lr_range_test_min_lr, {.min = 0, .max = kMaxLr, .hint = kLrHint});
  io.key("lr_range_test_step_size", p.lr_range_test_step_size, {.min = 1});
  io.key("lr_range_test_step_rate", p.lr_range_test_step_rate, {.min = 0});
  io.key("lr_range_test_staircase", p.lr_range_test_staircase);
  io.key("last_batch_iteration", p.last_batch_iteration, {.min = -1});
}

void select_schedule(Scheduler& s, int index) {
  switch (index) {
    case 1: s.params.emplace<WarmupLR>(); break;
    case 2: s.params.emplace<WarmupDecayLR>(); break;
    case 3: s.params.emplace<WarmupCosineLR>(); break;
    case 4: s.params.emplace<OneCycle>(); break;
    case 5: s.params.emplace<LRRangeTest>(); break;
    default: s.params.emplace<std::monostate>(); break;
  }
}

template <class Io>
void visit(Io& io, Scheduler& s, const Config& c) {
  int type = static_cast<int>(s.params.index());
  io.choice("type", type, kSchedulerTypes, {.required = io.given()});
  if constexpr (Io::reading) {
    select_schedule(s, type);
    if (!s.enabled()) {  // type missing or wrong (reported): its params cannot be checked
      io.known("params");
      return;
    }
  }
  io.block("params", s.params, [&c](auto& p, auto& params) {
    std::visit([&](auto& schedule) { visit_schedule(p, schedule, c); }, params);
  });
}

// ---- the rest of the blocks ---------------------------------------------------------------------

// aio configures the NVMe swapper's file engine (offload/aio_options.hpp): optimizer state and
// parameters on NVMe use it. GPUDirect Storage is not built: use_gds is warned about when set.
template <class Io>
void visit(Io& io, Aio& a) {
  io.key("block_size", a.block_size, {.min = 1});
  io.key("queue_depth", a.queue_depth, {.min = 1});
  io.key("intra_op_parallelism", a.intra_op_parallelism,
         {.min = 1, .aliases = {{.name = "thread_count", .deprecated = true}}});
  io.key("single_submit", a.single_submit);
  io.key("overlap_events", a.overlap_events);
  io.key("use_gds", a.use_gds, {.not_implemented = true});
}

template <class Io>
void visit(Io& io, ActivationCheckpointing& a) {
  // number_checkpoints picks how many transformer blocks recompute their activations
  // (zero::checkpoint_plan); partition_activations splits what they keep across the tensor group
  // (EngineOptions::partition_activations) and cpu_checkpointing keeps it in host memory
  // (EngineOptions::cpu_checkpointing); the other knobs tune DeepSpeed's own implementation
  // and are not ours.
  io.key("partition_activations", a.partition_activations);
  io.key("contiguous_memory_optimization", a.contiguous_memory_optimization,
         {.not_implemented = true});
  io.key("cpu_checkpointing", a.cpu_checkpointing);
  io.key("number_checkpoints", a.number_checkpoints, {.min = 0});
  io.key("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary,
         {.not_implemented = true});
  io.key("profile", a.profile, {.not_implemented = true});
}

// zero_train.model: a preset, optionally overridden key by key, or a full explicit shape.
template <class Io>
void visit_model(Io& io, Ours& o) {
  constexpr const char* kShapeKeys[] = {"n_layer", "n_embd", "n_head", "vocab_size", "seq_len"};
  std::optional<std::string> preset;
  if (!o.model_preset.empty()) preset = o.model_preset;
  bool explicit_shape = false;  // no preset named: all five keys are required
  if constexpr (Io::reading) {
    const Json* p = io.find("preset");
    bool any_shape_key = false;
    for (const char* k : kShapeKeys) any_shape_key = any_shape_key || io.find(k) != nullptr;
    explicit_shape = (p == nullptr || p->is_null()) && any_shape_key;
  }
  io.key("preset", preset);
  if constexpr (Io::reading) {
    if (explicit_shape) {
      o.model_preset.clear();
    } else if (preset) {
      if (const auto shape = models::gpt_preset(*preset)) {
        o.model_preset = *preset;
        o.model = *shape;
      } else {
        std::string names;
        for (std::string_view n : models::gpt_preset_names())
          names += (names.empty() ? "\"" : ", \"") + std::string(n) + "\"";
        io.error("preset", "expected one of " + names + ", got \"" + *preset + "\"");
      }
    }
  }
  // DeepNet trained 1000-layer transformers; every layer is a dozen parameter records in host
  // memory outside the ledger, so a runaway depth is refused here rather than by the allocator.
  io.key("n_layer", o.model.n_layer,
         {.min = 1, .max = 100000, .required = explicit_shape,
          .hint = "far deeper than any transformer trained (DeepNet: 1000 layers)"});
  io.key("n_embd", o.model.n_embd, {.min = 1, .required = explicit_shape});
  io.key("n_head", o.model.n_head, {.min = 1, .required = explicit_shape});
  io.key("vocab_size", o.model.vocab_size, {.min = 1, .required = explicit_shape});
  io.key("seq_len", o.model.seq_len, {.min = 1, .required = explicit_shape});
  if constexpr (Io::reading) {
    if (o.model.n_head > 0 && o.model.n_embd > 0 && o.model.n_embd % o.model.n_head != 0)
      io.error("n_head", std::to_string(o.model.n_head) + " does not divide n_embd " +
                             std::to_string(o.model.n_embd) +
                             "; pick n_head so that n_embd / n_head is a whole head size");
  }
}

template <class Io>
void visit(Io& io, Ours& o) {
  io.choice("device", o.device, kDevices);
  io.bytes("device_memory_limit", o.device_memory_limit);
  io.bytes("host_memory_limit", o.host_memory_limit);
  io.choice("weight_decay_applies_to", o.weight_decay_all, kDecaySets);
  io.key("steps", o.steps, {.min = 1, .flag = &io.env().steps_flag, .flag_name = "--steps"});
  io.key("speculative_host_step", o.speculative_host_step);
  io.key("watchdog_timeout", o.watchdog_timeout,
         {.min = 0, .flag = &io.env().watchdog_timeout_flag, .flag_name = "--watchdog-timeout"});
  io.key("max_consecutive_skipped_steps", o.max_consecutive_skipped_steps, {.min = 0});
  io.block("model", o, [](auto& m, Ours& ours) { visit_model(m, ours); });
  io.block("parallel", o.parallel, [](auto& p, Parallel& par) { visit_parallel(p, par); });
}

// ---- the top level ------------------------------------------------------------------------------

BatchKey read_batch_key(Reader& io, std::string_view name) {
  const std::size_t errors = io.session().error_count();
  long long v = 0;
  io.key(name, v,
         {.min = 1, .max = static_cast<double>(kMaxBatch), .auto_value = 0LL,
          .hint = "zero-train counts samples and micro-batches in 32-bit integers (no real job "
                  "comes near: the largest use a few thousand sequences per step)"});
  BatchKey k;
  k.value = v;
  if (io.session().error_count() != errors) k.state = BatchKey::State::invalid;
  else if (io.session().source(io.path_of(name)) == Source::auto_value)
    k.state = BatchKey::State::auto_value;
  else if (io.session().source(io.path_of(name)) == Source::value)
    k.state = BatchKey::State::value;
  return k;
}

// Reading only reads the three keys into `in`: the rule needs the data-parallel size, known once
// zero_train.parallel is read (visit(Io&, Config&) resolves it at the end).
template <class Io>
void visit_batch(Io& io, Batch& b, BatchInput& in) {
  if constexpr (Io::reading) {
    in.train_batch_size = read_batch_key(io, "train_batch_size");
    in.train_micro_batch_size_per_gpu = read_batch_key(io, "train_micro_batch_size_per_gpu");
    in.gradient_accumulation_steps = read_batch_key(io, "gradient_accumulation_steps");
  } else {
    io.key("train_batch_size", b.train_batch_size);
    io.key("train_micro_batch_size_per_gpu", b.train_micro_batch_size_per_gpu);
    io.key("gradient_accumulation_steps", b.gradient_accumulation_steps);
  }
}

// bf16 also answers to its old name "bfloat16".
void visit_bf16_block(Reader& io, Bf16& b) {
  io.known("bfloat16");
  const Json* current = io.find("bf16");
  const Json* old = io.find("bfloat16");
  const auto visit_bf16 = [](auto& r, Bf16& x) { visit(r, x); };
  if (old == nullptr) return io.block("bf16", b, visit_bf16);
  io.warn("bfloat16", "deprecated name; use 'bf16' instead");
  if (current != nullptr && !(*current == *old)) {
    io.error("bfloat16", "is " + old->dump() + " but 'bf16' (the same block) is " +
                             current->dump() + "; keep only 'bf16'");
  }
  io.block(current != nullptr ? "bf16" : "bfloat16", b, visit_bf16);
}

void visit_bf16_block(Writer& io, Bf16& b) {
  io.block("bf16", b, [](auto& w, Bf16& x) { visit(w, x); });
}

template <class Io>
void visit(Io& io, Config& c) {
  BatchInput batch;
  visit_batch(io, c.batch, batch);
  io.key("steps_per_print", c.steps_per_print, {.min = 1});
  io.key("wall_clock_breakdown", c.wall_clock_breakdown);
  io.key("gradient_clipping", c.gradient_clipping, {.min = 0, .auto_value = 1.0});
  io.key("prescale_gradients", c.prescale_gradients);
  io.key("gradient_predivide_factor", c.gradient_predivide_factor, {.min = 0, .min_open = true});
  io.choice("communication_data_type", c.communication_data_type, kCommTypes, {.nullable = true});
  io.key("seed", c.seed, {.min = 0});
  io.block("optimizer", c.optimizer, [](auto& b, Optimizer& o) { visit(b, o); });
  const auto visit_scheduler = [&c](auto& b, Scheduler& s) { visit(b, s, c); };
  if constexpr (Io::reading) {
    const Json* s = io.find("scheduler");
    if (s != nullptr && !s->is_null()) io.block("scheduler", c.scheduler, visit_scheduler);
    io.known("scheduler");
  } else if (c.scheduler.enabled()) {
    io.block("scheduler", c.scheduler, visit_scheduler);
  }
  io.block("fp16", c.fp16, [](auto& b, Fp16& f) { visit(b, f); });
  visit_bf16_block(io, c.bf16);
  visit_zero_optimization(io, c.zero, c.ours);
  io.block("aio", c.aio, [](auto& b, Aio& a) { visit(b, a); });
  io.block("activation_checkpointing", c.activation_checkpointing,
           [](auto& b, ActivationCheckpointing& a) { visit(b, a); });
  DsPipelineInput ds_pipeline;
  if constexpr (Io::reading) visit_ds_pipeline(io, c.pipeline, ds_pipeline);
  else visit_ds_pipeline(io, c.pipeline);
  io.block("zero_train", c.ours, [](auto& b, Ours& o) { visit(b, o); });
  if constexpr (Io::reading) {
    // The grid (both pipeline blocks read), then the batch rule over its data-parallel size.
    const DataParallel dp = resolve_grid(io.session(), c.ours.parallel, ds_pipeline);
    if (dp.size > 0) resolve_batch(batch, io.env(), dp, c.batch, io.session().diagnostics);
  }
}

// Checks between blocks, once every value (and every "auto") is final.
void check(Session& s, const Config& c) {
  if (c.fp16.enabled && c.bf16.enabled)
    s.error("fp16.enabled", "fp16 and bf16 are both enabled; enable at most one (bf16 needs no "
                            "loss scaling)");
  if (s.env.warmup_steps_flag && !c.scheduler.enabled())
    s.warn("", "--warmup-steps has no effect: the config has no scheduler");
  if (s.error_count() == 0) check_sizes(c, s.diagnostics);  // on final, valid numbers only
}

// The command line's replacements (Environment::overrides), written into the parsed file.
// A replacement whose parent is not an object is skipped: reading the file reports the parent.
void apply_overrides(Session& s, Json& root) {
  for (const Environment::Override& o : s.env.overrides) {
    Json value;
    if (!parse_json(o.json, s, value, o.path, o.origin)) continue;
    Json* at = &root;  // an object (parse_config checked the root)
    std::string_view rest = o.path;
    for (;;) {
      const std::size_t dot = rest.find('.');
      Json& child = (*at)[std::string(rest.substr(0, dot))];  // one linear lookup per level
      if (dot == std::string_view::npos) {
        child = std::move(value);
        break;
      }
      if (child.is_null()) child = Json::object();  // absent or null: read as {} anyway
      if (!child.is_object()) break;
      at = &child;
      rest.remove_prefix(dot + 1);
    }
  }
}

}  // namespace
}  // namespace detail

LoadResult parse_config(std::string_view json_text, std::string_view source_name,
                        const Environment& env) {
  (void)source_name;  // messages carry JSON paths; format_diagnostic() adds the source
  LoadResult result;
  detail::Session session{env, result.diagnostics, {}, {}};
  if (env.world_size < 1) {
    session.error("", "world size " + std::to_string(env.world_size) +
                          " (MPI ranks): expected >= 1");
    return result;
  }
  detail::Json json;
  if (!detail::parse_json(json_text, session, json)) return result;
  if (!json.is_object()) {
    session.error("", "expected a JSON object ({...}) at the top level, got " +
                          detail::describe(json));
    return result;
  }
  detail::apply_overrides(session, json);
  detail::Reader top(session, json, "", true, detail::Reader::Unknown::warn,
                     detail::kIgnoredFeatures);
  detail::visit(top, result.config);
  top.finish();
  session.run_deferred();
  detail::resolve_precision(session, result.config);
  detail::check(session, result.config);
  return result;
}

std::string effective_config_json(const Config& c, int indent) {
  Config copy = c;  // the visit takes members by reference; the Writer only reads them
  detail::Writer w;
  detail::visit(w, copy);
  return w.json().dump(indent);
}

}  // namespace zero::config
