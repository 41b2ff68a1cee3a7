// The directory layout of checkpoints (private to runtime/checkpoint): tag rules, the names of
// the temporary and replaced directories, the completion marker, and which directory holds a
// tag's checkpoint after an interrupted replacement. docs/checkpoint-format.md, "Directory
// layout" and "Atomicity", is the specification.
//
// Thread-safety: pure functions and reads of small files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zero::checkpoint::detail {

// Throws unless `tag` is 1-200 characters of [A-Za-z0-9._+=-], does not start with '.', and is
// not "latest".
void check_tag(const std::string& tag);

std::string join(const std::string& dir, std::string_view name);
std::string tmp_dir(const std::string& dir, const std::string& tag);  // dir/.<tag>.tmp
std::string old_dir(const std::string& dir, const std::string& tag);  // dir/.<tag>.old

// The completion marker's contents.
struct Marker {
  uint32_t manifest_crc = 0;  // CRC-32C of manifest.json's bytes
  uint64_t committed_ns = 0;  // commit time, nanoseconds since the Unix epoch
};
std::string marker_text(const Marker& m);
// The marker of checkpoint directory `ckpt_dir`; nullopt when there is none. Throws naming the
// file when it exists but is malformed.
std::optional<Marker> read_marker(const std::string& ckpt_dir);

// The commit time of checkpoint directory `ckpt_dir` when it is complete: it has a well-formed
// marker and a manifest.json whose CRC-32C is the marker's and which parses as a manifest.
// Otherwise nullopt, with the reason in *why when given ("it has no COMPLETE marker", the
// checksum or parse error). Reads the marker and the manifest, never a rank file.
std::optional<uint64_t> verified_commit(const std::string& ckpt_dir, std::string* why = nullptr);

// Moves the complete temporary directory dir/.<tag>.tmp to dir/<tag>, replacing an older
// dir/<tag> only once the new one is in place: with one renameat2(RENAME_EXCHANGE) where the
// filesystem can swap names (`swap`), else with two renames (the old one aside to
// dir/.<tag>.old, the new one in), after which the old one is removed. fsyncs `dir`.
void install(const std::string& dir, const std::string& tag, bool swap = true);

// Tidies dir/<tag> and its leftovers (dir/.<tag>.tmp, dir/.<tag>.old) after an interrupted or
// failed save, so that no complete checkpoint is lost and nothing else is left:
//   - a complete .tmp (sealed, then the job died before installing it) becomes dir/<tag> when
//     dir/<tag> is missing, incomplete or committed before it (install); otherwise (the older
//     copy left by a swap) it is removed; an incomplete .tmp is removed;
//   - a complete .old (a replacement interrupted between its two renames) is put back as
//     dir/<tag> when that is missing; it is removed once dir/<tag> is complete, or when it is
//     itself incomplete.
// A complete checkpoint is thus only ever removed when a complete copy of the same tag committed
// after it is in place. A dir/<tag> without a marker is never removed unless a complete copy
// takes its name. Returns what it did, one sentence each (empty: nothing to do). Throws naming
// the path when a rename or removal fails.
std::vector<std::string> recover_tag(const std::string& dir, const std::string& tag);

// The directory that holds dir/tag's checkpoint: dir/tag when it exists; dir/.<tag>.old when
// dir/tag is missing and that one is complete (a replacement interrupted between its two
// renames; the old checkpoint is still whole); otherwise dir/tag (which then does not exist).
std::string resolve(const std::string& dir, const std::string& tag);

}  // namespace zero::checkpoint::detail
