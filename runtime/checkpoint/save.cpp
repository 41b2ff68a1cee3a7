// save() and its building blocks: begin_save, write_rank_file, commit_save. The protocol (what a
// crash at each step leaves behind) is docs/checkpoint-format.md, "Atomicity".
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <random>

#include "collectives/communicator.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/crc32c.hpp"
#include "runtime/checkpoint/file_io.hpp"
#include "runtime/checkpoint/layout.hpp"
#include "runtime/checkpoint/manifest.hpp"
#include "runtime/checkpoint/pieces.hpp"
#include "runtime/checkpoint/rank_file.hpp"
#include "core/error.hpp"

namespace zero::checkpoint {

namespace {

using namespace detail;

const char* const kSharedFsHint =
    "with ranks on several hosts the checkpoint directory must be on a filesystem every rank "
    "shares (NFS, Lustre, GPFS, ...), reachable at the same path on every host";

// Empty, or what is wrong with this rank's request. Rank 0's metadata must be JSON text.
std::string request_error(const SaveRequest& r, bool check_metadata) {
  std::string e = param_table_error(r.params);
  if (e.empty()) e = pieces_error(r.params, r.pieces);
  if (!e.empty()) return e;
  if (r.block_elems == 0) return "block_elems is 0 (it must be > 0)";
  const uint64_t n = total_count(r.pieces);
  for (size_t a = 0; a < r.arrays.size(); ++a) {
    const ConstArray& arr = r.arrays[a];
    if (arr.name.empty()) return "array " + std::to_string(a) + " has an empty name";
    for (size_t b = 0; b < a; ++b)
      if (r.arrays[b].name == arr.name) return "array name '" + arr.name + "' appears twice";
    if (n > 0 && arr.data == nullptr)
      return "array '" + arr.name + "' is null but the pieces hold " + std::to_string(n) +
             " elements";
  }
  if (check_metadata) {
    const std::string j = json_error(r.metadata);
    if (!j.empty()) return "the metadata is not JSON text: " + j;
  }
  return {};
}

void require_request(const SaveRequest& r, bool check_metadata, const std::string& who) {
  const std::string e = request_error(r, check_metadata);
  if (!e.empty())
    ZERO_FAIL("checkpoint save: " + who + " request is invalid: " + e +
              "\nHINT: pass the model's parameter table and this rank's pieces as the "
              "partitioner gives them");
}

uint64_t names_hash(std::span<const ConstArray> arrays) {
  uint64_t h = kHash64Seed;
  for (const ConstArray& a : arrays) {
    const uint64_t len = a.name.size();
    h = hash64(h, {reinterpret_cast<const unsigned char*>(&len), 8});
    h = hash64(h, {reinterpret_cast<const unsigned char*>(a.name.data()), a.name.size()});
  }
  return h;
}

uint64_t text_hash(std::string_view s) {
  return hash64(kHash64Seed, {reinterpret_cast<const unsigned char*>(s.data()), s.size()});
}

// 64-bit values travel as four 16-bit quarters in fp32 (exact): the communicator moves floats.
void put_u64(float* f, uint64_t v) {
  for (int i = 0; i < 4; ++i) f[i] = static_cast<float>((v >> (16 * i)) & 0xffff);
}
uint64_t get_u64(const float* f) {
  uint64_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint64_t>(f[i]) << (16 * i);
  return v;
}

// Every rank's `mine` (same length everywhere), concatenated in rank order.
std::vector<float> gather(coll::Communicator& comm, const std::vector<float>& mine) {
  std::vector<float> all(mine.size() * static_cast<size_t>(comm.size()));
  comm.all_gather(mine.data(), all.data(), mine.size(), DType::f32).wait();
  return all;
}

// The first rank whose status (element `at` of each rank's `stride` values) is nonzero; -1.
int first_failed(const std::vector<float>& all, size_t stride, size_t at = 0) {
  for (size_t r = 0; r * stride < all.size(); ++r)
    if (all[r * stride + at] != 0) return static_cast<int>(r);
  return -1;
}

// Removes a failed save's temporary directory; says what became of it, for the error message.
std::string discard(const std::string& tmp) {
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  if (ec)
    return "its temporary directory " + io::quote(tmp) + " could not be removed (" + ec.message() +
           "); the next start with this checkpoint directory removes it. Every earlier "
           "checkpoint is untouched";
  return "its temporary directory " + io::quote(tmp) +
         " was removed; every earlier checkpoint is untouched";
}

// `message` with `note` as a line of its own before its HINT line (or at its end).
std::string with_note(const std::string& message, const std::string& note) {
  const size_t hint = message.find("\nHINT:");
  if (hint == std::string::npos) return message + "\n" + note;
  return message.substr(0, hint) + "\n" + note + message.substr(hint);
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += (out.empty() ? "" : "; ") + l;
  return out;
}

// Fault injection for the crash-safety tests (docs/checkpoint-format.md): with
// ZERO_FAULT_KILL_DURING_SAVE=R:K in the environment, rank R kills itself with SIGKILL in its
// K-th save() of the process (1-based), right after writing its rank file, before the commit;
// with R:K:sealed (R = 0, the rank that commits), right after sealing the temporary directory
// (manifest and marker durable), before moving it into place.
int g_saves = 0;  // save() calls of this process

void fault_point(int rank, bool sealed) {
  const char* spec = std::getenv("ZERO_FAULT_KILL_DURING_SAVE");
  if (!spec) return;
  int r = -1, k = -1;
  char when[16] = "";
  const int n = std::sscanf(spec, "%d:%d:%15s", &r, &k, when);
  const bool at_sealed = n == 3 && std::string_view(when) == "sealed";
  if (n >= 2 && r == rank && k == g_saves && at_sealed == sealed) {
    std::fprintf(stderr, "ZERO_FAULT_KILL_DURING_SAVE: rank %d kills itself during save %d%s\n",
                 rank, k, sealed ? ", after sealing it" : "");
    std::fflush(stderr);
    std::raise(SIGKILL);
  }
}

uint64_t new_save_id() {
  std::random_device rd;
  const uint64_t t =
      static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  return (static_cast<uint64_t>(rd()) << 32 ^ rd()) ^ t ^ (static_cast<uint64_t>(::getpid()) << 40);
}

}  // namespace

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.bin", rank);
  return buf;
}

