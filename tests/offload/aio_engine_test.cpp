// The asynchronous file engine (offload/aio_engine.hpp): round trips of random bytes through both
// back-ends, many requests in flight, block_size cutting, the submission modes, and the errors
// (misaligned O_DIRECT request, end of file, full drive, unknown handle).
#include "offload/aio_engine.hpp"

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "tests/offload/scratch_dir.hpp"

using namespace zero::offload;
using Catch::Matchers::ContainsSubstring;
using zero::test::ScratchDir;
using zero::test::ScratchMount;

namespace {

struct AlignedBuffer {
  std::unique_ptr<char, decltype(&std::free)> p{nullptr, &std::free};
  explicit AlignedBuffer(size_t bytes)
      : p(static_cast<char*>(std::aligned_alloc(kAioAlignment, bytes ? bytes : kAioAlignment)),
          &std::free) {}
  char* get() const { return p.get(); }
};

void fill_random(char* p, size_t n, std::mt19937_64& rng) {
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<char>(rng());
}

// An engine on the back-end asked for, or null where the kernel has no io_uring for us (a test
// of several back-ends then goes on with the others; see make_engine for one back-end).
std::unique_ptr<AioEngine> engine_or_null(AioOptions opt) {
  try {
    return std::make_unique<AioEngine>(opt);
  } catch (const zero::Error& e) {
    if (opt.backend != AioBackend::io_uring) throw;
    WARN("io_uring unavailable here, not tested: " << e.what());
    return nullptr;
  }
}

// An engine on the back-end asked for, or a SKIP of the whole test where there is no io_uring.
std::unique_ptr<AioEngine> make_engine(AioOptions opt) {
  auto io = engine_or_null(opt);
  if (!io) SKIP("io_uring unavailable here");
  return io;
}

// Regions of random sizes at random offsets, all written at once, then all read back at once.
// direct: sizes and offsets are odd multiples of 4096 (what O_DIRECT allows); buffered: odd
// byte counts at odd offsets from odd buffer addresses.
void round_trip(AioBackend backend, bool direct) {
  ScratchDir dir;
  AioOptions opt;
  opt.backend = backend;
  opt.block_size = 16384;  // small, so most regions are cut into several pieces
  opt.queue_depth = 4;
  opt.threads = 2;
  auto io = make_engine(opt);
  REQUIRE(io->backend() == backend);
  AioFile f(dir.path + "/data", AioFile::Mode::create, direct);
  REQUIRE(f.direct() == direct);

  std::mt19937_64 rng(42);
  struct Region {
    uint64_t offset;
    size_t length;
    size_t skew;  // buffer address past the aligned start
  };
  std::vector<Region> regions;
  uint64_t at = direct ? 3 * kAioAlignment : 777;
  for (int i = 0; i < 24; ++i) {
    const size_t blocks = 1 + rng() % 37;
    Region r;
    r.offset = at;
    r.length = direct ? blocks * kAioAlignment : blocks * 1009 + rng() % 1000;
    r.skew = direct ? 0 : 1 + rng() % 63;
    regions.push_back(r);
    at += r.length + (direct ? (rng() % 3) * kAioAlignment : rng() % 5000);
  }
  std::vector<AlignedBuffer> src, dst;
  std::vector<AioHandle> hs;
  uint64_t total = 0;
  for (const Region& r : regions) {
    src.emplace_back(r.length + r.skew);
    dst.emplace_back(r.length + r.skew);
    fill_random(src.back().get() + r.skew, r.length, rng);
    std::memset(dst.back().get(), 0, r.length + r.skew);
    hs.push_back(io->write(f, src.back().get() + r.skew, r.length, r.offset));
    total += r.length;
  }
  for (AioHandle h : hs) io->wait(h);
  hs.clear();
  for (size_t i = 0; i < regions.size(); ++i)
    hs.push_back(io->read(f, dst[i].get() + regions[i].skew, regions[i].length, regions[i].offset));
  for (AioHandle h : hs) io->wait(h);
  for (size_t i = 0; i < regions.size(); ++i)
    REQUIRE(std::memcmp(src[i].get() + regions[i].skew, dst[i].get() + regions[i].skew,
                        regions[i].length) == 0);
  CHECK(io->bytes_written() == total);
  CHECK(io->bytes_read() == total);
}

}  // namespace

