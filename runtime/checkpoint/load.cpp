// load(), read_info() and latest(): find a complete checkpoint, check its manifest against the
// model, and re-slice the saved pieces into the pieces a rank wants now.
#include <algorithm>
#include <cmath>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_map>

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/crc32c.hpp"
#include "runtime/checkpoint/file_io.hpp"
#include "runtime/checkpoint/layout.hpp"
#include "runtime/checkpoint/manifest.hpp"
#include "runtime/checkpoint/pieces.hpp"
#include "runtime/checkpoint/rank_file.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace zero::checkpoint {

namespace {

using namespace detail;
namespace fs = std::filesystem;

// The complete checkpoints of `dir`: tag -> commit time. Damaged markers count as incomplete.
std::map<std::string, uint64_t> complete_tags(const std::string& dir) {
  std::map<std::string, uint64_t> tags;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::string tag = name;
    // dir/.<tag>.old stands for <tag> while dir/<tag> is missing (an interrupted replacement).
    if (name.size() > 5 && name[0] == '.' && name.ends_with(".old"))
      tag = name.substr(1, name.size() - 5);
    else if (name[0] == '.')
      continue;
    try {
      check_tag(tag);
      const std::string path = resolve(dir, tag);
      if (path != join(dir, name)) continue;
      if (!io::is_directory(path)) continue;
      if (const auto m = read_marker(path)) tags[tag] = m->committed_ns;
    } catch (const Error&) {
      // not a checkpoint
    }
  }
  return tags;
}

struct Opened {
  std::string path;  // the checkpoint directory read
  std::string manifest_path;
  Manifest manifest;
};

// Finds dir/tag, checks its marker and manifest.
Opened open_checkpoint(const std::string& dir, const std::string& tag) {
  check_tag(tag);
  Opened o;
  o.path = resolve(dir, tag);
  if (!io::is_directory(o.path)) {
    std::string have;
    for (const auto& [t, ns] : complete_tags(dir)) have += (have.empty() ? "" : ", ") + t;
    ZERO_FAIL("no checkpoint '" + tag + "' in " + io::quote(dir) + " (" + io::quote(o.path) +
              " does not exist)\nHINT: " +
              (have.empty() ? std::string("that directory holds no complete checkpoint")
                            : "the complete checkpoints there are: " + have));
  }
  if (o.path != join(dir, tag))
    log::warn("checkpoint " + io::quote(join(dir, tag)) + " is missing after an interrupted " +
              "replacement: loading the previous checkpoint of that tag from " +
              io::quote(o.path));
  const auto marker = read_marker(o.path);
  if (!marker)
    ZERO_FAIL("checkpoint " + io::quote(o.path) + " is incomplete: it has no " +
              std::string(kMarkerName) + " marker, so its save did not finish" +
              "\nHINT: load an earlier checkpoint (latest() names the newest complete one)");
  o.manifest_path = join(o.path, kManifestName);
  const std::string text = io::read_file(o.manifest_path, size_t{1} << 30, "checkpoint manifest",
                                         "the checkpoint directory is damaged; load an earlier "
                                         "checkpoint");
  if (crc32c(text) != marker->manifest_crc)
    ZERO_FAIL("checkpoint manifest " + io::quote(o.manifest_path) +
              " does not match the checksum in its " + std::string(kMarkerName) +
              " marker: it was modified or damaged after the save" +
              "\nHINT: restore it from a copy or load an earlier checkpoint");
  o.manifest = parse_manifest(text, o.manifest_path);
  if (o.manifest.tag != tag && o.path == join(dir, tag))
    log::warn("checkpoint " + io::quote(o.path) + " was saved under the tag '" + o.manifest.tag +
              "' and renamed");
  return o;
}

