// nvme_io: sequential write and read bandwidth of the asynchronous file engine
// (offload/aio_engine.hpp) on a swap-sized file, against fio on the same directory, same block
// size and queue depth, in the same run, repetition by repetition.
//
// Ours: one file of --size-mib MiB, written (then read) front to back as requests of up to
// 16 MiB, all submitted at once, so the engine keeps queue_depth pieces of block_size bytes in
// flight -- the pattern of swapping a large optimizer-state group. Timed from the first
// submission to the last wait; the file is opened once and overwritten, as fio overwrites its
// own file. The requests cycle over one buffer of queue_depth x block_size bytes by default,
// the footprint fio's job has (iodepth buffers of bs): on a virtual disk the host copies every
// byte, and a buffer that stays in the CPU caches is measurably faster than one that does not,
// so comparing different footprints would measure the caches, not the engine. --buffer-mib
// sets a larger one (a swap buffer's real size) for the record.
// fio: one job, rw=write then rw=read, bs = block_size, iodepth = queue_depth, ioengine=io_uring,
// direct=1; its own bandwidth figure (which leaves out its start-up). Both sides use the same
// file: on a virtual disk the host's cache of the image makes one place of it faster than
// another, so two files would compare places, not engines. Where the engine had to
// fall back, fio is run the same way: the thread back-end against ioengine=psync with
// numjobs = threads, each job on its share of the file; a file system without O_DIRECT against
// direct=0. The JSON says which. Neither side calls fsync: with O_DIRECT the bytes have left the
// page cache when a write completes; with buffered I/O both measure the page cache.
//
//   build/bench/nvme_io [--quick] [--dir DIR] [--size-mib N] [--block-size BYTES]
//                       [--queue-depth N] [--backend automatic|io_uring|threads] [--threads N]
//                       [--buffer-mib N]
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/common/report.hpp"
#include "offload/aio_engine.hpp"
#include "offload/aio_file.hpp"

namespace {

using namespace zero::offload;
using zero::bench::Stats;

const char* const kUsage =
    "usage: nvme_io [--quick] [--dir DIR] [--size-mib N] [--block-size BYTES] [--queue-depth N]\n"
    "               [--backend automatic|io_uring|threads] [--threads N] [--buffer-mib N]\n"
    "  Sequential write/read bandwidth of the file engine vs fio (same directory, block size,\n"
    "  queue depth, same run); JSON on stdout. --quick: a 512 MiB file (default 2048 MiB).\n"
    "  --dir: where the files go (default: a new directory under /tmp, removed at the end).\n";

struct Args {
  bool quick = false;
  std::string dir;
  size_t size_mib = 0;
  size_t buffer_mib = 0;  // 0: queue_depth x block_size, fio's footprint
  AioOptions aio;
};

[[noreturn]] void usage_error(const std::string& what) {
  std::fprintf(stderr, "error: %s\n%s", what.c_str(), kUsage);
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(f + " needs a value");
      return argv[++i];
    };
    if (f == "--dir") a.dir = value();
    else if (f == "--size-mib") a.size_mib = std::stoul(value());
    else if (f == "--buffer-mib") a.buffer_mib = std::stoul(value());
    else if (f == "--block-size") a.aio.block_size = std::stoul(value());
    else if (f == "--queue-depth") a.aio.queue_depth = std::stoi(value());
    else if (f == "--threads") a.aio.threads = std::stoi(value());
    else if (f == "--backend") {
      const std::string b = value();
      if (b == "automatic") a.aio.backend = AioBackend::automatic;
      else if (b == "io_uring") a.aio.backend = AioBackend::io_uring;
      else if (b == "threads") a.aio.backend = AioBackend::threads;
      else usage_error("unknown backend '" + b + "'");
    } else rest.push_back(argv[i]);
  }
  a.quick = zero::bench::parse_options(int(rest.size()), rest.data(), kUsage).quick;
  if (a.size_mib == 0) a.size_mib = a.quick ? 512 : 2048;
  return a;
}