std::string begin_save(const std::string& dir, const std::string& tag) {
  check_tag(tag);
  io::make_directories(dir);
  // A crashed save of this tag may have left a sealed copy (installed now: it is the newest of
  // the tag), the previous checkpoint aside (put back) or garbage (removed).
  (void)recover_tag(dir, tag);
  const std::string tmp = tmp_dir(dir, tag);
  try {
    io::make_directories(tmp);
    io::fsync_dir(dir);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);  // best effort: the error in flight says what failed
    throw;
  }
  return tmp;
}

void write_rank_file(const std::string& save_dir, int rank, int world_size, uint64_t save_id,
                     const SaveRequest& request) {
  ZERO_REQUIRE(world_size >= 1 && rank >= 0 && rank < world_size,
               "checkpoint save: rank " + std::to_string(rank) + " outside world size " +
                   std::to_string(world_size));
  require_request(request, false, "rank " + std::to_string(rank) + "'s");
  if (!io::is_directory(save_dir))
    ZERO_FAIL("checkpoint save: the temporary directory " + io::quote(save_dir) +
              " does not exist on the host of rank " + std::to_string(rank) +
              " (rank 0 created it)\nHINT: " + kSharedFsHint);
  write_rank_file_at(join(save_dir, rank_file_name(rank)), rank, world_size, save_id,
                     param_table_hash(request.params), request.pieces, request.arrays,
                     request.block_elems);
}

