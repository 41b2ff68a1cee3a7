#include "runtime/engine/param_residency.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace zero::engine {

void ParamResidency::plan() {
  const size_t G = static_cast<size_t>(x_.part.group_count());
  whole_.resize(G);
  // In a data-parallel world of one, a stage-3 shard is the whole group: kept in device memory
  // it is used in place, where gathering it would only copy it into a pooled buffer of the same
  // size before every use (GPT-2 124M: 1 GB of copies per step on the communicator's thread).
  // Shards offloaded to the host still come up before each use.
  const bool alone = x_.world == 1 && !x_.off_param;
  for (size_t g = 0; g < G; ++g)
    whole_[g] = x_.o.stage < 3 || alone ||
                x_.part.group(static_cast<int>(g)).padded_numel <= x_.o.param_persistence_threshold;
  work_.resize(G);
  gathered_.resize(G);
  gathering_.resize(G);
  drive_.assign(G, false);
  if (!x_.off_param || x_.o.param_nvme_path.empty()) return;
  // DeepSpeed's max_in_cpu: up to that many elements of shards stay in host RAM (the first
  // groups, in group order); the rest go to the drive, each within one swap buffer.
  int64_t in_cpu = 0;
  for (size_t g = 0; g < G; ++g) {
    if (whole_[g]) continue;
    const Partition::Group& grp = x_.part.group(static_cast<int>(g));
    if (in_cpu + grp.shard_numel <= x_.o.param_max_in_cpu) {
      in_cpu += grp.shard_numel;
      continue;
    }
    ZERO_REQUIRE(grp.shard_numel <= x_.o.param_buffer_size,
                 "engine: parameter group " + std::to_string(g) + " (" +
                     x_.model.params[static_cast<size_t>(grp.params.front())].name + ", ...) has a shard of " +
                     std::to_string(grp.shard_numel) + " elements on this rank, more than "
                     "zero_optimization.offload_param.buffer_size (" + std::to_string(x_.o.param_buffer_size) +
                     "): a shard is read from the drive into one swap buffer. Raise buffer_size to at "
                     "least " + std::to_string(grp.shard_numel) + " or use more ranks");
    drive_[g] = true;
  }
}

void ParamResidency::allocate(offload::HostMemory* host, offload::CopyEngine* copies, offload::SwapStore* store) {
  copies_ = copies;
  // The swap buffers: no more than there are groups on the drive, and no larger than the
  // largest of their shards (buffer_size is a bound, DeepSpeed's default 1e8 elements).
  int on_drive = 0;
  int64_t largest = 0;
  for (int g = 0; g < x_.part.group_count(); ++g)
    if (shard_on_drive(g)) {
      ++on_drive;
      largest = std::max(largest, x_.part.group(g).shard_numel);
    }
  if (on_drive > 0) {
    ZERO_REQUIRE(store, "engine: parameters on NVMe need the swap store (a ParamResidency misuse)");
    swap_ = std::make_unique<ParamSwap>(*store, *host, std::min(x_.o.param_buffer_count, on_drive),
                                        static_cast<size_t>(largest) * x_.esize());
  }
  const ScalarType st = scalar_type(x_.dtype);
  for (int g = 0; g < x_.part.group_count(); ++g) {
    const Partition::Group& grp = x_.part.group(g);
    const size_t gi = static_cast<size_t>(g);
    if (shard_on_drive(g)) {  // the shard lives in a file
      h_shard_.emplace_back();
      swap_->add(g, static_cast<size_t>(grp.shard_numel) * x_.esize());
    } else if (shard_on_host(g)) {  // the shard lives on the host
      h_shard_.push_back(host->allocate(static_cast<size_t>(grp.shard_numel) * x_.esize(), MemCategory::parameters));
    } else {
      h_shard_.emplace_back();
      const int64_t n = whole_[gi] ? grp.padded_numel : grp.shard_numel;
      work_[gi] = Tensor::zeros(x_.dev, x_.compute, Shape{n}, st, MemCategory::parameters);
    }
  }
}