// stdout of a shell command; empty on failure.
std::string run(const std::string& cmd) {
  std::string out;
  if (std::FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    if (pclose(p) != 0) return {};
  }
  return out;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// The engine over the whole file, requests of up to 16 MiB (no larger than the buffer) cycling
// over the buffer.
size_t request_bytes(size_t buf_bytes) { return std::min(size_t{16} << 20, buf_bytes); }

double ours(AioEngine& io, const AioFile& f, char* buf, size_t buf_bytes, size_t bytes,
            bool write) {
  std::vector<AioHandle> hs;
  const size_t request = request_bytes(buf_bytes);
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t off = 0; off < bytes; off += request) {
    const size_t len = std::min(request, bytes - off);
    char* b = buf + (off % buf_bytes);
    hs.push_back(write ? io.write(f, b, len, off) : io.read(f, b, len, off));
  }
  for (AioHandle h : hs) io.wait(h);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Fio {
  std::string command;
  double bw = 0;  // bytes/s
};

Fio fio(const Args& a, const std::string& file, bool uring, bool direct, bool write) {
  const size_t bytes = a.size_mib << 20;
  const int jobs = uring ? 1 : a.aio.threads;
  std::string c = "fio --name=nvme_io --filename=" + file + " --rw=" + (write ? "write" : "read") +
                  " --bs=" + std::to_string(a.aio.block_size) +
                  " --direct=" + (direct ? "1" : "0") + " --output-format=json";
  if (uring) {
    c += " --ioengine=io_uring --iodepth=" + std::to_string(a.aio.queue_depth) +
         " --size=" + std::to_string(bytes);
  } else {
    c += " --ioengine=psync --numjobs=" + std::to_string(jobs) + " --group_reporting" +
         " --size=" + std::to_string(bytes / size_t(jobs)) +
         " --offset_increment=" + std::to_string(bytes / size_t(jobs));
  }
  Fio r;
  r.command = c;
  const std::string out = run(c + " 2>/dev/null");
  if (out.empty()) {
    std::fprintf(stderr, "error: fio failed: %s\n", c.c_str());
    std::exit(1);
  }
  // fio may print notes before the JSON document.
  const auto j = nlohmann::json::parse(out.substr(out.find('{')));
  r.bw = j["jobs"][0][write ? "write" : "read"]["bw_bytes"].get<double>();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace zero::bench;
  Args a = parse(argc, argv);
  if (run("command -v fio").empty()) {
    std::fprintf(stderr, "error: fio not found: install the Debian package fio "
                         "(scripts/setup.sh does)\n");
    return 1;
  }
  const bool own_dir = a.dir.empty();
  if (own_dir) {
    char tmpl[] = "/tmp/zero-nvme-io-XXXXXX";
    a.dir = ::mkdtemp(tmpl);
  }
  const size_t bytes = a.size_mib << 20;
  const int reps = a.quick ? 7 : 11;
  try {
    AioEngine io(a.aio);
    const bool uring = io.backend() == AioBackend::io_uring;
    AioFile f(a.dir + "/zero.dat", AioFile::Mode::create);
    const bool direct = f.direct();
    const std::string fio_file = f.path();  // the same file (see the top of this file)
    const std::string fstype =
        trim(run("findmnt -n -o FSTYPE -T '" + a.dir + "' 2>/dev/null")) + " on " +
        trim(run("findmnt -n -o SOURCE -T '" + a.dir + "' 2>/dev/null"));
    const std::string fio_version = trim(run("fio --version"));

    const size_t buf_bytes =
        std::min(bytes, a.buffer_mib ? a.buffer_mib << 20
                                     : size_t(a.aio.queue_depth) * a.aio.block_size);
    std::unique_ptr<char, decltype(&std::free)> buf(
        static_cast<char*>(std::aligned_alloc(kAioAlignment, buf_bytes)), &std::free);
    for (size_t i = 0; i < buf_bytes; ++i) buf.get()[i] = static_cast<char>(i * 131 + 7);

    Report report("nvme_io", argc, argv, a.quick, 1, uring ? 1 : a.aio.threads);
    std::fprintf(stderr, "nvme_io: %zu MiB in %s (%s), %s, %s, bs %zu, qd %d, %d reps\n",
                 a.size_mib, a.dir.c_str(), fstype.c_str(), to_string(io.backend()),
                 direct ? "O_DIRECT" : "buffered", a.aio.block_size, a.aio.queue_depth, reps);
    // Warm-up (lays out both files), then reps interleaved: ours and fio alternate who goes
    // first, so a slow drift of the shared machine hits both alike.
    std::vector<double> ow, orr, fw, fr;
    Fio fio_w, fio_r;
    for (int rep = -1; rep < reps; ++rep) {
      std::fprintf(stderr, "  rep %d\n", rep + 1);
      const bool fio_first = rep % 2 != 0;
      for (bool write : {true, false}) {
        double t_ours = 0;
        Fio fi;
        if (fio_first) fi = fio(a, fio_file, uring, direct, write);
        t_ours = ours(io, f, buf.get(), buf_bytes, bytes, write);
        if (!fio_first) fi = fio(a, fio_file, uring, direct, write);
        if (rep < 0) continue;
        (write ? ow : orr).push_back(t_ours);
        (write ? fw : fr).push_back(fi.bw);
        (write ? fio_w : fio_r) = fi;
      }
    }
    const nlohmann::json common = {
        {"dir", a.dir},
        {"file_system", fstype},
        {"file_bytes", bytes},
        {"request_bytes", request_bytes(buf_bytes)},
        {"buffer_bytes", buf_bytes},
        {"block_size", a.aio.block_size},
        {"queue_depth", a.aio.queue_depth},
        {"threads", a.aio.threads},
        {"single_submit", a.aio.single_submit},
        {"overlap_events", a.aio.overlap_events},
        {"backend_asked", to_string(a.aio.backend)},
        {"backend_used", to_string(io.backend())},
        {"o_direct", direct},
        {"fio_version", fio_version},
        {"fallback_note",
         std::string(uring ? "" : "io_uring unavailable: ours on threads, fio on psync. ") +
             (direct ? "" : "no O_DIRECT on this file system: both buffered (page cache).")}};
    for (bool write : {true, false}) {
      const std::vector<double>& t = write ? ow : orr;
      std::vector<double> fio_bw = write ? fw : fr;
      std::sort(fio_bw.begin(), fio_bw.end());
      const Stats s = rate(double(bytes), stats_of(t));
      const Stats fs = stats_of(fio_bw);
      Result r;
      r.name = std::string("sequential ") + (write ? "write" : "read") + ", " +
               std::to_string(a.size_mib) + " MiB file, bs " +
               std::to_string(a.aio.block_size >> 10) + " KiB, qd " +
               std::to_string(a.aio.queue_depth) + ", " + to_string(io.backend()) +
               (direct ? ", O_DIRECT" : ", buffered");
      r.params = common;
      r.params["fio_command"] = (write ? fio_w : fio_r).command;
      r.params["fio_min"] = fs.min;
      r.params["fio_max"] = fs.max;
      r.params["GBps"] = s.median / 1e9;
      r.params["fio_GBps"] = fs.median / 1e9;
      // Each rep's ours/fio, the two measured back to back: on a shared machine and disk the
      // pairs see the same weather, so their median is steadier than the ratio of medians.
      std::vector<double> paired;
      for (size_t i = 0; i < t.size(); ++i)
        paired.push_back(double(bytes) / t[i] / (write ? fw : fr)[i]);
      r.params["paired_ratio_median"] = stats_of(paired).median;
      r.metric = "bandwidth";
      r.unit = "bytes/s";
      r.value = s;
      r.reference_name = std::string("fio ") + (uring ? "io_uring" : "psync") +
                         (direct ? " direct=1" : " direct=0") + ", same dir, bs, queue depth";
      r.reference_median = fs.median;
      r.goal = Goal{"ratio_at_least", 0.9};  // issue 20
      report.add(std::move(r));
    }
    f.close();
    std::error_code ec;
    std::filesystem::remove(fio_file, ec);
    if (own_dir) std::filesystem::remove(a.dir, ec);
    report.print();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (own_dir) std::filesystem::remove_all(a.dir);
    return 1;
  }
  return 0;
}
