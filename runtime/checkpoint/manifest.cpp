#include "runtime/checkpoint/manifest.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <limits>

#include "runtime/checkpoint/file_io.hpp"
#include "runtime/checkpoint/pieces.hpp"
#include "core/error.hpp"

namespace zero::checkpoint::detail {

namespace {

// Insertion-ordered: the metadata keeps the caller's key order.
using Json = nlohmann::ordered_json;

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Reading with a JSON path in every message.
class Reader {
 public:
  explicit Reader(const std::string& path) : path_(path) {}

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    ZERO_FAIL("checkpoint manifest " + io::quote(path_) + ": " + where + " " + what +
              "\nHINT: the manifest is damaged or was edited; restore it from a copy or load an "
              "earlier checkpoint");
  }
  const Json& field(const Json& obj, const char* key, const std::string& where) const {
    const auto it = obj.find(key);
    if (it == obj.end()) fail(where, std::string("has no field '") + key + "'");
    return *it;
  }
  int64_t integer(const Json& v, const std::string& where, int64_t lo,
                  int64_t hi = std::numeric_limits<int64_t>::max()) const {
    if (!v.is_number_integer()) fail(where, "is not an integer");
    const bool too_big =
        v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max());
    const int64_t x = too_big ? 0 : v.get<int64_t>();
    if (too_big || x < lo || x > hi)
      fail(where,
           "is " + v.dump() + ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return x;
  }
  std::string string(const Json& v, const std::string& where) const {
    if (!v.is_string()) fail(where, "is not a string");
    return v.get<std::string>();
  }
  const Json& array(const Json& v, const std::string& where) const {
    if (!v.is_array()) fail(where, "is not an array");
    return v;
  }
  uint64_t hex(const Json& v, const std::string& where) const {
    const std::string s = string(v, where);
    if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
      fail(where, "is not 16 lower-case hex digits");
    return std::stoull(s, nullptr, 16);
  }

 private:
  const std::string& path_;
};

}  // namespace

std::string manifest_to_json(const Manifest& m) {
  Json j;
  j["magic"] = kManifestMagic;
  j["version"] = m.version;
  j["tag"] = m.tag;
  j["save_id"] = hex64(m.save_id);
  j["world_size"] = m.world_size;
  Json params = Json::array();
  for (const ParamInfo& p : m.params) params.push_back({{"name", p.name}, {"shape", p.shape}});
  j["params"] = std::move(params);
  j["arrays"] = m.arrays;
  Json files = Json::array();
  for (const Manifest::RankEntry& f : m.files) {
    Json pieces = Json::array();
    for (const Piece& p : f.pieces) {
      ZERO_REQUIRE(!p.strided() || m.version >= 2,
                   "checkpoint: a manifest holding strided pieces must be version 2");
      // repeat and stride only for a strided piece: without one the manifest is version 1's.
      if (p.strided())
        pieces.push_back({p.param, p.offset, p.count, p.repeat, p.stride});
      else
        pieces.push_back({p.param, p.offset, p.count});
    }
    files.push_back({{"rank", f.rank},
                     {"file", f.file},
                     {"bytes", f.bytes},
                     {"numel", f.numel},
                     {"pieces", std::move(pieces)}});
  }
  j["files"] = std::move(files);
  j["metadata"] = Json::parse(m.metadata);
  return j.dump(1) + "\n";
}