void commit_save(const std::string& dir, const std::string& tag, int world_size, uint64_t save_id,
                 const SaveRequest& request) {
  check_tag(tag);
  require_request(request, true, "rank 0's");
  ZERO_REQUIRE(world_size >= 1, "checkpoint save: world size must be >= 1");
  const std::string tmp = tmp_dir(dir, tag);
  ZERO_REQUIRE(io::is_directory(tmp),
               "checkpoint save: " + io::quote(tmp) + " does not exist: call begin_save first");

  Manifest m;
  m.tag = tag;
  m.save_id = save_id;
  m.world_size = world_size;
  m.params.assign(request.params.begin(), request.params.end());
  for (const ConstArray& a : request.arrays) m.arrays.push_back(a.name);
  m.metadata = std::string(request.metadata);
  const uint64_t hash = param_table_hash(request.params);

  // Every rank's file must be visible here and belong to this save, and the pieces must tile
  // the model. A failure removes the temporary directory, as every failure below does.
  try {
    std::vector<std::vector<Piece>> pieces;
    for (int r = 0; r < world_size; ++r) {
      const std::string name = rank_file_name(r), path = join(tmp, name);
      if (!io::exists(path))
        ZERO_FAIL("checkpoint save: rank " + std::to_string(r) + " reported writing " +
                  io::quote(path) + " but rank 0 does not see it there\nHINT: " + kSharedFsHint);
      const io::File f = io::File::open_read(path, "checkpoint rank file");
      RankFileHeader h = read_rank_header(f);
      const auto mismatch = [&](const std::string& what) {
        ZERO_FAIL("checkpoint save: rank file " + io::quote(path) + " " + what +
                  "\nHINT: another job may be saving the same tag into this directory");
      };
      if (h.rank != r || h.world_size != world_size)
        mismatch("is rank " + std::to_string(h.rank) + " of " + std::to_string(h.world_size) +
                 ", expected rank " + std::to_string(r) + " of " + std::to_string(world_size));
      if (h.save_id != save_id) mismatch("belongs to another save (its save id differs)");
      if (h.param_hash != hash) mismatch("was written for another parameter table");
      if (h.arrays != m.arrays) mismatch("holds other arrays than rank 0's");
      if (const std::string e = pieces_error(request.params, h.pieces); !e.empty())
        mismatch("holds a piece that does not fit the parameter table: " + e);
      // The manifest is version 2 as soon as one file is (holds a strided piece).
      m.version = std::max(m.version, h.version);
      m.files.push_back({r, name, h.file_bytes, h.numel, h.pieces});
      pieces.push_back(std::move(h.pieces));
    }
    Coverage coverage;
    const std::string gap = coverage.build(request.params, pieces);
    if (!gap.empty())
      ZERO_FAIL("checkpoint save of '" + tag +
                "': the ranks' pieces do not cover every element exactly once: " + gap +
                "\nHINT: every element must belong to exactly one rank's pieces (at ZeRO stage 0 "
                "rank 0 passes all of them and the other ranks none)");
  } catch (const Error& e) {
    ZERO_FAIL(with_note(e.message(), discard(tmp)));
  }

  // The manifest and then the marker, each durable before the directory is renamed. A failure
  // here (a full disk, most often) removes the temporary directory: it holds a whole copy of the
  // model state, and leaving it would keep the disk full.
  try {
    const std::string text = manifest_to_json(m);
    io::File mf = io::File::create(join(tmp, kManifestName), "checkpoint manifest");
    mf.write_all(text.data(), text.size());
    mf.sync();
    mf.close();
    const Marker marker{
        crc32c(text), static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                std::chrono::system_clock::now().time_since_epoch())
                                                .count())};
    const std::string mtext = marker_text(marker);
    io::File mk = io::File::create(join(tmp, kMarkerName), "checkpoint marker");
    mk.write_all(mtext.data(), mtext.size());
    mk.sync();
    mk.close();
    io::fsync_dir(tmp);
  } catch (const Error& e) {
    ZERO_FAIL(with_note("checkpoint save of '" + tag + "' failed while sealing it: " + e.message(),
                        discard(tmp)));
  }

  fault_point(0, /*sealed=*/true);
  try {
    install(dir, tag);
  } catch (const Error& e) {
    std::string after;
    try {
      const std::vector<std::string> done = recover_tag(dir, tag);
      after = done.empty() ? "nothing was left to tidy" : "tidied up: " + join_lines(done);
    } catch (const Error& again) {
      after = "tidying up failed too: " + again.message();
    }
    ZERO_FAIL(with_note("checkpoint save of '" + tag + "' failed while moving it into place: " +
                            e.message(),
                        after + "; every earlier checkpoint is untouched"));
  }
  try {
    io::write_file_atomic(join(dir, kLatestName), tag + "\n", "checkpoint latest file");
  } catch (const Error& e) {
    ZERO_FAIL("checkpoint save of '" + tag + "': the checkpoint " + io::quote(join(dir, tag)) +
              " is complete, but " + io::quote(join(dir, kLatestName)) +
              " could not be updated to name it: " + e.message() +
              "\nHINT: --resume takes the newest complete checkpoint whatever latest says, so "
              "it continues from '" + tag + "'; fix the cause above (often a full disk) first");
  }
}

