#include "runtime/engine/partition.hpp"

#include <algorithm>
#include <cstdio>

namespace zero {
namespace {
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
}  // namespace

Partition::Partition(const Model& model, int world_size) : world_size_(world_size) {
  ZERO_REQUIRE(world_size >= 1, "partition: world size must be >= 1, got " + std::to_string(world_size));
  const std::vector<int> last = model.last_gradient_unit();  // = first user of each parameter
  for (size_t p = 0; p < last.size(); ++p)
    ZERO_REQUIRE(last[p] >= 0, "partition: parameter " + model.params[p].name + " of model " +
                                   model.name + " is used by no Unit");
  groups_.resize(model.units.size());
  locations_.resize(model.params.size());
  for (size_t u = 0; u < groups_.size(); ++u) groups_[u].unit = static_cast<int>(u);
  for (size_t p = 0; p < model.params.size(); ++p) {
    Group& g = groups_[static_cast<size_t>(last[p])];
    const int64_t offset = round_up(g.used_numel, kAlignElems);
    locations_[p] = {last[p], offset, model.params[p].numel()};
    g.params.push_back(static_cast<int>(p));
    g.used_numel = offset + model.params[p].numel();
    param_total_ += model.params[p].numel();
  }
  const int64_t unit = static_cast<int64_t>(world_size) * kAlignElems;
  for (Group& g : groups_) {
    g.padded_numel = round_up(g.used_numel, unit);
    g.shard_numel = g.padded_numel / world_size;
    shard_concat_.push_back(shard_total_);
    shard_total_ += g.shard_numel;
    padded_total_ += g.padded_numel;
  }
  unit_groups_.resize(model.units.size());
  for (size_t u = 0; u < model.units.size(); ++u) {
    std::vector<int>& ug = unit_groups_[u];
    for (int id : model.units[u]->param_ids()) ug.push_back(locations_[static_cast<size_t>(id)].group);
    std::sort(ug.begin(), ug.end());
    ug.erase(std::unique(ug.begin(), ug.end()), ug.end());
  }
}

int64_t Partition::shard_begin(int group, int rank) const {
  ZERO_REQUIRE(rank >= 0 && rank < world_size_, "partition: rank " + std::to_string(rank) +
                                                    " outside a world of " + std::to_string(world_size_));
  return static_cast<int64_t>(rank) * this->group(group).shard_numel;
}

std::vector<Partition::Piece> Partition::pieces(int rank, int group) const {
  const Group& g = this->group(group);
  const int64_t lo = shard_begin(group, rank), hi = lo + g.shard_numel;
  std::vector<Piece> out;
  for (int p : g.params) {
    const Location& loc = locations_[static_cast<size_t>(p)];
    const int64_t b = std::max(lo, loc.offset), e = std::min(hi, loc.offset + loc.numel);
    if (b < e) out.push_back({p, b - loc.offset, b - lo, e - b});
  }
  return out;
}

std::string Partition::describe(const Model& model) const {
  std::string s = "partition of " + model.name + " over " + std::to_string(world_size_) +
                  " rank(s), " + std::to_string(param_total_) + " parameters\n";
  char line[160];
  std::snprintf(line, sizeof line, "%-12s %7s %14s %14s %9s\n", "group", "params", "padded", "shard", "padding");
  s += line;
  for (const Group& g : groups_) {
    int64_t used = 0;
    for (int p : g.params) used += model.params[static_cast<size_t>(p)].numel();
    std::snprintf(line, sizeof line, "%-12s %7zu %14lld %14lld %8.2f%%\n",
                  model.units[static_cast<size_t>(g.unit)]->name().c_str(), g.params.size(),
                  static_cast<long long>(g.padded_numel), static_cast<long long>(g.shard_numel),
                  g.padded_numel ? 100.0 * static_cast<double>(g.padded_numel - used) / static_cast<double>(g.padded_numel) : 0.0);
    s += line;
  }
  return s;
}

}  // namespace zero