unsigned char* ParamResidency::working(int g, int64_t k) {
  const size_t gi = static_cast<size_t>(g);
  if (shard_on_drive(g)) return swap_->stage(g) + static_cast<size_t>(k) * x_.esize();
  if (shard_on_host(g)) return static_cast<unsigned char*>(h_shard_[gi].data()) + static_cast<size_t>(k) * x_.esize();
  return x_.at(work_[gi], work_owned_begin(g) + k, x_.esize());
}

std::vector<Tensor> ParamResidency::views(int unit) const {
  std::vector<Tensor> out;
  for (int id : x_.model.units[static_cast<size_t>(unit)]->param_ids()) {
    const int group = x_.part.location(id).group;
    const size_t g = static_cast<size_t>(group);
    const Tensor& base = whole_[g] ? work_[g] : gathered_[g];
    ZERO_REQUIRE(base, "engine: group " + std::to_string(group) + " of " +
                           x_.model.params[static_cast<size_t>(id)].name + " is not present for unit " +
                           x_.model.units[static_cast<size_t>(unit)]->name());
    out.push_back(x_.view(base, id));
  }
  return out;
}

// Stage 3: starts the all-gather of group g into a pooled full buffer unless it is whole,
// present or in flight. Returns at once: it runs on the communicator's stream.
void ParamResidency::gather_group(int g) {
  const size_t gi = static_cast<size_t>(g);
  if (present(g)) return;
  const Partition::Group& grp = x_.part.group(g);
  gathered_[gi] = pool_.take(x_.dev, grp.padded_numel, scalar_type(x_.dtype));
  live_elems_ += grp.padded_numel;
  // The collective (or the copy) starts after the compute stream's current point: the shard
  // (work_[g]) is written there by the optimizer step's AdamW, and a freshly allocated buffer is
  // ordered on the compute stream. The host runs at most one Unit ahead of the compute stream,
  // so this waits for little.
  Event* after = x_.compute_point();
  const void* send = work_[gi].data();
  if (x_.off_param) {
    // The shard comes up from the host into its own place in the full buffer, and is gathered
    // in place from there. The host waits for the copy: on cuda a DMA of 1/N of the group.
    unsigned char* mine = x_.at(gathered_[gi], x_.owned_begin[gi], x_.esize());
    const double t0 = now_seconds();
    const size_t bytes = static_cast<size_t>(grp.shard_numel) * x_.esize();
    if (shard_on_drive(g)) {  // from its swap buffer (read ahead, or now)
      offload::HostBuffer& from = swap_->acquire(g);
      copies_->to_device(mine, from, 0, bytes, after).wait();
      swap_->release(g);
      read_ahead();
    } else {
      copies_->to_device(mine, h_shard_[gi], 0, bytes, after).wait();
    }
    x_.timers.h2d += now_seconds() - t0;
    send = mine;
    after = nullptr;
  }
  gathering_[gi] = x_.post([&](Event* a) {
    return x_.comm.all_gather(send, gathered_[gi].data(), static_cast<size_t>(grp.shard_numel), x_.dtype, a);
  }, after);
  if (!x_.o.overlap_comm) x_.wait_comm(gathering_[gi]);
}

// chain() makes the compute stream wait, not the host; with timers the host waits instead (the
// compute stream is idle here anyway: the host is at most one Unit ahead) so the wait can be
// measured.
void ParamResidency::use(int unit) {
  for (int g : x_.part.unit_groups(unit)) {
    if (x_.o.stage == 3) gather_group(g);
    coll::Work& w = gathering_[static_cast<size_t>(g)];
    if (x_.o.timers) {
      x_.wait_comm(w);
    } else {
      w.chain(x_.compute);
      w = coll::Work();
    }
  }
}