TEST_CASE("io_uring round trip of random regions with O_DIRECT", "[aio]") {
  round_trip(AioBackend::io_uring, true);
}

TEST_CASE("io_uring round trip of odd sizes and offsets buffered", "[aio]") {
  round_trip(AioBackend::io_uring, false);
}

TEST_CASE("thread back-end round trip of random regions with O_DIRECT", "[aio]") {
  round_trip(AioBackend::threads, true);
}

TEST_CASE("thread back-end round trip of odd sizes and offsets buffered", "[aio]") {
  round_trip(AioBackend::threads, false);
}

TEST_CASE("automatic back-end picks a real one", "[aio]") {
  AioEngine io;
  CHECK(io.backend() != AioBackend::automatic);
}

// Many requests, far more pieces than queue_depth, waited for in reverse order, in each
// submission mode of io_uring and on threads.
TEST_CASE("many requests in flight in every submission mode", "[aio]") {
  struct Mode {
    AioBackend backend;
    bool single_submit, overlap_events;
  };
  const Mode modes[] = {{AioBackend::io_uring, false, true},
                        {AioBackend::io_uring, true, true},
                        {AioBackend::io_uring, false, false},
                        {AioBackend::io_uring, true, false},
                        {AioBackend::threads, false, true}};
  for (const Mode& m : modes) {
    CAPTURE(to_string(m.backend), m.single_submit, m.overlap_events);
    ScratchDir dir;
    AioOptions opt;
    opt.backend = m.backend;
    opt.block_size = 8192;
    opt.queue_depth = 3;
    opt.threads = 3;
    opt.single_submit = m.single_submit;
    opt.overlap_events = m.overlap_events;
    auto io = engine_or_null(opt);
    if (!io) continue;
    AioFile f(dir.path + "/many", AioFile::Mode::create);
    constexpr int kRequests = 48;
    constexpr size_t kBytes = 20 * 4096;  // 10 pieces each: 480 pieces through 3 slots
    AlignedBuffer src(kRequests * kBytes), dst(kRequests * kBytes);
    std::mt19937_64 rng(7);
    fill_random(src.get(), kRequests * kBytes, rng);
    std::vector<AioHandle> hs;
    for (int i = 0; i < kRequests; ++i)
      hs.push_back(io->write(f, src.get() + i * kBytes, kBytes, uint64_t(i) * kBytes));
    for (int i = kRequests - 1; i >= 0; --i) io->wait(hs[size_t(i)]);
    hs.clear();
    for (int i = 0; i < kRequests; ++i)
      hs.push_back(io->read(f, dst.get() + i * kBytes, kBytes, uint64_t(i) * kBytes));
    for (int i = kRequests - 1; i >= 0; --i) io->wait(hs[size_t(i)]);
    REQUIRE(std::memcmp(src.get(), dst.get(), kRequests * kBytes) == 0);
    CHECK(io->operations() == 2 * kRequests * 10);
  }
}

TEST_CASE("a request is cut into block_size pieces", "[aio]") {
  ScratchDir dir;
  for (AioBackend b : {AioBackend::io_uring, AioBackend::threads}) {
    CAPTURE(to_string(b));
    AioOptions opt;
    opt.backend = b;
    opt.block_size = 3 * 4096;
    auto io = engine_or_null(opt);
    if (!io) continue;
    AioFile f(dir.path + "/cut", AioFile::Mode::create, /*prefer_direct=*/false);
    const size_t n = 10 * opt.block_size + 100;  // 10 full pieces and a short one
    AlignedBuffer src(n), dst(n);
    std::mt19937_64 rng(3);
    fill_random(src.get(), n, rng);
    io->wait(io->write(f, src.get(), n, 5));
    CHECK(io->operations() == 11);
    io->wait(io->read(f, dst.get(), n, 5));
    CHECK(io->operations() == 22);
    REQUIRE(std::memcmp(src.get(), dst.get(), n) == 0);
    // An empty request is finished at once and moves nothing.
    io->wait(io->write(f, src.get(), 0, 0));
    CHECK(io->operations() == 22);
  }
}

