// Checkpoints of partitioned model state: the face of runtime/checkpoint. The format, byte by
// byte, and the crash-safety protocol are specified in docs/checkpoint-format.md.
//
// What is saved. A model is a table of parameters (name, whole shape). Each rank owns disjoint
// PIECES (parameter, element offset within it, count; strided: repeat runs `stride` apart) that
// together cover every element of every parameter exactly once over all ranks (ZeRO stage 1-3:
// the partitioner's pieces; stage 0: rank 0 owns everything, the other ranks nothing; tensor
// parallelism: a shard's range mapped to the whole parameter by whole_pieces()). For every named
// fp32 state array ("master", "exp_avg", "exp_avg_sq", ...) a rank holds its values concatenated
// in its piece order: piece i occupies elements [sum of lengths before i, + length_i) of every
// array.
//
//   dir/
//     latest                  the newest tag, one line (replaced atomically)
//     <tag>/
//       manifest.json         world size, parameter table, each rank file's pieces, metadata
//       rank_00000.bin ...    one binary file per saving rank: its pieces' arrays, checksummed
//       COMPLETE              the completion marker (holds the manifest's checksum)
//
// Re-slicing. load() is given the pieces this rank wants now, in any slicing (another world size,
// another ZeRO stage, another tensor-parallel degree): it finds, through the manifest, which
// saved rank files hold those elements and reads only those byte ranges (pread), so a resume
// reads each byte about once over all ranks (each rank reads whole checksum blocks, so when
// another tensor degree makes ranks split the rows of one saved block, each of them reads it).
//
// Shared filesystem. With ranks on several hosts, `dir` must be the same shared filesystem on
// every host (NFS, Lustre, GPFS, ...): rank 0 writes the manifest after checking that it sees
// every rank's file, and any rank may read any rank's file on load. A node-local `dir` is
// detected and reported (see save()).
//
// Thread-safety: the functions are reentrant; concurrent saves to one dir and tag are not
// supported (the job's ranks save one checkpoint at a time). Loads may run concurrently with
// each other and with a save of a different tag.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zero {
struct Model;
namespace coll {
class Communicator;
}
}  // namespace zero

namespace zero::checkpoint {

// The newest version this build reads (rank files and manifest alike). It writes version 1 (the
// original format, readable by older builds) for a rank file without strided pieces and a
// checkpoint without any, else version 2 (docs/checkpoint-format.md, "Versioning").
inline constexpr uint32_t kFormatVersion = 2;
// Elements per checksum block of a rank file's arrays (1 MiB of fp32): a load reads and verifies
// whole blocks, so this bounds the bytes read beyond what a piece needs.
inline constexpr uint32_t kDefaultBlockElems = 1u << 18;

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;  // each >= 0; [] is a scalar (1 element)
  int64_t numel() const noexcept;
  friend bool operator==(const ParamInfo&, const ParamInfo&) = default;
};
// The parameter table of a model, in its canonical order: each ParamSpec's name and WHOLE shape
// (slice.full for a tensor-parallel sliced or replicated parameter, else its shape), so every
// tensor rank, at any tensor-parallel degree, lists the same table.
std::vector<ParamInfo> param_table(const Model& model);

// Elements of parameter `param` (an index into the parameter table), row-major: `repeat` runs of
// `count` elements, run r being [offset + r * stride, + count), in that order. With repeat 1
// (the default) it is the contiguous range [offset, offset + count) and `stride` is ignored (not
// stored; read back as 0). With repeat > 1 the runs must not overlap (stride >= count) and all
// lie inside the parameter. A strided piece is how a tensor-parallel shard's range looks in the
// whole parameter (slice_pieces.hpp): one piece for what would be millions of contiguous ones.
struct Piece {
  int param = -1;
  int64_t offset = 0;
  int64_t count = 0;
  int64_t repeat = 1;
  int64_t stride = 0;
  // The piece's elements, i.e. its length in every array: repeat * count.
  int64_t length() const noexcept { return repeat * count; }
  bool strided() const noexcept { return repeat > 1; }
  friend bool operator==(const Piece&, const Piece&) = default;
};

// A named fp32 array of sum(piece lengths) elements, owned by the caller, valid for the call
// (data may be null when the rank has no pieces).
struct ConstArray {
  std::string name;
  const float* data = nullptr;
};
struct Array {
  std::string name;
  float* data = nullptr;
};

