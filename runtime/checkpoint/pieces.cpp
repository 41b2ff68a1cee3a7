#include "runtime/checkpoint/pieces.hpp"

#include <algorithm>
#include <string_view>
#include <unordered_set>

#include "core/error.hpp"
#include "core/unit.hpp"

namespace zero::checkpoint {

namespace {
std::string range(int64_t a, int64_t b) {
  return "[" + std::to_string(a) + ", " + std::to_string(b) + ")";
}
}  // namespace

int64_t ParamInfo::numel() const noexcept {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<ParamInfo> param_table(const Model& model) {
  std::vector<ParamInfo> t;
  t.reserve(model.params.size());
  for (const ParamSpec& p : model.params) {
    ParamInfo info{p.name, {}};
    for (int d = 0; d < p.shape.rank(); ++d) info.shape.push_back(p.shape[d]);
    t.push_back(std::move(info));
  }
  return t;
}

}  // namespace zero::checkpoint

namespace zero::checkpoint::detail {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string param_table_error(std::span<const ParamInfo> params) {
  std::unordered_set<std::string_view> names;
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    const std::string where = "parameter " + std::to_string(i) + " ('" + p.name + "')";
    if (p.name.empty()) return "parameter " + std::to_string(i) + " has an empty name";
    if (!names.insert(p.name).second) return where + " repeats the name of an earlier parameter";
    int64_t n = 1;
    for (int64_t d : p.shape) {
      if (d < 0) return where + " has a negative dimension in its shape " + shape_text(p.shape);
      if (__builtin_mul_overflow(n, d, &n) || n > (int64_t{1} << 56))
        return where + " has more than 2^56 elements";
    }
  }
  return {};
}

std::string pieces_error(std::span<const ParamInfo> params, std::span<const Piece> pieces) {
  for (size_t i = 0; i < pieces.size(); ++i) {
    const Piece& p = pieces[i];
    const std::string where = "piece " + std::to_string(i) + " {param " + std::to_string(p.param) +
                              ", offset " + std::to_string(p.offset) + ", count " +
                              std::to_string(p.count) + "}";
    if (p.param < 0 || static_cast<size_t>(p.param) >= params.size())
      return where + " names no parameter (the table has " + std::to_string(params.size()) + ")";
    const int64_t numel = params[static_cast<size_t>(p.param)].numel();
    if (p.count <= 0) return where + " is empty (a piece has count > 0)";
    if (p.offset < 0 || p.offset > numel - p.count)
      return where + " lies outside parameter '" + params[static_cast<size_t>(p.param)].name +
             "' of " + std::to_string(numel) + " elements";
  }
  return {};
}

uint64_t total_count(std::span<const Piece> pieces) noexcept {
  uint64_t n = 0;
  for (const Piece& p : pieces) n += static_cast<uint64_t>(p.count);
  return n;
}

std::string Coverage::build(std::span<const ParamInfo> params,
                            std::span<const std::vector<Piece>> files) {
  by_param_.assign(params.size(), {});
  for (size_t f = 0; f < files.size(); ++f) {
    uint64_t pos = 0;
    for (const Piece& p : files[f]) {
      by_param_.at(static_cast<size_t>(p.param))
          .push_back({p.offset, p.count, static_cast<int>(f), pos});
      pos += static_cast<uint64_t>(p.count);
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    auto& v = by_param_[i];
    std::sort(v.begin(), v.end(), [](const Saved& a, const Saved& b) {
      return a.offset != b.offset ? a.offset < b.offset : a.file < b.file;
    });
    const std::string name = "parameter '" + params[i].name + "' (" +
                             std::to_string(params[i].numel()) + " elements): elements ";
    int64_t covered = 0;  // [0, covered) is tiled so far
    int last_file = -1;
    for (const Saved& s : v) {
      if (s.offset > covered) return name + range(covered, s.offset) + " are saved by no rank";
      if (s.offset < covered)
        return name + range(s.offset, std::min(covered, s.offset + s.count)) +
               " are saved by rank " + std::to_string(last_file) + " and by rank " +
               std::to_string(s.file);
      covered = s.offset + s.count;
      last_file = s.file;
    }
    if (covered < params[i].numel())
      return name + range(covered, params[i].numel()) + " are saved by no rank";
  }
  return {};
}

std::vector<Coverage::Run> Coverage::locate(const Piece& want) const {
  const auto& v = by_param_.at(static_cast<size_t>(want.param));
  // The saved piece holding want.offset: the last one starting at or before it.
  auto it = std::upper_bound(v.begin(), v.end(), want.offset,
                             [](int64_t off, const Saved& s) { return off < s.offset; });
  ZERO_REQUIRE(it != v.begin(), "checkpoint: coverage index has a gap");
  --it;
  std::vector<Run> runs;
  const int64_t end = want.offset + want.count;
  for (int64_t at = want.offset; at < end; ++it) {
    ZERO_REQUIRE(it != v.end() && it->offset <= at && at < it->offset + it->count,
                 "checkpoint: coverage index has a gap");
    const int64_t stop = std::min(end, it->offset + it->count);
    runs.push_back({it->file, it->pos + static_cast<uint64_t>(at - it->offset),
                    static_cast<uint64_t>(stop - at), static_cast<uint64_t>(at - want.offset)});
    at = stop;
  }
  return runs;
}

}  // namespace zero::checkpoint::detail