TEST_CASE("a misaligned request on an O_DIRECT file is refused at submission", "[aio]") {
  ScratchDir dir;
  AioEngine io;
  AioFile f(dir.path + "/direct", AioFile::Mode::create);
  REQUIRE(f.direct());
  AlignedBuffer buf(3 * 4096);
  CHECK_THROWS_WITH(io.write(f, buf.get(), 4096, 512),
                    ContainsSubstring("not aligned") && ContainsSubstring(f.path()));
  CHECK_THROWS_WITH(io.write(f, buf.get(), 1000, 0), ContainsSubstring("multiples of 4096"));
  CHECK_THROWS_WITH(io.write(f, buf.get() + 8, 4096, 0), ContainsSubstring("not aligned"));
}

TEST_CASE("reading past the end of a file is an error naming it", "[aio]") {
  ScratchDir dir;
  for (AioBackend b : {AioBackend::io_uring, AioBackend::threads}) {
    CAPTURE(to_string(b));
    AioOptions opt;
    opt.backend = b;
    auto io = engine_or_null(opt);
    if (!io) continue;
    AioFile f(dir.path + "/short", AioFile::Mode::create);
    AlignedBuffer buf(4 * 4096);
    std::memset(buf.get(), 1, 4 * 4096);
    io->wait(io->write(f, buf.get(), 4096, 0));
    const AioHandle h = io->read(f, buf.get(), 4 * 4096, 0);
    CHECK_THROWS_WITH(io->wait(h), ContainsSubstring("end of the file") &&
                                       ContainsSubstring(f.path()));
  }
}

TEST_CASE("waiting twice or on a foreign handle is an error", "[aio]") {
  ScratchDir dir;
  AioEngine io;
  AioFile f(dir.path + "/h", AioFile::Mode::create);
  AlignedBuffer buf(4096);
  const AioHandle h = io.write(f, buf.get(), 4096, 0);
  while (!io.ready(h)) std::this_thread::yield();
  io.wait(h);
  CHECK_THROWS_WITH(io.wait(h), ContainsSubstring("unknown handle"));
  CHECK_THROWS_WITH(io.ready(h), ContainsSubstring("unknown handle"));
  CHECK_THROWS_WITH(io.wait(AioHandle{12345}), ContainsSubstring("unknown handle"));
}

TEST_CASE("a write to /dev/full fails with ENOSPC on both back-ends", "[aio]") {
  for (AioBackend b : {AioBackend::io_uring, AioBackend::threads}) {
    CAPTURE(to_string(b));
    AioOptions opt;
    opt.backend = b;
    auto io = engine_or_null(opt);
    if (!io) continue;
    AioFile f("/dev/full", AioFile::Mode::read_write, /*prefer_direct=*/false);
    AlignedBuffer buf(8192);
    const AioHandle h = io->write(f, buf.get(), 8192, 0);
    CHECK_THROWS_WITH(io->wait(h), ContainsSubstring("ENOSPC") && ContainsSubstring("/dev/full") &&
                                       ContainsSubstring("What to do"));
  }
}

// A 1 MiB tmpfs: a 3 MiB write fills it part-way (a short write) and then fails.
TEST_CASE("a write that fills the drive part-way fails with ENOSPC", "[aio]") {
  for (AioBackend b : {AioBackend::io_uring, AioBackend::threads}) {
    for (bool direct : {true, false}) {
      CAPTURE(to_string(b), direct);
      ScratchMount m("tmpfs", "size=1m");
      if (!m.mounted) SKIP(m.why);
      AioOptions opt;
      opt.backend = b;
      opt.block_size = 3 << 20;  // one piece: the kernel's short write is what is tested
      auto io = engine_or_null(opt);
    if (!io) continue;
      AioFile f(m.path() + "/swap", AioFile::Mode::create, direct);
      AlignedBuffer buf(3 << 20);
      std::memset(buf.get(), 7, 3 << 20);
      const AioHandle h = io->write(f, buf.get(), 3 << 20, 0);
      CHECK_THROWS_WITH(io->wait(h), ContainsSubstring("ENOSPC") &&
                                         ContainsSubstring(m.path() + "/swap"));
      // What did fit was counted.
      CHECK(io->bytes_written() <= (1u << 20));
    }
  }
}