Manifest parse_manifest(std::string_view text, const std::string& path) {
  const Reader r(path);
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    r.fail("is", std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) r.fail("is", "not a JSON object");
  Manifest m;
  const auto magic = j.find("magic");
  if (magic == j.end() || !magic->is_string() || magic->get<std::string>() != kManifestMagic)
    r.fail("field 'magic'", "is not \"" + std::string(kManifestMagic) +
                                "\": this is not a zero checkpoint manifest");
  m.version = static_cast<uint32_t>(r.integer(r.field(j, "version", "the top level"), "'version'",
                                              1, std::numeric_limits<uint32_t>::max()));
  if (m.version > kFormatVersion)
    ZERO_FAIL("checkpoint manifest " + io::quote(path) + " has format version " +
              std::to_string(m.version) + ", newer than this build reads (" +
              std::to_string(kFormatVersion) +
              ")\nHINT: load it with the newer zero build that wrote it");
  m.tag = r.string(r.field(j, "tag", "the top level"), "'tag'");
  m.save_id = r.hex(r.field(j, "save_id", "the top level"), "'save_id'");
  m.world_size = static_cast<int>(
      r.integer(r.field(j, "world_size", "the top level"), "'world_size'", 1, 1 << 24));

  const Json& params = r.array(r.field(j, "params", "the top level"), "'params'");
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string where = "params[" + std::to_string(i) + "]";
    if (!params[i].is_object()) r.fail(where, "is not an object");
    ParamInfo p;
    p.name = r.string(r.field(params[i], "name", where), where + ".name");
    const Json& shape = r.array(r.field(params[i], "shape", where), where + ".shape");
    for (size_t d = 0; d < shape.size(); ++d)
      p.shape.push_back(r.integer(shape[d], where + ".shape[" + std::to_string(d) + "]", 0));
    int64_t numel = 1;
    for (int64_t d : p.shape)
      if (__builtin_mul_overflow(numel, d, &numel) || numel > (int64_t{1} << 56))
        r.fail(where + ".shape", "has more than 2^56 elements");
    m.params.push_back(std::move(p));
  }
  const Json& arrays = r.array(r.field(j, "arrays", "the top level"), "'arrays'");
  for (size_t i = 0; i < arrays.size(); ++i)
    m.arrays.push_back(r.string(arrays[i], "arrays[" + std::to_string(i) + "]"));

  const Json& files = r.array(r.field(j, "files", "the top level"), "'files'");
  if (files.size() != static_cast<size_t>(m.world_size))
    r.fail("'files'", "lists " + std::to_string(files.size()) + " rank files for world size " +
                          std::to_string(m.world_size));
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string where = "files[" + std::to_string(i) + "]";
    if (!files[i].is_object()) r.fail(where, "is not an object");
    Manifest::RankEntry f;
    f.rank = static_cast<int>(r.integer(r.field(files[i], "rank", where), where + ".rank", 0));
    if (f.rank != static_cast<int>(i)) r.fail(where + ".rank", "is not " + std::to_string(i));
    f.file = r.string(r.field(files[i], "file", where), where + ".file");
    if (f.file.empty() || f.file.find('/') != std::string::npos || f.file[0] == '.')
      r.fail(where + ".file", "is not a plain file name");
    f.bytes =
        static_cast<uint64_t>(r.integer(r.field(files[i], "bytes", where), where + ".bytes", 0));
    f.numel =
        static_cast<uint64_t>(r.integer(r.field(files[i], "numel", where), where + ".numel", 0));
    const Json& pieces = r.array(r.field(files[i], "pieces", where), where + ".pieces");
    uint64_t sum = 0;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const std::string pw = where + ".pieces[" + std::to_string(k) + "]";
      // Version 1: [param, offset, count]; version 2 also [param, offset, count, repeat,
      // stride] with repeat >= 2 (a strided piece).
      const bool v2 = m.version >= 2;
      if (!pieces[k].is_array() || !(pieces[k].size() == 3 || (v2 && pieces[k].size() == 5)))
        r.fail(pw, v2 ? "is not [param, offset, count] or [param, offset, count, repeat, stride]"
                      : "is not [param, offset, count]");
      Piece p;
      p.param = static_cast<int>(
          r.integer(pieces[k][0], pw + "[0]", 0, static_cast<int64_t>(m.params.size()) - 1));
      const int64_t numel = m.params[static_cast<size_t>(p.param)].numel();
      p.offset = r.integer(pieces[k][1], pw + "[1]", 0, numel - 1);
      p.count = r.integer(pieces[k][2], pw + "[2]", 1, numel - p.offset);
      if (pieces[k].size() == 5) {
        p.repeat = r.integer(pieces[k][3], pw + "[3]", 2, numel);
        p.stride = r.integer(pieces[k][4], pw + "[4]", p.count, numel);
        const Piece one[1] = {p};
        if (const std::string e = pieces_error(m.params, one); !e.empty())
          r.fail(pw, "is invalid: " + e);
      }
      sum += static_cast<uint64_t>(p.length());
      f.pieces.push_back(p);
    }
    if (sum != f.numel)
      r.fail(where, "has pieces of " + std::to_string(sum) + " elements but numel " +
                        std::to_string(f.numel));
    m.files.push_back(std::move(f));
  }
  m.metadata = r.field(j, "metadata", "the top level").dump();
  return m;
}

std::string json_error(std::string_view text) {
  try {
    const Json parsed = Json::parse(text);
    (void)parsed;
    return {};
  } catch (const Json::parse_error& e) {
    return e.what();
  }
}

}  // namespace zero::checkpoint::detail
