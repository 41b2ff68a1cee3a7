// Shared by the checkpoint tests (single-process and tests/mpi/checkpoint_test.cpp): a temporary
// directory, a parameter table of awkward sizes, slicings of it as a partitioner would cut it,
// recognisable values, and "save as N ranks" from one process with the building blocks save()
// is made of. Test-only.
#pragma once

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/checkpoint/checkpoint.hpp"

namespace zero::checkpoint::test {

// A fresh directory under the system's temporary directory, removed with its contents at the end.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "zero_ckpt_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

// A GPT-like table whose sizes divide by nothing convenient, with a scalar and an empty
// parameter: "wte" [37, 12], then per layer "h.<i>.w" [12, 7], "h.<i>.b" [7], "h.<i>.g" [],
// then "head.empty" [0, 3] and "head.b" [5].
inline std::vector<ParamInfo> model_params(int layers = 3, int64_t width = 7) {
  std::vector<ParamInfo> t{{"wte", {37, 12}}};
  for (int i = 0; i < layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    t.push_back({h + "w", {12, width}});
    t.push_back({h + "b", {width}});
    t.push_back({h + "g", {}});
  }
  t.push_back({"head.empty", {0, 3}});
  t.push_back({"head.b", {5}});
  return t;
}

inline int64_t total_numel(const std::vector<ParamInfo>& params) {
  int64_t n = 0;
  for (const ParamInfo& p : params) n += p.numel();
  return n;
}

// Rank `rank`'s pieces when the parameters, concatenated in table order, are cut into `world`
// contiguous ranges of nearly equal length (the partitioner's slicing without padding): pieces
// straddle parameters and ranks.
inline std::vector<Piece> slicing(const std::vector<ParamInfo>& params, int world, int rank) {
  const int64_t total = total_numel(params);
  const int64_t lo = total * rank / world, hi = total * (rank + 1) / world;
  std::vector<Piece> out;
  int64_t base = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    const int64_t n = params[p].numel();
    const int64_t a = std::max(lo, base), b = std::min(hi, base + n);
    if (a < b) out.push_back({static_cast<int>(p), a - base, b - a});
    base += n;
  }
  return out;
}

// Every parameter in chunks of `chunk` elements dealt round-robin to `world` ranks: many small
// pieces that start and end anywhere relative to any contiguous slicing.
inline std::vector<Piece> dealt(const std::vector<ParamInfo>& params, int world, int rank,
                                int64_t chunk) {
  std::vector<Piece> out;
  int64_t k = 0;
  for (size_t p = 0; p < params.size(); ++p)
    for (int64_t off = 0; off < params[p].numel(); off += chunk, ++k)
      if (k % world == rank)
        out.push_back({static_cast<int>(p), off, std::min(chunk, params[p].numel() - off)});
  return out;
}

// The value of element e of parameter p in array a: distinct and exact in fp32 (< 2^24).
inline float value(int array, int param, int64_t e) {
  return static_cast<float>(array * 1'000'000 + param * 10'000 + e) + 0.5f;
}

inline std::vector<float> values_for(const std::vector<Piece>& pieces, int array,
                                     float shift = 0.0f) {
  std::vector<float> v;
  for (const Piece& p : pieces)
    for (int64_t r = 0; r < p.repeat; ++r)
      for (int64_t e = 0; e < p.count; ++e)
        v.push_back(value(array, p.param, p.offset + r * p.stride + e) + shift);
  return v;
}

inline const std::vector<std::string>& array_names() {
  static const std::vector<std::string> n{"master", "exp_avg", "exp_avg_sq"};
  return n;
}

// Saves `params` as `world` ranks from this process: begin_save, every rank's write_rank_file,
// commit_save, exactly the steps of save(). Rank r holds pieces(r) with values_for(.., a, shift).
struct FakeSave {
  std::vector<ParamInfo> params;
  int world = 1;
  std::function<std::vector<Piece>(int rank)> pieces;
  std::string metadata = R"({"step": 7, "stage": 2})";
  uint32_t block_elems = 5;  // tiny: every read spans several checksum blocks
  float shift = 0.0f;        // added to every value: tells two saves of one tag apart
  uint64_t save_id = 0x0123456789abcdefull;

  // Every rank's request, with the arrays' storage.
  struct Rank {
    std::vector<Piece> pieces;
    std::vector<std::vector<float>> values;
    std::vector<ConstArray> arrays;
    SaveRequest request;
  };
  std::vector<Rank> ranks() const {
    std::vector<Rank> out(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      Rank& k = out[static_cast<size_t>(r)];
      k.pieces = pieces(r);
      for (size_t a = 0; a < array_names().size(); ++a)
        k.values.push_back(values_for(k.pieces, static_cast<int>(a), shift));
      for (size_t a = 0; a < array_names().size(); ++a)
        k.arrays.push_back({array_names()[a], k.values[a].data()});
      k.request = {params, k.pieces, k.arrays, metadata, block_elems};
    }
    return out;
  }
  void run(const std::string& dir, const std::string& tag) const {
    const std::vector<Rank> rs = ranks();
    const std::string tmp = begin_save(dir, tag);
    for (int r = 0; r < world; ++r)
      write_rank_file(tmp, r, world, save_id, rs[static_cast<size_t>(r)].request);
    commit_save(dir, tag, world, save_id, rs[0].request);
  }
};

// Loads `pieces` of the named arrays from dir/tag into fresh vectors.
struct Loaded {
  LoadResult result;
  std::vector<std::vector<float>> values;  // one per name
};
inline Loaded load_pieces(const std::string& dir, const std::string& tag,
                          const std::vector<ParamInfo>& params, const std::vector<Piece>& pieces,
                          const std::vector<std::string>& names = array_names()) {
  Loaded l;
  int64_t n = 0;
  for (const Piece& p : pieces) n += p.length();
  // NaN-filled: an element the load forgot to write cannot pass for a value.
  l.values.assign(names.size(), std::vector<float>(static_cast<size_t>(n), std::nanf("")));
  std::vector<Array> arrays;
  for (size_t a = 0; a < names.size(); ++a) arrays.push_back({names[a], l.values[a].data()});
  l.result = load(dir, tag, {params, pieces, arrays});
  return l;
}

// File helpers for corrupting checkpoints.
inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_bytes(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace zero::checkpoint::test