struct SaveRequest {
  std::span<const ParamInfo> params;   // the whole table; identical on every rank
  std::span<const Piece> pieces;       // this rank's, in array order; count > 0 each
  std::span<const ConstArray> arrays;  // same names in the same order on every rank
  // JSON text (step, stage, dtype, loss-scaler state, data position, ...). Rank 0's is stored
  // in the manifest as a JSON value; load() returns it re-serialised compactly (same keys in the
  // same order, whitespace dropped).
  std::string_view metadata = "{}";
  uint32_t block_elems = kDefaultBlockElems;  // checksum block size (> 0), per rank file
};

struct LoadRequest {
  std::span<const ParamInfo> params;  // must equal the checkpoint's table
  std::span<const Piece> pieces;      // wanted now, any slicing; count > 0 each
  std::span<const Array> arrays;      // filled in piece order; each name must be saved
  // Every value read must be finite (no NaN or infinity): a model state that was saved so is
  // damaged, and training from it would only produce NaN. Else load() fails naming the rank
  // file, the array, the parameter and the element.
  bool require_finite = false;
};

struct LoadResult {
  std::string metadata;      // rank 0's metadata of the save (compact JSON)
  int saved_world_size = 0;  // ranks that wrote the checkpoint
};

// What a checkpoint holds, from its manifest alone (no rank file is opened).
struct Info {
  std::string path;  // the directory read
  int world_size = 0;
  uint64_t save_id = 0;
  std::vector<ParamInfo> params;
  std::vector<std::string> arrays;
  std::string metadata;
};

// Saves a checkpoint as dir/tag. Collective over `comm` (every rank calls it with its own
// request); `comm` must be a cpu (MPI) communicator: the handful of values exchanged live in
// host memory. Blocks until the checkpoint is durable and `dir/latest` names it, then returns on
// every rank; or throws zero::Error on every rank: the rank at fault with the reason, the others
// naming that rank. Checked before anything is written: the requests are well-formed, the
// parameter table and array names are the same on every rank (a hash all-gathered; the error
// names the first rank that differs from rank 0), rank 0's metadata is JSON text. The pieces of
// all ranks must tile every parameter exactly once (checked by rank 0 before committing).
// An existing checkpoint of the same tag is replaced only once the new one is complete; a crash
// at any point leaves the previous checkpoints loadable (docs/checkpoint-format.md). A failure
// (a full disk at any step) leaves nothing of this save behind (rank 0 removes its temporary
// directory), except when only dir/latest could not be updated: the new checkpoint is then
// complete, kept, and the error says so.
void save(const std::string& dir, const std::string& tag, coll::Communicator& comm,
          const SaveRequest& request);

// The checkpoint a resume takes: the complete checkpoint of `dir` committed last (its marker's
// time), found by listing `dir`. Complete means: a well-formed COMPLETE marker, and a manifest
// whose checksum is the marker's and which parses; newer directories that fail this are skipped.
// `dir/latest` is only compared with it, never trusted over it: a save whose last step (writing
// latest) failed leaves a complete checkpoint newer than the one latest names. `note` is empty
// when latest names the chosen checkpoint; otherwise it says which checkpoint was taken and why
// (no latest file; latest names an older checkpoint, or a missing, incomplete or damaged one;
// newer damaged checkpoints skipped), for the caller to print. nullopt when there is no
// complete checkpoint (or no `dir`). Reads markers and manifests, never a rank file. Not
// collective. To resume from an older checkpoint, move the newer ones out of `dir`.
struct Newest {
  std::string tag;
  std::string note;
};
std::optional<Newest> find_newest(const std::string& dir);

// find_newest's tag; its note, when there is one, is logged as a warning (rank 0).
std::optional<std::string> latest(const std::string& dir);

// Reads dir/tag's manifest, checked against its marker. Not collective.
Info read_info(const std::string& dir, const std::string& tag);

// Fills request.arrays for request.pieces from dir/tag. Not collective: each rank reads the byte
// ranges it needs from the rank files that hold them. Validates the marker, the manifest (magic,
// version, checksum), the parameter table against request.params (the error names the first
// difference and what to do), that every wanted element was saved exactly once, and every rank
// file it opens (magic, version, header and table checksums, save id, pieces, size) and every
// data block it reads (CRC-32C). Errors name the file. The arrays are unspecified after an error.
LoadResult load(const std::string& dir, const std::string& tag, const LoadRequest& request);

// The checkpoint's array `array` of every parameter, whole, written as a safetensors file of fp32
// tensors named and shaped as in the parameter table (docs/checkpoint-format.md). Reads the
// whole model into this process's memory. Not collective.
void export_safetensors(const std::string& dir, const std::string& tag, const std::string& array,
                        const std::string& out_path);