// Repeated-block structure of parameter names ("h.<i>.attn..."): the prefix with the most
// distinct indices and how many. {"", 0} when the names have none.
std::pair<std::string, size_t> layers(std::span<const ParamInfo> params) {
  std::map<std::string, std::set<long long>> found;
  for (const ParamInfo& p : params) {
    const std::string& n = p.name;
    for (size_t i = 0; i + 1 < n.size(); ++i) {
      if (n[i] != '.' || !std::isdigit(static_cast<unsigned char>(n[i + 1]))) continue;
      size_t j = i + 1;
      while (j < n.size() && std::isdigit(static_cast<unsigned char>(n[j]))) ++j;
      if (j < n.size() && n[j] != '.') continue;
      if (j - i > 12) break;
      found[n.substr(0, i)].insert(std::stoll(n.substr(i + 1, j - i - 1)));
      break;
    }
  }
  std::pair<std::string, size_t> best{"", 0};
  for (const auto& [prefix, idx] : found)
    if (idx.size() > best.second) best = {prefix, idx.size()};
  return best;
}

// Throws naming the manifest and the first difference between the saved and the model's table.
void compare_params(std::span<const ParamInfo> saved, std::span<const ParamInfo> model,
                    const std::string& manifest_path) {
  if (std::equal(saved.begin(), saved.end(), model.begin(), model.end())) return;
  const std::string head = "checkpoint " + io::quote(manifest_path) + " does not fit the model: ";
  const std::string hint =
      "\nHINT: pass the model the checkpoint was trained with (the same layers, widths and "
      "vocabulary, in the same parameter order); to take over only some weights, export them "
      "with export_safetensors and import them";
  const auto [lp, ls] = layers(saved);
  const auto [mp, ms] = layers(model);
  if (ls > 0 && lp == mp && ls != ms)
    ZERO_FAIL(head + "the checkpoint has " + std::to_string(ls) + " layers ('" + lp +
              ".<i>.' parameters), the model " + std::to_string(ms) + hint);
  const size_t n = std::min(saved.size(), model.size());
  for (size_t i = 0; i < n; ++i) {
    if (saved[i].name != model[i].name)
      ZERO_FAIL(head + "parameter " + std::to_string(i) + " is '" + saved[i].name +
                "' in the checkpoint and '" + model[i].name + "' in the model" + hint);
    if (saved[i].shape != model[i].shape)
      ZERO_FAIL(head + "parameter '" + saved[i].name + "' has shape " + shape_text(saved[i].shape) +
                " in the checkpoint and " + shape_text(model[i].shape) + " in the model" + hint);
  }
  ZERO_FAIL(head + "the checkpoint has " + std::to_string(saved.size()) +
            " parameters, the model " + std::to_string(model.size()) +
            "; the first extra one is '" +
            (saved.size() > model.size() ? saved[n].name + "' (checkpoint)"
                                         : model[n].name + "' (model)") +
            hint);
}

// One copy of the read plan: `count` elements from position `src` of rank file `file`'s arrays
// to position `dst` of this rank's arrays.
struct Copy {
  int file = 0;
  uint64_t src = 0, dst = 0, count = 0;
};

}  // namespace

Info read_info(const std::string& dir, const std::string& tag) {
  Opened o = open_checkpoint(dir, tag);
  Info info;
  info.path = o.path;
  info.world_size = o.manifest.world_size;
  info.save_id = o.manifest.save_id;
  info.params = std::move(o.manifest.params);
  info.arrays = std::move(o.manifest.arrays);
  info.metadata = std::move(o.manifest.metadata);
  return info;
}