// The window of groups ahead (present or not, whole groups aside) holds at most
// prefetch_bucket_size elements or the next Unit's, and never more than max_live_parameters are
// gathered at once. Stops at the first Unit that does not fit, so what is gathered ahead is
// always a prefix of what comes next.
void ParamResidency::prefetch(size_t from) {
  pos_ = from;
  read_ahead();
  if (x_.o.prefetch_bucket_size <= 0) return;
  int64_t budget = x_.o.prefetch_bucket_size;
  std::vector<bool> counted(gathered_.size(), false);
  for (size_t q = from; q < order_.size(); ++q) {
    int64_t size = 0, need = 0;
    for (int g : x_.part.unit_groups(order_[q])) {
      const size_t gi = static_cast<size_t>(g);
      if (whole_[gi] || counted[gi]) continue;
      size += x_.part.group(g).padded_numel;
      if (!gathered_[gi]) need += x_.part.group(g).padded_numel;
    }
    // The next Unit is gathered ahead even when it alone is larger than the bucket: DeepSpeed
    // would prefetch part of it, our unit of gathering is the whole group.
    if ((size > budget && q != from) || live_elems_ + need > x_.o.max_live_parameters) return;
    budget -= size;
    for (int g : x_.part.unit_groups(order_[q])) {
      counted[static_cast<size_t>(g)] = true;
      gather_group(g);
    }
  }
}

// The next Unit's groups are "reused soon": the head's, between forward and backward. The views
// the finished Unit was given own nothing and its ops may still be queued: wait for the compute
// stream first (this is also the engine's one-Unit bound on how far the host runs ahead).
void ParamResidency::release_after(size_t pos) {
  pos_ = pos + 1;
  x_.compute_point()->synchronize();
  std::vector<bool> keep(gathered_.size(), false);
  for (size_t q = pos + 1; q < order_.size(); ++q) {
    bool all = true;
    for (int g : x_.part.unit_groups(order_[q])) all = all && present(g);
    if (!all) break;
    for (int g : x_.part.unit_groups(order_[q])) keep[static_cast<size_t>(g)] = true;
  }
  for (size_t g = 0; g < gathered_.size(); ++g)
    if (!keep[g] && gathered_[g]) {
      x_.wait_comm(gathering_[g]);  // a prefetch nobody used (cannot happen in order; cheap if done)
      live_elems_ -= x_.part.group(static_cast<int>(g)).padded_numel;
      pool_.give(gathered_[g]);
    }
  read_ahead();
}

void ParamResidency::release_all() {
  x_.compute_point()->synchronize();
  for (size_t g = 0; g < gathered_.size(); ++g)
    if (gathered_[g]) {
      x_.wait_comm(gathering_[g]);
      live_elems_ -= x_.part.group(static_cast<int>(g)).padded_numel;
      pool_.give(gathered_[g]);
    }
}

void ParamResidency::gather_whole(int g, Event* after) {
  const size_t gi = static_cast<size_t>(g);
  const Partition::Group& grp = x_.part.group(g);
  gathering_[gi] = x_.post([&](Event* a) {
    return x_.comm.all_gather(x_.at(work_[gi], x_.owned_begin[gi], x_.esize()), work_[gi].data(),
                              static_cast<size_t>(grp.shard_numel), x_.dtype, a);
  }, after);
  if (!x_.o.overlap_comm) x_.wait_comm(gathering_[gi]);
}

void ParamResidency::gather_whole_now() {
  for (int g = 0; g < x_.part.group_count() && x_.o.stage >= 1; ++g) {
    const size_t gi = static_cast<size_t>(g);
    if (!whole_[gi]) continue;
    x_.comm.all_gather(x_.at(work_[gi], x_.owned_begin[gi], x_.esize()), work_[gi].data(),
                       static_cast<size_t>(x_.part.group(g).shard_numel), x_.dtype).wait();
  }
}

void ParamResidency::wait_gathers() {
  for (coll::Work& w : gathering_) w.wait();
}

// The shards on the drive the next Units need and do not have gathered, in the order they need
// them, as many as there are swap buffers; never past the step's end (the optimizer step will
// change every shard).
void ParamResidency::read_ahead() {
  if (!swap_) return;
  std::vector<int> next;
  const size_t room = static_cast<size_t>(std::min(x_.o.param_buffer_count, x_.part.group_count()));
  for (size_t q = pos_; q < order_.size() && next.size() < room; ++q)
    for (int g : x_.part.unit_groups(order_[q]))
      if (shard_on_drive(g) && !present(g) && std::find(next.begin(), next.end(), g) == next.end())
        next.push_back(g);
  swap_->read_ahead(next);
}

void ParamResidency::quiesce() noexcept {
  if (swap_) swap_->quiesce();
  for (coll::Work& w : gathering_) {
    try { w.wait(); } catch (...) {}
    w = coll::Work();
  }
}

}  // namespace zero::engine