TEST_CASE("bad aio settings are errors naming the setting", "[aio]") {
  AioOptions opt;
  opt.block_size = 1000;
  CHECK_THROWS_WITH(AioEngine(opt), ContainsSubstring("aio.block_size"));
  opt = {};
  opt.queue_depth = 0;
  CHECK_THROWS_WITH(AioEngine(opt), ContainsSubstring("aio.queue_depth"));
  opt = {};
  opt.threads = 0;
  CHECK_THROWS_WITH(AioEngine(opt), ContainsSubstring("aio.intra_op_parallelism"));
}

// What a container's seccomp profile does to io_uring: io_uring_setup fails with EPERM. In a
// child process with such a filter, the automatic engine must fall back to threads, say so once
// (two engines, one warning), still move bytes correctly, and an explicit io_uring request must
// be an error.
TEST_CASE("io_uring blocked by seccomp falls back to threads with one warning", "[aio]") {
  ScratchDir dir;
  int out[2];
  REQUIRE(::pipe(out) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 2);
    ::close(out[0]);
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog prog{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
      ::_exit(10);
    try {
      AioEngine first, second;
      if (first.backend() != AioBackend::threads || second.backend() != AioBackend::threads)
        ::_exit(3);
      AioFile f(dir.path + "/seccomp", AioFile::Mode::create);
      AlignedBuffer a(65536), b(65536);
      std::mt19937_64 rng(5);
      fill_random(a.get(), 65536, rng);
      first.wait(first.write(f, a.get(), 65536, 0));
      second.wait(second.read(f, b.get(), 65536, 0));
      if (std::memcmp(a.get(), b.get(), 65536) != 0) ::_exit(4);
      AioOptions want;
      want.backend = AioBackend::io_uring;
      try {
        AioEngine refused(want);
        ::_exit(5);
      } catch (const zero::Error& e) {
        if (!std::strstr(e.what(), "asked for io_uring")) ::_exit(6);
      }
    } catch (...) {
      ::_exit(7);
    }
    ::_exit(0);
  }
  ::close(out[1]);
  std::string err;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(out[0], buf, sizeof buf)) > 0) err.append(buf, size_t(n));
  ::close(out[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 10) SKIP("cannot install a seccomp filter here");
  CAPTURE(err);
  REQUIRE(WEXITSTATUS(status) == 0);
  const std::string warning = "io_uring is unavailable";
  const size_t at = err.find(warning);
  CHECK(at != std::string::npos);
  CHECK(err.find(warning, at + 1) == std::string::npos);
}

// The engine's members may be called from any thread: four threads submit and wait on one
// engine at once, each on its own region, many rounds.
TEST_CASE("several threads submit and wait on one engine", "[aio]") {
  for (AioBackend b : {AioBackend::threads, AioBackend::io_uring}) {
    CAPTURE(to_string(b));
    ScratchDir dir;
    AioOptions opt;
    opt.backend = b;
    opt.block_size = 8192;
    opt.queue_depth = 4;
    opt.threads = 2;
    auto io = engine_or_null(opt);
    if (!io) continue;
    AioFile f(dir.path + "/shared", AioFile::Mode::create);
    constexpr size_t kRegion = 64 * 1024;
    constexpr int kThreads = 4, kRounds = 20;
    std::vector<int> bad(kThreads, 0);
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        AlignedBuffer src(kRegion), dst(kRegion);
        std::mt19937_64 rng(100 + uint64_t(t));
        for (int round = 0; round < kRounds; ++round) {
          fill_random(src.get(), kRegion, rng);
          const uint64_t off = uint64_t(t) * kRegion;
          io->wait(io->write(f, src.get(), kRegion, off));
          io->wait(io->read(f, dst.get(), kRegion, off));
          if (std::memcmp(src.get(), dst.get(), kRegion) != 0) ++bad[size_t(t)];
        }
      });
    for (std::thread& t : ts) t.join();
    for (int t = 0; t < kThreads; ++t) CHECK(bad[size_t(t)] == 0);
    CHECK(io->bytes_written() == uint64_t(kThreads) * kRounds * kRegion);
  }
}