std::optional<Newest> find_newest(const std::string& dir) {
  if (!io::is_directory(dir)) return std::nullopt;
  // Newest first; equal times (clock steps) by tag, so the choice is the same on every call.
  std::vector<std::pair<uint64_t, std::string>> order;
  for (const auto& [tag, ns] : complete_tags(dir)) order.emplace_back(ns, tag);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  std::optional<Newest> best;
  std::string skipped;
  std::map<std::string, std::string> damaged;  // tag -> why it was skipped
  for (const auto& [ns, tag] : order) {
    std::string why;
    if (verified_commit(resolve(dir, tag), &why)) {
      best = Newest{tag, {}};
      break;
    }
    damaged[tag] = why;
    skipped += (skipped.empty() ? "" : "; ") + std::string("'") + tag + "' is damaged (" + why + ")";
  }
  if (!best) return std::nullopt;

  // What latest says, compared with what the directory holds.
  const std::string file = join(dir, kLatestName);
  std::string why;
  if (!io::exists(file)) {
    why = "there is no latest file (the save that made '" + best->tag +
          "' could not write it, or it was removed)";
  } else {
    try {
      std::string named = io::read_file(file, 4096, "checkpoint latest file");
      while (!named.empty() && std::isspace(static_cast<unsigned char>(named.back())))
        named.pop_back();
      check_tag(named);
      if (named != best->tag) {
        std::string state;
        if (const auto it = damaged.find(named); it != damaged.end()) {
          state = "which is damaged (" + it->second + ")";
        } else if (std::string w; !verified_commit(resolve(dir, named), &w)) {
          state = "which cannot be loaded: " + w;
        } else {
          state = "but '" + best->tag + "' was committed after it (the save of '" + best->tag +
                  "' failed or was interrupted while writing latest)";
        }
        why = io::quote(file) + " names '" + named + "', " + state;
      }
    } catch (const Error& e) {
      why = "the latest file is unreadable: " + e.message();
    }
  }
  if (!skipped.empty()) why += (why.empty() ? "" : "; ") + std::string("newer ") + skipped;
  if (!why.empty())
    best->note = "taking '" + best->tag + "', the newest complete checkpoint in " +
                 io::quote(dir) + ": " + why;
  return best;
}

std::optional<std::string> latest(const std::string& dir) {
  std::optional<Newest> n = find_newest(dir);
  if (!n) return std::nullopt;
  if (!n->note.empty()) log::warn("checkpoint: " + n->note);
  return n->tag;
}

int64_t first_non_finite(std::span<const float> values) noexcept {
  for (size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i])) return static_cast<int64_t>(i);
  return -1;
}

