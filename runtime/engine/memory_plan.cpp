// What the model state takes, from the partition and the options alone: the ZeRO paper's
// formula per category (engine.hpp, expected_model_state), the offloaded part, the transient
// buffers' bound, the check that refuses a model that cannot fit before allocating it, and the
// start-up report.
#include <algorithm>
#include <cstdio>
#include <map>
#include <string>

#include "runtime/engine/engine_state.hpp"

namespace zero {

Engine::ModelStateBytes Engine::State::device_state() const {
  const size_t psi = static_cast<size_t>(x.part.padded_numel_total());
  const size_t shard = static_cast<size_t>(x.part.shard_numel_total());
  const size_t e = size_of(x.dtype);
  const size_t owned = x.o.stage == 0 ? psi : shard;
  ModelStateBytes b;
  for (int g = 0; g < x.part.group_count(); ++g) {
    const Partition::Group& grp = x.part.group(g);
    const bool w = params.whole(g);
    if (!w && x.off_param) continue;  // on the host
    b.parameters += e * static_cast<size_t>(w ? grp.padded_numel : grp.shard_numel);
  }
  if (x.o.stage <= 1)
    b.gradients = e * psi + (x.fp32_full_sum() ? 4 * psi : 0);  // + the fp32 sum, see above
  else if (!x.off)
    b.gradients = (x.o.gradient_accumulation_steps > 1 ? 4 : e) * shard;
  if (!x.off) {
    b.master = x.dtype == DType::f32 ? 0 : 4 * owned;
    b.optimizer = 8 * owned;
  }
  return b;
}

Engine::ModelStateBytes Engine::State::host_state(bool second_bank) const {
  ModelStateBytes b;
  if (!x.off) return b;
  const size_t owned = static_cast<size_t>(x.owned_total);
  const size_t e = size_of(x.dtype);
  // The updated 16-bit shard on its way up; with NVMe offload written over the landed gradient
  // (HostOffload::out), so counted once, as gradients.
  b.parameters = x.o.nvme.enabled() ? 0 : e * owned;
  // Partitioned shards in host RAM; those on NVMe take the swap buffers instead (ParamResidency:
  // at most buffer_count of them, each as large as the largest shard on the drive, padded).
  size_t on_drive = 0, largest = 0;
  for (int g = 0; g < x.part.group_count() && x.off_param; ++g) {
    if (params.whole(g)) continue;
    const size_t shard = e * static_cast<size_t>(x.part.group(g).shard_numel);
    if (!params.shard_on_drive(g)) {
      b.parameters += shard;
    } else {
      ++on_drive;
      largest = std::max(largest, shard);
    }
  }
  if (on_drive > 0)
    b.parameters += std::min(on_drive, static_cast<size_t>(x.o.param_buffer_count)) * offload::SwapStore::padded(largest);
  b.gradients = e * owned + (x.host_fp32_acc() ? 4 * owned : 0);
  if (x.o.nvme.enabled()) {
    // On the drive (nvme_state()); in host memory only the swap buffers: buffer_count slots and
    // the access buffer, each the largest sub-group's master | m | v.
    size_t largest = offload::kAioAlignment;
    for (int g = 0; g < x.part.group_count(); ++g)
      for (int64_t n : engine::OptimizerSwap::cut(x.owned_len(g), x.o.nvme.sub_group_size))
        largest = std::max(largest, 3 * offload::SwapStore::padded(static_cast<size_t>(n) * 4));
    b.optimizer = largest * static_cast<size_t>(x.o.nvme.buffer_count + 1);
    return b;
  }
  const size_t banks = second_bank ? 2 : 1;  // the speculative step's second copy
  b.master = 4 * owned * banks;
  b.optimizer = 8 * owned * banks;
  return b;
}

Engine::ModelStateBytes Engine::State::nvme_state() const {
  ModelStateBytes b;
  if (!x.off || !x.o.nvme.enabled()) return b;
  for (int g = 0; g < x.part.group_count(); ++g)
    for (int64_t n : engine::OptimizerSwap::cut(x.owned_len(g), x.o.nvme.sub_group_size)) {
      const size_t seg = offload::SwapStore::padded(static_cast<size_t>(n) * 4);
      b.master += seg;
      b.optimizer += 2 * seg;
    }
  return b;
}

namespace {

std::string state_text(const Engine::ModelStateBytes& b) {
  return format_bytes(b.total()) + " (parameters " + format_bytes(b.parameters) + ", gradients " +
         format_bytes(b.gradients) + ", master weights " + format_bytes(b.master) +
         ", optimizer states " + format_bytes(b.optimizer) + ")";
}

}  // namespace

// A model whose state cannot fit is refused here, before its first byte is allocated: filling
// memory up to the limit first would take time and, where the limit is the machine's, push
// other processes out. Activations and transient buffers come on top, so passing this check is
// necessary, not sufficient; the ledger still refuses any allocation past a capacity.
void Engine::State::check_fits() const {
  const MemoryLedger& ledger = x.dev.ledger();
  const ModelStateBytes d = device_state(), h = host_state(false);
  const size_t dcap = ledger.capacity(MemSpace::device), hcap = ledger.capacity(MemSpace::host);
  const size_t shared = ledger.shared_capacity();
  const size_t dnow = ledger.current(MemSpace::device), hnow = ledger.current(MemSpace::host);
  auto over = [](size_t now, size_t need, size_t cap) { return need > cap || now > cap - need; };
  std::string what, hint;
  if (over(dnow, d.total(), dcap)) {
    what = "out of device memory on " + x.dev.name() + ": the model state needs " + state_text(d) +
           " per rank, and " + format_bytes(dcap - std::min(dcap, dnow)) + " of the device's " +
           format_bytes(dcap) + " are free";
    hint = "use a higher ZeRO stage, more ranks, offload (offload_optimizer, offload_param), or a "
           "larger zero_train.device_memory_limit";
  } else if (over(hnow, h.total(), hcap)) {
    what = "out of host memory on " + x.dev.name() + ": the offloaded model state needs " +
           state_text(h) + " per rank, and " + format_bytes(hcap - std::min(hcap, hnow)) +
           " of the host memory limit " + format_bytes(hcap) + " are free";
    hint = "use more ranks (on more nodes), a smaller model, or a larger "
           "zero_train.host_memory_limit if the host really has the memory";
    if (x.o.nvme.enabled())
      hint = "the optimizer state's swap buffers take (buffer_count + 1) x 12 bytes x the largest "
             "sub-group: lower zero_optimization.sub_group_size (now " + std::to_string(x.o.nvme.sub_group_size) +
             ") or offload_optimizer.buffer_count, or " + hint;
  } else if (shared != kUnlimited && over(dnow + hnow, d.total() + h.total(), shared)) {
    what = "out of memory on " + x.dev.name() + ": the model state needs " + state_text(d) +
           " of device memory" + (h.total() ? " and " + state_text(h) + " of host memory" : "") +
           " per rank, and " + format_bytes(shared - std::min(shared, dnow + hnow)) + " of the " +
           format_bytes(shared) + " that device and host memory share here are free";
    hint = "on this device, device and host memory are the same RAM, so offloading makes no room: "
           "use a higher ZeRO stage, more ranks on more nodes, a smaller model, or give the job "
           "more memory (the container's or the batch system's memory limit)";
  }
  if (what.empty()) return;
  throw OutOfMemory(what + " (checked before allocating any of it)\nHINT: " + hint + ".",
                    ledger.snapshot());
}

Engine::ModelStateBytes Engine::expected_model_state() const { return s_->device_state(); }

Engine::ModelStateBytes Engine::expected_host_state() const { return s_->host_state(s_->spec); }

offload::CopyCounters Engine::offload_traffic() const {
  return s_->host ? s_->host->counters() : offload::CopyCounters{};
}

engine::ParamNvmeCounters Engine::param_nvme_counters() const { return s_->params.nvme_counters(); }

Engine::ModelStateBytes Engine::expected_nvme_state() const { return s_->nvme_state(); }

Engine::NvmeTraffic Engine::nvme_traffic(bool settle) const {
  NvmeTraffic t;
  // The parameter shards' files and bytes moved (offload_param nvme), then the optimizer state's.
  const engine::ParamNvmeCounters p = s_->params.nvme_counters();
  t.read = p.bytes_read;
  t.written = p.bytes_written;
  t.on_drive = p.bytes_on_drive;
  engine::OptimizerSwap* swap = s_->host ? s_->host->swap() : nullptr;
  if (!swap) return t;
  if (settle) s_->host->sync();
  t.read += swap->bytes_read();
  t.written += swap->bytes_written();
  t.on_drive += swap->bytes_on_drive();
  t.io_seconds = swap->io_seconds();
  t.busy_seconds = swap->io_busy_seconds();
  t.exposed_seconds = swap->io_exposed_seconds();
  return t;
}

// The pools hold, per size class s (groups of padded size s, `count` of them), as many buffers
// as were ever in use at once:
//   gradients (stage 2/3): the groups being added to (at most two: the Unit's own and the tied
//     embedding's, held from the head's backward to the embedding's) plus those in reduction
//     (total at most max(reduce_bucket_size, s) elements, so at most max(1, bucket / s) of s);
//   parameters (stage 3): at most max_live_parameters elements gathered ahead, plus the current
//     Unit's groups (gathered even past the bound).
size_t Engine::transient_bound() const {
  const State& s = *s_;
  std::map<int64_t, int64_t> count;
  int64_t unit_max = 0;
  for (int g = 0; g < s.x.part.group_count(); ++g) ++count[s.x.part.group(g).padded_numel];
  for (int u = 0; u < static_cast<int>(s.x.model.units.size()); ++u) {
    int64_t n = 0;
    for (int g : s.x.part.unit_groups(u)) n += s.x.part.group(g).padded_numel;
    unit_max = std::max(unit_max, n);
  }
  size_t bytes = 0;
  for (const auto& [size, n] : count) {
    if (s.x.o.stage >= 2) {
      const int64_t in_use = 2 + std::max<int64_t>(1, s.x.o.reduce_bucket_size / size);
      bytes += static_cast<size_t>(size * std::min(n, in_use)) * s.x.esize();
    }
    if (s.x.o.stage == 3) {
      const int64_t in_use = (std::min(s.x.o.max_live_parameters, int64_t{1} << 50) + unit_max) / size;
      bytes += static_cast<size_t>(size * std::min(n, in_use)) * s.x.esize();
    }
  }
  return bytes;
}

std::string Engine::memory_report() const {
  const State& s = *s_;
  const ModelStateBytes b = expected_model_state();
  const LedgerSnapshot snap = s.x.dev.ledger().snapshot();
  const double psi = static_cast<double>(s.x.model.parameter_count());
  std::string out = "ZeRO stage " + std::to_string(s.x.o.stage) + ", " + std::to_string(s.x.world) +
                    " rank(s), " + std::string(to_string(s.x.dtype)) + " parameters, " +
                    std::to_string(s.x.model.parameter_count()) + " parameters (" +
                    std::to_string(s.x.part.padded_numel_total()) + " padded)\n";
  char line[400];
  std::snprintf(line, sizeof line,
                "model state per rank: expected %s = %.2f bytes/parameter (params %s, grads %s, "
                "master %s, adam %s)\n",
                format_bytes(b.total()).c_str(), static_cast<double>(b.total()) / psi,
                format_bytes(b.parameters).c_str(), format_bytes(b.gradients).c_str(),
                format_bytes(b.master).c_str(), format_bytes(b.optimizer).c_str());
  out += line;
  if (s.host) {
    const ModelStateBytes h = expected_host_state();
    std::snprintf(line, sizeof line,
                  "offloaded to host memory: %s (params %s, grads %s, master %s, adam %s); %s\n",
                  format_bytes(h.total()).c_str(), format_bytes(h.parameters).c_str(),
                  format_bytes(h.gradients).c_str(), format_bytes(h.master).c_str(),
                  format_bytes(h.optimizer).c_str(), s.host->summary().c_str());
    out += line;
    if (const engine::OptimizerSwap* swap = s.host->swap()) {
      const ModelStateBytes n = expected_nvme_state();
      std::snprintf(line, sizeof line, "optimizer state on NVMe: %s (master %s, adam %s) in %s\n",
                    format_bytes(n.total()).c_str(), format_bytes(n.master).c_str(),
                    format_bytes(n.optimizer).c_str(), swap->directory().c_str());
      out += line;
    }
  }
  return out + snap.table();
}


}  // namespace zero
