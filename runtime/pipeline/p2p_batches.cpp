#include "runtime/pipeline/p2p_batches.hpp"

#include <vector>

namespace zero::pipeline {

std::optional<size_t> paired_receive(const Stage& list, size_t send) {
  if (send >= list.size()) return std::nullopt;
  const Op op = list[send].op;
  if (op != Op::send_activation && op != Op::send_gradient) return std::nullopt;
  const Op pair = op == Op::send_activation ? Op::recv_gradient : Op::recv_activation;
  size_t k = send + 1;
  while (k < list.size() && list[k].op == Op::load) ++k;
  if (k < list.size() && list[k].op == pair) return k;
  return std::nullopt;
}

namespace {

// One message: kind 0 an activation's header, 1 its data, 2 a gradient; from -> to.
struct Msg {
  int kind, from, to, micro;
  friend bool operator==(const Msg&, const Msg&) = default;
};

struct Batch {
  std::vector<Msg> ops;
  std::vector<bool> done;
  size_t origin;  // the list index the batch was posted at
};

// The messages of the transfer at `i` of stage s's list, appended to `ops`.
void add_transfer(const Stage& list, size_t i, int s, bool first_step, std::vector<Msg>& ops) {
  const Instruction& in = list[i];
  switch (in.op) {
    case Op::send_activation:
      ops.push_back({0, s, s + 1, in.micro});
      ops.push_back({1, s, s + 1, in.micro});
      break;
    case Op::recv_activation:
      ops.push_back({0, s - 1, s, in.micro});
      if (!first_step) ops.push_back({1, s - 1, s, in.micro});
      break;
    case Op::send_gradient: ops.push_back({2, s, s - 1, in.micro}); break;
    case Op::recv_gradient: ops.push_back({2, s + 1, s, in.micro}); break;
    default: break;
  }
}

std::vector<Batch> batches(const Stage& list, int s, Pairing pairing, bool first_step) {
  std::vector<Batch> out;
  std::vector<bool> taken(list.size(), false);
  for (size_t i = 0; i < list.size(); ++i) {
    if (taken[i]) continue;
    const Instruction& in = list[i];
    // First step: the data receive is posted alone at F, after the header's batch.
    if (first_step && in.op == Op::forward && s > 0) out.push_back({{{1, s - 1, s, in.micro}}, {}, i});
    Batch b{{}, {}, i};
    add_transfer(list, i, s, first_step, b.ops);
    if (b.ops.empty()) continue;
    if (pairing == Pairing::executor)
      if (const auto k = paired_receive(list, i)) {
        add_transfer(list, *k, s, first_step, b.ops);
        taken[*k] = true;
      }
    out.push_back(std::move(b));
  }
  for (Batch& b : out) b.done.assign(b.ops.size(), false);
  return out;
}

}  // namespace

StreamCheck check_unbuffered(std::span<const Stage> stages, Pairing pairing, bool first_step) {
  const int p = static_cast<int>(stages.size());
  std::vector<std::vector<Batch>> q;
  for (int s = 0; s < p; ++s) q.push_back(batches(stages[static_cast<size_t>(s)], s, pairing, first_step));
  std::vector<size_t> head(static_cast<size_t>(p), 0);
  auto current = [&](int s) -> Batch* {
    auto& v = q[static_cast<size_t>(s)];
    const size_t h = head[static_cast<size_t>(s)];
    return h < v.size() ? &v[h] : nullptr;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      Batch* b = current(s);
      if (!b) continue;
      for (size_t i = 0; i < b->ops.size(); ++i) {
        if (b->done[i]) continue;
        const Msg& m = b->ops[i];
        const int peer = m.from == s ? m.to : m.from;
        if (peer < 0 || peer >= p) continue;  // no such stage: never completes
        Batch* o = current(peer);
        if (!o) continue;
        for (size_t j = 0; j < o->ops.size(); ++j)
          if (!o->done[j] && o->ops[j] == m) {
            b->done[i] = o->done[j] = true;
            progress = true;
            break;
          }
      }
    }
    for (int s = 0; s < p; ++s)
      while (Batch* b = current(s)) {
        bool all = true;
        for (bool d : b->done) all = all && d;
        if (!all) break;
        ++head[static_cast<size_t>(s)];
        progress = true;
      }
  }
  StreamCheck r;
  for (int s = 0; s < p; ++s)
    if (const Batch* b = current(s)) {
      r.deadlocked = true;
      r.where += "stage " + std::to_string(s) + " waits in the batch posted at instruction " +
                 std::to_string(b->origin) + " (" +
                 to_string(stages[static_cast<size_t>(s)][b->origin]) + ")\n";
    }
  return r;
}

}  // namespace zero::pipeline
