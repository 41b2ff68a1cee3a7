#include "runtime/checkpoint/pieces.hpp"

#include <algorithm>
#include <cstdint>
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
    // A tensor rank's shard is saved as part of the whole parameter (whole_pieces), so the table
    // holds the whole shape: the same on every tensor rank and at every degree.
    const Shape& shape = p.slice.split == TensorSplit::none ? p.shape : p.slice.full;
    ParamInfo info{p.name, {}};
    for (int d = 0; d < shape.rank(); ++d) info.shape.push_back(shape[d]);
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
    std::string where = "piece " + std::to_string(i) + " {param " + std::to_string(p.param) +
                        ", offset " + std::to_string(p.offset) + ", count " +
                        std::to_string(p.count);
    if (p.repeat != 1)
      where += ", repeat " + std::to_string(p.repeat) + ", stride " + std::to_string(p.stride);
    where += "}";
    if (p.param < 0 || static_cast<size_t>(p.param) >= params.size())
      return where + " names no parameter (the table has " + std::to_string(params.size()) + ")";
    const ParamInfo& param = params[static_cast<size_t>(p.param)];
    const int64_t numel = param.numel();
    if (p.count <= 0) return where + " is empty (a piece has count > 0)";
    if (p.repeat < 1) return where + " has repeat < 1 (a piece has at least one run)";
    const std::string outside = where + " lies outside parameter '" + param.name + "' of " +
                                std::to_string(numel) + " elements";
    if (p.offset < 0 || p.offset > numel - p.count) return outside;
    if (p.repeat == 1) continue;
    if (p.stride < p.count)
      return where + " has overlapping runs: its stride is smaller than its count (runs r and " +
             "r + 1 share elements)";
    // The last run, [offset + (repeat - 1) * stride, + count), must end inside the parameter;
    // computed so that nothing overflows (numel <= 2^56).
    int64_t span = 0, length = 0;
    if (__builtin_mul_overflow(p.repeat - 1, p.stride, &span) ||
        __builtin_mul_overflow(p.repeat, p.count, &length))
      return where + " is too large: repeat x stride or repeat x count overflows 64 bits";
    if (span > numel - p.count - p.offset) {
      // offset + span may itself overflow; a run that far out is named by its start.
      int64_t first = 0;
      const bool far = __builtin_add_overflow(p.offset, span, &first);
      return where + ": its last run " +
             (far ? std::string("starts beyond 2^63") : "starts at " + std::to_string(first)) +
             ", outside parameter '" + param.name + "' of " + std::to_string(numel) +
             " elements";
    }
  }
  return {};
}

uint64_t total_count(std::span<const Piece> pieces) noexcept {
  uint64_t n = 0;
  for (const Piece& p : pieces) n += static_cast<uint64_t>(p.length());
  return n;
}

uint32_t pieces_version(std::span<const Piece> pieces) noexcept {
  for (const Piece& p : pieces)
    if (p.strided()) return 2;
  return 1;
}

std::string Coverage::build(std::span<const ParamInfo> params,
                            std::span<const std::vector<Piece>> files) {
  by_param_.assign(params.size(), {});
  std::vector<size_t> runs(params.size(), 0);
  for (const std::vector<Piece>& file : files)
    for (const Piece& p : file)
      runs.at(static_cast<size_t>(p.param)) += static_cast<size_t>(p.repeat);
  for (size_t i = 0; i < params.size(); ++i) by_param_[i].reserve(runs[i]);
  for (size_t f = 0; f < files.size(); ++f) {
    uint64_t pos = 0;
    for (const Piece& p : files[f]) {
      auto& v = by_param_[static_cast<size_t>(p.param)];
      for (int64_t r = 0; r < p.repeat; ++r) {
        v.push_back({p.offset + r * p.stride, p.count, static_cast<int>(f), pos});
        pos += static_cast<uint64_t>(p.count);
      }
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
    size_t kept = 0;  // v[0, kept) holds the merged runs
    for (size_t k = 0; k < v.size(); ++k) {
      const Saved s = v[k];
      if (s.offset > covered) return name + range(covered, s.offset) + " are saved by no rank";
      if (s.offset < covered)
        return name + range(s.offset, std::min(covered, s.offset + s.count)) +
               " are saved by rank " + std::to_string(last_file) + " and by rank " +
               std::to_string(s.file);
      covered = s.offset + s.count;
      last_file = s.file;
      // A run that continues the previous one in the parameter and in the same file's arrays
      // is the same run (contiguous pieces split in two, a strided piece with stride == count).
      Saved* prev = kept > 0 ? &v[kept - 1] : nullptr;
      if (prev && prev->file == s.file && prev->pos + static_cast<uint64_t>(prev->count) == s.pos)
        prev->count += s.count;
      else
        v[kept++] = s;
    }
    v.resize(kept);
    v.shrink_to_fit();
    if (covered < params[i].numel())
      return name + range(covered, params[i].numel()) + " are saved by no rank";
  }
  return {};
}

void Coverage::locate_run(int param, int64_t offset, int64_t count, uint64_t dst,
                          std::vector<Run>& out) const {
  const auto& v = by_param_.at(static_cast<size_t>(param));
  // The saved run holding `offset`: the last one starting at or before it.
  auto it = std::upper_bound(v.begin(), v.end(), offset,
                             [](int64_t off, const Saved& s) { return off < s.offset; });
  ZERO_REQUIRE(it != v.begin(), "checkpoint: coverage index has a gap");
  --it;
  const int64_t end = offset + count;
  for (int64_t at = offset; at < end; ++it) {
    ZERO_REQUIRE(it != v.end() && it->offset <= at && at < it->offset + it->count,
                 "checkpoint: coverage index has a gap");
    const int64_t stop = std::min(end, it->offset + it->count);
    out.push_back({it->file, it->pos + static_cast<uint64_t>(at - it->offset),
                   static_cast<uint64_t>(stop - at), dst + static_cast<uint64_t>(at - offset)});
    at = stop;
  }
}

std::vector<Coverage::Run> Coverage::locate(const Piece& want) const {
  std::vector<Run> runs;
  for (int64_t r = 0; r < want.repeat; ++r)
    locate_run(want.param, want.offset + r * want.stride, want.count,
               static_cast<uint64_t>(r * want.count), runs);
  return runs;
}

}  // namespace zero::checkpoint::detail