void save(const std::string& dir, const std::string& tag, coll::Communicator& comm,
          const SaveRequest& request) {
  ZERO_REQUIRE(comm.kind() == DeviceKind::cpu,
               "checkpoint save needs a cpu (MPI) communicator: the values it exchanges live in "
               "host memory; make one with coll::make_mpi_communicator");
  const int rank = comm.rank(), world = comm.size();
  ++g_saves;
  const std::string what = "checkpoint save of '" + tag + "' into " + io::quote(dir) + ": ";

  // 1. Every rank's request is well-formed and describes the same model, arrays and tag.
  std::string local;
  try {
    check_tag(tag);
    local = request_error(request, rank == 0);
  } catch (const Error& e) {
    local = e.message();
  } catch (const std::exception& e) {
    local = e.what();
  }
  constexpr size_t kIdent = 13;  // status, then three 64-bit hashes
  std::vector<float> mine(kIdent, 0.0f);
  mine[0] = local.empty() ? 0.0f : 1.0f;
  put_u64(&mine[1], param_table_hash(request.params));
  put_u64(&mine[5], names_hash(request.arrays));
  put_u64(&mine[9], text_hash(tag));
  const std::vector<float> ident = gather(comm, mine);
  if (const int bad = first_failed(ident, kIdent); bad >= 0) {
    if (!local.empty()) ZERO_FAIL(what + "this rank's request is invalid: " + local);
    ZERO_FAIL(what + "rank " + std::to_string(bad) +
              "'s request is invalid (its error says why); nothing was written");
  }
  static const char* const kWhat[3] = {"parameter table (names and shapes, in order)",
                                       "array names (and their order)", "tag"};
  for (int field = 0; field < 3; ++field)
    for (int r = 1; r < world; ++r) {
      const size_t at = 1 + 4 * static_cast<size_t>(field);
      if (get_u64(&ident[r * kIdent + at]) != get_u64(&ident[at]))
        ZERO_FAIL(what + "rank " + std::to_string(r) + " passed another " + kWhat[field] +
                  " than rank 0 (the first rank that differs)\nHINT: every rank must save the "
                  "same model and the same state arrays under the same tag");
    }

  // 2. Rank 0 prepares the temporary directory and picks the save id.
  // Any exception is caught until every rank knows the outcome: a rank leaving the protocol
  // early would leave the others waiting in a collective.
  std::vector<float> start(5, 0.0f);
  std::exception_ptr failure;
  if (rank == 0) {
    try {
      begin_save(dir, tag);
      put_u64(&start[1], new_save_id());
    } catch (...) {
      failure = std::current_exception();
      start[0] = 1.0f;
    }
  }
  comm.broadcast(start.data(), start.size(), DType::f32, 0).wait();
  if (start[0] != 0) {
    if (rank == 0) std::rethrow_exception(failure);
    ZERO_FAIL(what + "rank 0 could not prepare the directory (its error says why)");
  }
  const uint64_t save_id = get_u64(&start[1]);

  // 3. Every rank writes its file; all learn whether every rank succeeded.
  std::vector<float> wrote(1, 0.0f);
  try {
    write_rank_file(tmp_dir(dir, tag), rank, world, save_id, request);
  } catch (...) {
    failure = std::current_exception();
    wrote[0] = 1.0f;
  }
  fault_point(rank, /*sealed=*/false);
  const std::vector<float> written = gather(comm, wrote);
  if (const int bad = first_failed(written, 1); bad >= 0) {
    // Garbage now, and as large as the model state: rank 0, which created it, removes it.
    const std::string fate = rank == 0 ? discard(tmp_dir(dir, tag)) : std::string();
    if (failure) {
      if (rank != 0) std::rethrow_exception(failure);
      try {
        std::rethrow_exception(failure);
      } catch (const Error& e) {
        ZERO_FAIL(with_note(e.message(), fate));
      }
    }
    ZERO_FAIL(what + "rank " + std::to_string(bad) + " could not write its file (its error says " +
              "why); " + (rank == 0 ? fate : "the previous checkpoints are untouched"));
  }

  // 4. Rank 0 checks the files and commits; the others wait for its verdict.
  std::vector<float> committed(1, 0.0f);
  if (rank == 0) {
    try {
      commit_save(dir, tag, world, save_id, request);
    } catch (...) {
      failure = std::current_exception();
      committed[0] = 1.0f;
    }
  }
  comm.broadcast(committed.data(), committed.size(), DType::f32, 0).wait();
  if (committed[0] != 0) {
    if (rank == 0) std::rethrow_exception(failure);
    ZERO_FAIL(what + "rank 0 could not commit the checkpoint (its error says why)");
  }
}

}  // namespace zero::checkpoint