LoadResult load(const std::string& dir, const std::string& tag, const LoadRequest& request) {
  const Opened o = open_checkpoint(dir, tag);
  const Manifest& m = o.manifest;
  compare_params(m.params, request.params, o.manifest_path);

  // The request itself.
  if (const std::string e = pieces_error(request.params, request.pieces); !e.empty())
    ZERO_FAIL("checkpoint load: this rank's request is invalid: " + e);
  const uint64_t wanted = total_count(request.pieces);
  std::vector<size_t> array_index;  // request array -> manifest array
  for (const Array& a : request.arrays) {
    const auto it = std::find(m.arrays.begin(), m.arrays.end(), a.name);
    if (it == m.arrays.end()) {
      std::string have;
      for (const std::string& s : m.arrays) have += (have.empty() ? "'" : ", '") + s + "'";
      ZERO_FAIL("checkpoint " + io::quote(o.path) + " has no array '" + a.name + "'; it holds " +
                (have.empty() ? std::string("none") : have) +
                "\nHINT: load only the arrays it saved (read_info() lists them), e.g. start the "
                "optimizer moments from zero when they were not saved");
    }
    ZERO_REQUIRE(wanted == 0 || a.data != nullptr, "checkpoint load: array '" + a.name +
                                                       "' is null but the pieces hold " +
                                                       std::to_string(wanted) + " elements");
    array_index.push_back(static_cast<size_t>(it - m.arrays.begin()));
  }

  // Where every saved element is; the saved pieces must tile the parameters exactly once.
  std::vector<std::vector<Piece>> saved;
  for (const Manifest::RankEntry& f : m.files) saved.push_back(f.pieces);
  Coverage coverage;
  if (const std::string gap = coverage.build(m.params, saved); !gap.empty())
    ZERO_FAIL("checkpoint manifest " + io::quote(o.manifest_path) + " is inconsistent: " + gap +
              "\nHINT: the checkpoint is damaged; load an earlier one");

  // The read plan, by file and position, adjacent copies merged.
  std::vector<Copy> plan;
  uint64_t dst = 0;
  for (const Piece& p : request.pieces) {
    for (const Coverage::Run& r : coverage.locate(p))
      plan.push_back({r.file, r.src, dst + r.dst, r.count});
    dst += static_cast<uint64_t>(p.length());
  }
  std::sort(plan.begin(), plan.end(), [](const Copy& a, const Copy& b) {
    return a.file != b.file ? a.file < b.file : a.src < b.src;
  });
  std::vector<Copy> merged;
  for (const Copy& c : plan) {
    if (!merged.empty()) {
      Copy& l = merged.back();
      if (l.file == c.file && l.src + l.count == c.src && l.dst + l.count == c.dst) {
        l.count += c.count;
        continue;
      }
    }
    merged.push_back(c);
  }

  // Each needed file once: check it against the manifest, then read its ranges.
  const uint64_t hash = param_table_hash(m.params);
  BlockCache cache;
  for (size_t i = 0; i < merged.size();) {
    const Manifest::RankEntry& entry = m.files[static_cast<size_t>(merged[i].file)];
    const std::string path = join(o.path, entry.file);
    const io::File f = io::File::open_read(path, "checkpoint rank file",
                                           "the checkpoint's manifest lists it (rank " +
                                               std::to_string(entry.rank) +
                                               "): restore it or load an earlier checkpoint");
    const RankFileHeader h = read_rank_header(f);
    const auto mismatch = [&](const std::string& what) {
      ZERO_FAIL("checkpoint rank file " + io::quote(path) +
                " does not match the manifest: " + what +
                "\nHINT: it comes from another save; restore the checkpoint's own file or "
                "load an earlier checkpoint");
    };
    if (h.save_id != m.save_id) mismatch("its save id differs");
    if (h.rank != entry.rank || h.world_size != m.world_size)
      mismatch("it is rank " + std::to_string(h.rank) + " of " + std::to_string(h.world_size) +
               ", the manifest says rank " + std::to_string(entry.rank) + " of " +
               std::to_string(m.world_size));
    if (h.param_hash != hash) mismatch("its parameter table differs");
    if (h.pieces != entry.pieces || h.numel != entry.numel) mismatch("its pieces differ");
    if (h.arrays != m.arrays) mismatch("its arrays differ");
    if (h.file_bytes != entry.bytes)
      mismatch("it has " + std::to_string(h.file_bytes) + " bytes, the manifest says " +
               std::to_string(entry.bytes));
    cache.clear();
    size_t end = i;
    while (end < merged.size() && merged[end].file == merged[i].file) ++end;
    for (size_t a = 0; a < request.arrays.size(); ++a)
      for (size_t k = i; k < end; ++k) {
        float* out = request.arrays[a].data + merged[k].dst;
        read_array_range(f, h, array_index[a], merged[k].src, merged[k].count, out, cache);
        if (!request.require_finite) continue;
        const int64_t bad = first_non_finite({out, static_cast<size_t>(merged[k].count)});
        if (bad < 0) continue;
        // Which parameter and element: the request piece holding position dst + bad.
        const uint64_t at = merged[k].dst + static_cast<uint64_t>(bad);
        uint64_t start = 0;
        size_t p = 0;
        while (p + 1 < request.pieces.size() &&
               start + static_cast<uint64_t>(request.pieces[p].length()) <= at)
          start += static_cast<uint64_t>(request.pieces[p++].length());
        const Piece& piece = request.pieces[p];
        // Element `at - start` of the piece: run (at - start) / count of it.
        const int64_t in = static_cast<int64_t>(at - start);
        const int64_t element = piece.offset + (in / piece.count) * piece.stride + in % piece.count;
        ZERO_FAIL("checkpoint rank file " + io::quote(path) + ": array '" + request.arrays[a].name +
                  "' holds a non-finite value (" + std::to_string(out[bad]) + ") for parameter '" +
                  request.params[static_cast<size_t>(piece.param)].name + "' at element " +
                  std::to_string(element) +
                  "\nHINT: the checkpoint was saved from a run that had diverged, or it was "
                  "altered; resume from an earlier checkpoint (name it in " +
                  io::quote(join(dir, kLatestName)) + ")");
      }
    i = end;
  }
  return {m.metadata, m.world_size};
}

}  // namespace zero::checkpoint