// Values of every parameter of `params` from a safetensors file (F32, F16 or BF16 tensors,
// widened to fp32): result[p] holds parameter p, whole, row-major. Every parameter must be in
// the file with its shape, and every value finite (a NaN or infinity is an error naming the file,
// the tensor and the element: weights that are not numbers cannot be trained); tensors the table
// does not name are ignored (listed by a warning on rank 0's log).
std::vector<std::vector<float>> import_safetensors(const std::string& path,
                                                   std::span<const ParamInfo> params);

// ---- The checkpoint directory before a run relies on it (zero-train checks it at start).

// Bytes save() writes for `request` on rank `rank`: its rank file exactly, plus an upper bound
// of its part of manifest.json (on rank 0 also of the parameter table, the metadata, the marker
// and latest). The sum over the ranks bounds one checkpoint's bytes before the filesystem rounds
// each file up to its block size. The arrays' data is not read (it may be null).
uint64_t save_bytes(const SaveRequest& request, int rank);

// Creates `dir` when missing (mkdir -p), then creates, writes (512 bytes), fsyncs and removes a
// probe file in it (named .zero-probe.<host>.<pid>.<n>): what a save will do, done for real.
// Throws naming `dir` and the system's error (read-only filesystem, permission denied, no
// space) with a HINT.
void probe_writable(const std::string& dir);

// The bytes an unprivileged writer may still use on `dir`'s filesystem (statvfs f_bavail x
// f_frsize) and its block size. Throws naming `dir`.
struct Space {
  uint64_t available = 0;
  uint64_t block = 0;
};
Space free_space(const std::string& dir);

// Removes what interrupted or failed saves left in `dir`, never a checkpoint that is the newest
// complete copy of its tag: for each tag with a dir/.<tag>.tmp or dir/.<tag>.old, a sealed one is
// installed or put back where dir/<tag> lacks it, the rest removed (docs/checkpoint-format.md,
// "Atomicity"); temporary files of `latest` and probe files are removed. Returns one sentence
// per action, for the log. Call with no save running in `dir` (rank 0, at start-up). Throws
// naming the path when a removal or rename fails.
std::vector<std::string> clean_leftovers(const std::string& dir);

// ---- Building blocks of save(), non-collective; tests and tools call them to write the files
// ---- of several ranks from one process. save() is exactly: validate and compare the requests;
// ---- rank 0 begin_save(); every rank write_rank_file(); rank 0 commit_save().

// Rank 0, first: checks the tag, creates `dir`, tidies the leftovers of an interrupted save of
// this tag (as clean_leftovers does for every tag) and creates the empty temporary directory
// (dir/.<tag>.tmp). Returns its path. On failure nothing of it is left.
std::string begin_save(const std::string& dir, const std::string& tag);

// One rank's file (rank_<rank>.bin, rank as 5 digits) in `save_dir` (begin_save's result),
// written and fsync'ed. `save_id` is the same for every rank of one save. Throws naming the file;
// when `save_dir` does not exist (rank 0 created it on another host) the error says that `dir`
// must be on a filesystem shared by every rank.
void write_rank_file(const std::string& save_dir, int rank, int world_size, uint64_t save_id,
                     const SaveRequest& request);

// Rank 0, after every rank's write_rank_file returned: checks that every rank file is visible
// and matches (header, save id, size), that the pieces tile every parameter exactly once, writes
// manifest.json (with `request`'s parameter table, array names and metadata) and the marker,
// fsyncs, moves the directory to dir/<tag> (replacing an older one only once the new one is in
// place) and updates dir/latest. On failure it cleans up after itself before throwing: before
// the move, the temporary directory is removed (the previous checkpoints are untouched); a
// failed move is undone as far as recover_tag can; when only dir/latest could not be written,
// dir/<tag> stays (complete; find_newest takes it) and the error says so.
void commit_save(const std::string& dir, const std::string& tag, int world_size, uint64_t save_id,
                 const SaveRequest& request);

// The index of the first NaN or infinity among `values`, or -1 when every value is finite.
int64_t first_non_finite(std::span<const float> values) noexcept;

// File names inside a checkpoint directory.
std::string rank_file_name(int rank);  // "rank_00003.bin"
inline constexpr std::string_view kManifestName = "manifest.json";
inline constexpr std::string_view kMarkerName = "COMPLETE";
inline constexpr std::string_view kLatestName = "latest";

}  // namespace zero::checkpoint
