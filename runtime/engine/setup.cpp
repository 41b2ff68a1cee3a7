// The engine's set-up: the checks on its options, the pieces' state allocated in one order
// (after check_fits said it fits), and the initial parameter values.
#include <algorithm>
#include <string>

#include <tbb/parallel_for.h>

#include "core/world.hpp"
#include "runtime/engine/engine_state.hpp"

namespace zero {

void check_engine_options(const EngineOptions& o) {
  ZERO_REQUIRE(o.stage >= 0 && o.stage <= 3,
               "engine: zero_optimization.stage must be 0, 1, 2 or 3, got " + std::to_string(o.stage));
  ZERO_REQUIRE(o.gradient_accumulation_steps >= 1,
               "engine: gradient_accumulation_steps must be >= 1, got " +
                   std::to_string(o.gradient_accumulation_steps));
  ZERO_REQUIRE(o.reduce_bucket_size >= 1,
               "engine: zero_optimization.reduce_bucket_size must be >= 1 element, got " +
                   std::to_string(o.reduce_bucket_size));
  ZERO_REQUIRE(o.prefetch_bucket_size >= 0 && o.max_live_parameters >= 0 &&
                   o.param_persistence_threshold >= 0,
               "engine: zero_optimization.stage3_prefetch_bucket_size, stage3_max_live_parameters "
               "and stage3_param_persistence_threshold must be >= 0");
  ZERO_REQUIRE(to_dtype(o.param_type).has_value(),
               "engine: parameters must be fp32, bf16 or fp16, got " +
                   std::string(to_string(o.param_type)));
  ZERO_REQUIRE(!o.offload_optimizer || o.stage >= 1,
               "engine: zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3 (stage 0 "
               "keeps the whole optimizer state on every rank): set zero_optimization.stage");
  ZERO_REQUIRE(!o.offload_param || o.stage == 3,
               "engine: zero_optimization.offload_param needs ZeRO stage 3 (only stage 3 "
               "partitions the parameters): set zero_optimization.stage to 3");
  ZERO_REQUIRE(!o.offload_param || o.offload_optimizer,
               "engine: zero_optimization.offload_param needs offload_optimizer too (the host "
               "optimizer writes the offloaded parameter shards): add offload_optimizer "
               "{\"device\": \"cpu\"}");
  ZERO_REQUIRE(o.param_nvme_path.empty() || o.offload_param,
               "engine: param_nvme_path is set but offload_param is off: set "
               "zero_optimization.offload_param.device to \"nvme\"");
  ZERO_REQUIRE(o.param_nvme_path.empty() || (o.param_buffer_count >= 1 && o.param_buffer_size >= 1 &&
                                             o.param_max_in_cpu >= 0),
               "engine: zero_optimization.offload_param.buffer_count and buffer_size must be >= 1 and "
               "max_in_cpu >= 0 with device \"nvme\" (got " + std::to_string(o.param_buffer_count) + ", " +
                   std::to_string(o.param_buffer_size) + ", " + std::to_string(o.param_max_in_cpu) + ")");
  ZERO_REQUIRE(!o.nvme.enabled() || o.offload_optimizer,
               "engine: an NVMe path for the optimizer state needs offload_optimizer (set "
               "zero_optimization.offload_optimizer.device to \"nvme\")");
  ZERO_REQUIRE(!o.nvme.enabled() || o.nvme.buffer_count >= 1,
               "engine: zero_optimization.offload_optimizer.buffer_count is " +
                   std::to_string(o.nvme.buffer_count) +
                   ": NVMe offload needs at least 1 swap buffer (2 or more to overlap I/O with AdamW)");
}

namespace {

// init_param_values over [begin, begin + count), in parallel chunks: each element's value is a
// function of (seed, name, element) alone, so the chunking changes no bit, and a billion-parameter
// model starts in seconds rather than minutes.
void init_values(const ParamSpec& spec, uint64_t seed, int64_t begin, int64_t count, float* out) {
  constexpr int64_t kChunk = int64_t{1} << 20;
  if (count <= kChunk) return init_param_values(spec, seed, begin, count, out);
  tbb::parallel_for(int64_t{0}, (count + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t first = c * kChunk, n = std::min(kChunk, count - first);
    init_param_values(spec, seed, begin + first, n, out + first);
  });
}

}  // namespace

void Engine::State::set_up() {
  x.plan_owned();
  params.plan();
  check_fits();
  params.allocate(host ? &host->memory() : nullptr, host ? &host->copies() : nullptr, nvme_store.get());
  grads.allocate();
  // The swap directory is per process (rank<r> under nvme_path): the world rank, since a
  // pipeline's or a tensor group's engines share a data-parallel rank.
  // Optimizer state and parameters on the same nvme_path share the engine's store (its rank
  // directory is locked by one store).
  offload::SwapStore* shared = nvme_store && x.o.nvme.path == x.o.param_nvme_path ? nvme_store.get() : nullptr;
  if (host) spec = host->allocate(spec, World::initialized() ? World::get().rank() : x.rank, shared);
  opt->allocate(spec);
  x.compute.synchronize();

  // Initial values: a pure function of (seed, name, element), so every stage and world size
  // starts from the same model. The working copy is the fp32 value rounded to the dtype.
  const Model& model = x.model;
  std::vector<float> vals;
  for (int g = 0; g < x.part.group_count(); ++g) {
    if (params.whole(g)) {  // the full working buffer, on every rank
      for (int p : x.part.group(g).params) {
        const Partition::Location& loc = x.part.location(p);
        vals.resize(static_cast<size_t>(loc.numel));
        init_values(model.params[static_cast<size_t>(p)], x.o.seed, 0, loc.numel, vals.data());
        x.upload_as(x.at(params.work(g), loc.offset, x.esize()), x.dtype, vals.data(), loc.numel);
      }
    }
    for (const Partition::Piece& pc : x.owned_pieces(g)) {
      vals.resize(static_cast<size_t>(pc.count));
      init_values(model.params[static_cast<size_t>(pc.param)], x.o.seed, pc.param_offset,
                  pc.count, vals.data());
      if (!params.whole(g))
        x.upload_as(params.working(g, pc.shard_offset), x.dtype, vals.data(), pc.count, params.shard_on_host(g));
      if (opt->keeps(0)) opt->write_state(g, 0, pc.shard_offset, vals.data(), pc.count);
    }
  }
  params.flush();  // shards on NVMe: the initial values on the drive

  if (host && host->swap()) host->swap()->flush();  // the initial masters onto the drive
  schedule = engine::local_schedule(static_cast<int>(model.units.size()), x.o.gradient_accumulation_steps);
  if (x.o.stage == 3) {
    params.set_order(engine::unit_order(schedule));
    params.prefetch(0);  // the first step's first groups
  }
}

}  // namespace zero
