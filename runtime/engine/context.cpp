#include "runtime/engine/context.hpp"

#include "core/dtype.hpp"

namespace zero::engine {

Context::Context(Model& m, Device& d, Stream& c, coll::Communicator& k, EngineOptions opt,
                 PipelinePlace pl, TensorPlace tp)
    : model(m), dev(d), compute(c), comm(k), o(std::move(opt)), part(m, k.size()),
      rank(k.rank()), world(k.size()), place(std::move(pl)), tensor(tp), compute_done_(d.create_event()) {
  fence_[0] = d.create_event();
  fence_[1] = d.create_event();
}

void Context::plan_owned() {
  for (int g = 0; g < part.group_count(); ++g) {
    owned_begin.push_back(o.stage == 0 ? 0 : static_cast<int64_t>(rank) * part.group(g).shard_numel);
    owned_off.push_back(owned_total);
    owned_total += owned_len(g);
  }
  norm_runs.assign(static_cast<size_t>(part.group_count()), {});
  bool all_counted = true;
  for (int p = 0; p < static_cast<int>(model.params.size()); ++p) all_counted = all_counted && counted(p);
  for (int g = 0; g < part.group_count(); ++g) {
    auto& runs = norm_runs[static_cast<size_t>(g)];
    if (all_counted) {
      runs.push_back({0, owned_len(g)});
      continue;
    }
    // The owned range without the pieces counted elsewhere (padding between parameters is zero:
    // counting it or not changes nothing).
    int64_t at = 0;
    for (const Partition::Piece& pc : owned_pieces(g)) {
      if (counted(pc.param)) continue;
      if (pc.shard_offset > at) runs.push_back({at, pc.shard_offset - at});
      at = pc.shard_offset + pc.count;
    }
    if (owned_len(g) > at) runs.push_back({at, owned_len(g) - at});
  }
}

bool Context::tied(int p) const {
  for (int t : place.tied)
    if (t == p) return true;
  return false;
}

bool Context::counted(int p) const {
  if (place.active() && !place.owns_tied && tied(p)) return false;
  const ParamSlice& sl = model.params[static_cast<size_t>(p)].slice;
  return !(tensor.active() && sl.split == TensorSplit::replicated && sl.rank != 0);
}

std::vector<Partition::Piece> Context::owned_pieces(int g) const {
  if (o.stage != 0) return part.pieces(rank, g);
  std::vector<Partition::Piece> out;
  for (int p : part.group(g).params) {
    const Partition::Location& loc = part.location(p);
    out.push_back({p, 0, loc.offset, loc.numel});
  }
  return out;
}

Tensor Context::view(const Tensor& base, int param) const {
  const ParamSpec& spec = model.params[static_cast<size_t>(param)];
  return Tensor::view(at(base, part.location(param).offset, esize()), spec.shape, spec.type);
}

void Context::copy_now(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  dev.copy_async(dst, src, bytes, compute);
  compute.synchronize();
}

void Context::upload_as(void* dst, DType t, const float* vals, int64_t n, bool host) {
  if (host) return convert(vals, DType::f32, dst, t, static_cast<size_t>(n));
  std::vector<unsigned char> staged(static_cast<size_t>(n) * size_of(t));
  convert(vals, DType::f32, staged.data(), t, static_cast<size_t>(n));
  copy_now(dst, staged.data(), staged.size());
}

void Context::wait_comm(coll::Work& w) {
  if (!w.event() || w.test()) {
    w.wait();  // complete: only reports its error, if any
  } else if (o.timers) {
    compute.synchronize();
    const double t0 = now_seconds();
    w.wait();
    timers.exposed += now_seconds() - t0;
  } else {
    w.wait();
  }
  w = coll::Work();
}

}  // namespace zero::engine
