// manifest.json of a checkpoint (private to runtime/checkpoint; fields in
// docs/checkpoint-format.md, "The manifest"), and the JSON checks save() needs for metadata.
// The only file of the checkpoint code that includes nlohmann-json besides safetensors.cpp.
//
// Thread-safety: pure functions on values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/checkpoint/checkpoint.hpp"

namespace zero::checkpoint::detail {

inline constexpr std::string_view kManifestMagic = "zero-checkpoint";

struct Manifest {
  uint32_t version = 1;  // 2 when a file holds a strided piece (pieces_version)
  std::string tag;
  uint64_t save_id = 0;
  int world_size = 0;
  std::vector<ParamInfo> params;
  std::vector<std::string> arrays;
  struct RankEntry {
    int rank = 0;
    std::string file;  // name inside the checkpoint directory
    uint64_t bytes = 0;
    uint64_t numel = 0;
    std::vector<Piece> pieces;
  };
  std::vector<RankEntry> files;  // one per rank, in rank order
  std::string metadata;          // compact JSON text
};

// The manifest as JSON text (indented, ends with a newline).
std::string manifest_to_json(const Manifest& m);

// Parses and checks a manifest's structure (magic, version, types, one file per rank, pieces
// inside their parameters). Errors name `path`.
Manifest parse_manifest(std::string_view text, const std::string& path);

// Empty when `text` is one JSON value, else the parser's message.
std::string json_error(std::string_view text);

}  // namespace zero::checkpoint::detail
