// The safetensors format (the Hugging Face weights format), for exporting a checkpoint's fp32
// weights to other frameworks and importing pretrained weights. docs/checkpoint-format.md,
// "safetensors", is the summary this code follows:
//
//   u64 little-endian N | N bytes of JSON header (UTF-8, starts with '{', padded with spaces)
//   | byte buffer
//
//   header: {"__metadata__": {"format": "pt", ...string: string},
//            "<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, ...}
//   offsets are relative to the byte buffer, tensors are row-major little-endian and together
//   fill the buffer exactly (no gap, no overlap).
//
// write_safetensors writes fp32 tensors only (dtype "F32"), in the given order, the header
// padded to a multiple of 8 bytes as the reference writer does, atomically (a temporary file
// beside the target, fsync, rename), except that a path which exists and is not a regular file
// (a pipe, /dev/stdout, a device) is written in place. read_safetensors accepts F32, F16 and
// BF16 and widens them to fp32 exactly (zero::convert); any other dtype (unless ReadOptions
// keeps it, without data), and every malformed header, is an error naming the file and the
// tensor.
//
// Thread-safety: reentrant; the caller's tensors must not change during the call.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero::checkpoint {

// A tensor to write: numel(shape) fp32 values at `data` (row-major; may be null when empty),
// owned by the caller.
struct TensorRef {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// Writes `tensors` (distinct non-empty names, not "__metadata__") to `path`. `metadata` goes
// into "__metadata__" after "format": "pt" (a "format" key of the caller's replaces it).
void write_safetensors(const std::string& path, std::span<const TensorRef> tensors,
                       const std::vector<std::pair<std::string, std::string>>& metadata = {});

struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::string dtype;        // as stored: "F32", "F16" or "BF16" (or another, see ReadOptions)
  std::vector<float> data;  // widened to fp32; empty when !widened
  bool widened = true;      // false: a dtype this reader does not convert, kept without data
};
struct SafetensorsFile {
  std::vector<NamedTensor> tensors;  // in the order of their data in the file
  std::vector<std::pair<std::string, std::string>> metadata;  // "__metadata__", in header order
};

struct ReadOptions {
  // false: a tensor of any dtype but F32, F16 and BF16 is an error. true: a tensor of another
  // dtype of the format (BOOL, U8, I8, F8_E4M3, F8_E5M2, U16, I16, U32, I32, U64, I64, F64) is
  // checked like the others and returned with widened = false and no data, for a caller that
  // may not need it (Hugging Face GPT-2 files carry boolean attention masks beside the weights).
  bool keep_other_dtypes = false;
};

// Reads a whole safetensors file. Checks: length and header bounds (header at most 100 MB, as
// the reference reader), JSON that is an object starting with '{' with no repeated key, each
// tensor's dtype / shape / data_offsets, offsets inside the buffer, byte counts matching the
// shape, no overlaps or gaps, no bytes after the last tensor.
SafetensorsFile read_safetensors(const std::string& path, const ReadOptions& options = {});

}  // namespace zero::checkpoint
