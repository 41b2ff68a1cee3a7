// HostMemory on the cpu device (offload/host_memory.hpp): the ledger's host column by category,
// pinned = mlock'd pages, the totals, the host capacity, and the pinning fallback under a real
// locked-memory limit (RLIMIT_MEMLOCK lowered in a forked child).
//
// This file starts no threads (no streams, no oneTBB), so fork() is safe here: the child owns
// the only thread, and it leaves with _exit() so nothing of Catch2's runs twice.
#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "offload/host_memory.hpp"
#include "core/error.hpp"

using Catch::Matchers::ContainsSubstring;
using zero::MemCategory;
using zero::MemSpace;
using zero::offload::HostBuffer;
using zero::offload::HostMemory;
using zero::offload::HostMemoryOptions;
using zero::offload::PinPolicy;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// VmLck of this process (bytes locked with mlock), from /proc/self/status.
std::optional<size_t> locked_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmLck:", 0) == 0) {
      std::istringstream in(line.substr(6));
      size_t kib = 0;
      if (in >> kib) return kib * 1024;
    }
  return std::nullopt;
}

// Whether this process may lock `bytes` more right now (the environment decides, not our code).
bool can_lock(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  const bool ok = mlock(p, bytes) == 0;
  munmap(p, bytes);
  return ok;
}

// Whether a successful mlock shows in VmLck. Sanitizer runtimes intercept mlock as a no-op that
// succeeds, so there the lock cannot be observed.
bool mlock_shows() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const std::optional<size_t> before = locked_bytes();
  void* p = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED || !before) return false;
  const bool shows = mlock(p, page) == 0 && locked_bytes().value_or(0) >= *before + page;
  munmap(p, page);
  return shows;
}

HostMemoryOptions capture_warnings(PinPolicy pin, std::vector<std::string>& sink) {
  HostMemoryOptions o;
  o.pin = pin;
  o.on_warning = [&sink](const std::string& line) { sink.push_back(line); };
  return o;
}

// Drops CAP_IPC_LOCK (which lets root lock memory past RLIMIT_MEMLOCK) from this process's
// effective, permitted and inheritable sets, with the raw syscalls (no libcap).
bool drop_cap_ipc_lock() {
  __user_cap_header_struct header{};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  header.pid = 0;
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3]{};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  const unsigned word = CAP_IPC_LOCK / 32, bit = 1u << (CAP_IPC_LOCK % 32);
  data[word].effective &= ~bit;
  data[word].permitted &= ~bit;
  data[word].inheritable &= ~bit;
  return syscall(SYS_capset, &header, data) == 0;
}

// Facts a child reports back, "key=value" lines; newlines inside values are escaped as "\n".
using Facts = std::map<std::string, std::string>;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// Runs body in a forked child and returns what it reported. The child's own exceptions come back
// as the fact "exception"; a child that dies without reporting fails the test.
Facts run_in_child(const std::function<void(Facts&)>& body) {
  int fds[2];
  ZERO_CHECK_SYS(pipe(fds));
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  ZERO_CHECK_SYS(pid);
  if (pid == 0) {
    close(fds[0]);
    Facts facts;
    try {
      body(facts);
    } catch (const std::exception& e) {
      facts["exception"] = e.what();
    }
    std::string out;
    for (const auto& [k, v] : facts) out += k + "=" + escape(v) + "\n";
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = write(fds[1], out.data() + done, out.size() - done);
      if (n <= 0) _exit(3);
      done += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  Facts facts;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) facts[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return facts;
}

}  // namespace

TEST_CASE("host memory: policy names") {
  using zero::offload::parse_pin_policy;
  CHECK(parse_pin_policy("required") == PinPolicy::required);
  CHECK(parse_pin_policy("preferred") == PinPolicy::preferred);
  CHECK(parse_pin_policy("off") == PinPolicy::off);
  CHECK_FALSE(parse_pin_policy("Pinned").has_value());
  CHECK(zero::offload::to_string(PinPolicy::preferred) == "preferred");
  CHECK(HostMemoryOptions{}.pin == PinPolicy::preferred);  // the default
}

TEST_CASE("host memory: buffers are page-aligned, counted by category, pinned by default") {
  auto dev = zero::make_device(zero::DeviceKind::cpu);
  // Whether the environment lets all three buffers below be locked at once; if it does not, each
  // buffer is pinned or not as the limit allows, and the totals follow the buffers.
  const bool lockable = can_lock(2 * kMiB);
  std::vector<std::string> warnings;
  HostMemory host(*dev, capture_warnings(PinPolicy::preferred, warnings));
  CHECK(&host.device() == dev.get());
  CHECK(host.policy() == PinPolicy::preferred);
  const std::optional<size_t> locked_before = locked_bytes();
  {
    HostBuffer master = host.allocate(1000, MemCategory::master_weights);
    HostBuffer moments = host.allocate(kMiB, MemCategory::optimizer_states);
    HostBuffer staging = host.allocate(4096, MemCategory::comm_buffers);
    for (const HostBuffer* b : {&master, &moments, &staging}) {
      REQUIRE(b->data() != nullptr);
      CHECK(reinterpret_cast<uintptr_t>(b->data()) % 4096 == 0);
      CHECK(b->buffer().space() == MemSpace::host);
      if (lockable) CHECK(b->pinned());
      std::memset(b->data(), 0x5a, b->bytes());  // the memory is really there
    }
    CHECK(master.category() == MemCategory::master_weights);
    const zero::MemoryLedger& ledger = dev->ledger();
    CHECK(ledger.current(MemSpace::host, MemCategory::master_weights) == 1000);
    CHECK(ledger.current(MemSpace::host, MemCategory::optimizer_states) == kMiB);
    CHECK(ledger.current(MemSpace::host, MemCategory::comm_buffers) == 4096);
    CHECK(ledger.current(MemSpace::device) == 0);
    const size_t total = 1000 + kMiB + 4096;
    size_t pinned = 0;
    for (const HostBuffer* b : {&master, &moments, &staging}) pinned += b->pinned() ? b->bytes() : 0;
    CHECK(host.pinned_bytes() == pinned);
    CHECK(host.unpinned_bytes() == total - pinned);
    CHECK(warnings.size() == (pinned == total ? 0u : 1u));
    // Pinned on the cpu backend means locked into RAM: the process's locked total grew by at
    // least the pages of the three buffers.
    if (lockable && locked_before && mlock_shows())
      CHECK(locked_bytes().value_or(0) >= *locked_before + 4096 + kMiB + 4096);
    if (lockable) CHECK_THAT(host.summary(), ContainsSubstring("pinned, 0 B pageable"));

    HostBuffer moved = std::move(moments);
    CHECK_FALSE(moments);
    CHECK(moved.bytes() == kMiB);
    CHECK(host.pinned_bytes() + host.unpinned_bytes() == total);  // a move is not an allocation
    moved.reset();
    CHECK(host.pinned_bytes() + host.unpinned_bytes() == 1000 + 4096);
    CHECK(ledger.current(MemSpace::host, MemCategory::optimizer_states) == 0);
  }
  CHECK(host.pinned_bytes() == 0);
  CHECK(host.unpinned_bytes() == 0);
  CHECK(dev->ledger().current(MemSpace::host) == 0);
  // Freeing unlocks: the locked total is back where it was.
  if (locked_before) CHECK(locked_bytes() == locked_before);
}

TEST_CASE("host memory: policy off never pins and never warns") {
  auto dev = zero::make_device(zero::DeviceKind::cpu);
  std::vector<std::string> warnings;
  HostMemory host(*dev, capture_warnings(PinPolicy::off, warnings));
  HostBuffer b = host.allocate(3 * 4096 + 1, MemCategory::parameters);
  CHECK_FALSE(b.pinned());
  CHECK(reinterpret_cast<uintptr_t>(b.data()) % 4096 == 0);
  CHECK(host.unpinned_bytes() == 3 * 4096 + 1);
  CHECK(host.pinned_bytes() == 0);
  CHECK(host.fallbacks() == 0);
  CHECK(warnings.empty());
  CHECK(dev->ledger().current(MemSpace::host, MemCategory::parameters) == 3 * 4096 + 1);
  CHECK_THAT(host.summary(), ContainsSubstring("host memory of cpu:0: 0 B pinned, 12.00 KiB "
                                               "pageable (pinning off)"));
}

TEST_CASE("host memory: zero bytes give an empty, valid buffer") {
  auto dev = zero::make_device(zero::DeviceKind::cpu);
  HostMemory host(*dev);
  HostBuffer b = host.allocate(0, MemCategory::gradients);
  CHECK(b);
  CHECK(b.data() == nullptr);
  CHECK(b.bytes() == 0);
  CHECK(host.pinned_bytes() + host.unpinned_bytes() == 0);
}

TEST_CASE("host memory: past the host capacity it is the ledger's OutOfMemory, not a fallback") {
  zero::DeviceOptions opt;
  opt.host_memory_limit = 64 << 10;
  auto dev = zero::make_device(zero::DeviceKind::cpu, 0, opt);
  for (PinPolicy pin : {PinPolicy::required, PinPolicy::preferred, PinPolicy::off}) {
    CAPTURE(zero::offload::to_string(pin));
    // `required` needs the 48 KiB below locked; under a lower memlock limit that is its error.
    if (pin == PinPolicy::required && !can_lock(48 << 10)) continue;
    std::vector<std::string> warnings;
    HostMemory host(*dev, capture_warnings(pin, warnings));
    HostBuffer a = host.allocate(48 << 10, MemCategory::optimizer_states);
    // (Under a low memlock limit `a` itself may have fallen back: only the refusal below counts.)
    const size_t warned = warnings.size(), fell_back = host.fallbacks();
    try {
      HostBuffer b = host.allocate(32 << 10, MemCategory::master_weights);
      FAIL("an allocation past the host capacity succeeded");
    } catch (const zero::OutOfMemory& e) {
      CHECK_THAT(std::string(e.what()), ContainsSubstring("out of host memory on cpu:0") &&
                                            ContainsSubstring("over capacity") &&
                                            ContainsSubstring("master weights"));
    }
    CHECK(warnings.size() == warned);
    CHECK(host.fallbacks() == fell_back);
    CHECK(dev->ledger().current(MemSpace::host) == 48u << 10);
  }
}

// The fallback for real: a child process without CAP_IPC_LOCK and with RLIMIT_MEMLOCK lowered to
// 64 KiB asks for 1 MiB buffers. Where mlock still succeeds (a kernel or sandbox that ignores the
// limit) the case is skipped, saying so.
TEST_CASE("host memory: under a memlock limit, preferred falls back with one warning and "
          "required fails") {
  constexpr size_t kLimit = 64 << 10;
  const Facts f = run_in_child([&](Facts& out) {
    const bool dropped = drop_cap_ipc_lock();
    const rlimit lim{kLimit, kLimit};
    if (setrlimit(RLIMIT_MEMLOCK, &lim) != 0) {
      out["skip"] = std::string("setrlimit(RLIMIT_MEMLOCK) failed: ") + std::strerror(errno);
      return;
    }
    if (can_lock(kMiB)) {
      out["skip"] = std::string("mlock of 1 MiB still succeeds with RLIMIT_MEMLOCK at 64 KiB") +
                    (dropped ? " and CAP_IPC_LOCK dropped" : " (dropping CAP_IPC_LOCK failed)") +
                    (mlock_shows() ? "" : "; mlock locks nothing here (a sanitizer runtime?)");
      return;
    }
    auto dev = zero::make_device(zero::DeviceKind::cpu);

    // preferred: pageable memory, one warning for two refusals; a buffer under the limit pins.
    std::vector<std::string> warnings;
    HostMemory host(*dev, capture_warnings(PinPolicy::preferred, warnings));
    HostBuffer a = host.allocate(kMiB, MemCategory::optimizer_states);
    HostBuffer b = host.allocate(kMiB, MemCategory::master_weights);
    HostBuffer small = host.allocate(4096, MemCategory::gradients);
    std::memset(a.data(), 1, a.bytes());
    out["a_pinned"] = std::to_string(a.pinned());
    out["b_pinned"] = std::to_string(b.pinned());
    out["small_pinned"] = std::to_string(small.pinned());
    out["warnings"] = std::to_string(warnings.size());
    out["warning"] = warnings.empty() ? "" : warnings[0];
    out["pinned_bytes"] = std::to_string(host.pinned_bytes());
    out["unpinned_bytes"] = std::to_string(host.unpinned_bytes());
    out["fallbacks"] = std::to_string(host.fallbacks());
    out["summary"] = host.summary();
    out["ledger_host"] = std::to_string(dev->ledger().current(MemSpace::host));
    out["ledger_states"] =
        std::to_string(dev->ledger().current(MemSpace::host, MemCategory::optimizer_states));

    // required: zero::Error (not the ledger's OutOfMemory), nothing left allocated.
    HostMemoryOptions strict;
    strict.pin = PinPolicy::required;
    HostMemory required(*dev, strict);
    const size_t before = dev->ledger().current(MemSpace::host);
    try {
      (void)required.allocate(kMiB, MemCategory::parameters);
      out["required"] = "succeeded";
    } catch (const zero::OutOfMemory& e) {
      out["required"] = std::string("OutOfMemory: ") + e.what();
    } catch (const zero::Error& e) {
      out["required"] = "Error";
      out["required_message"] = e.what();
    }
    out["required_leak"] = std::to_string(dev->ledger().current(MemSpace::host) - before);

    // The device itself: a refused pin is an OutOfMemory saying so.
    try {
      (void)dev->allocate_host(kMiB, MemCategory::other, /*pinned=*/true);
      out["device"] = "succeeded";
    } catch (const zero::OutOfMemory& e) {
      out["device"] = e.what();
    }

    // Freeing gives the locked quota back (munlock/munmap): 200 x 32 KiB under a 64 KiB limit.
    int pinned_rounds = 0;
    for (int i = 0; i < 200; ++i) {
      HostBuffer t = required.allocate(32 << 10, MemCategory::comm_buffers);
      pinned_rounds += t.pinned();
    }
    out["pinned_rounds"] = std::to_string(pinned_rounds);

    // Without a sink the warning is printed on this rank's stdout.
    std::FILE* capture = std::tmpfile();
    std::fflush(stdout);
    const int saved = dup(1);
    dup2(fileno(capture), 1);
    {
      HostMemory quiet(*dev);
      HostBuffer c = quiet.allocate(kMiB, MemCategory::parameters);
      HostBuffer d = quiet.allocate(kMiB, MemCategory::parameters);
    }
    std::fflush(stdout);
    dup2(saved, 1);
    close(saved);
    std::string printed;
    std::rewind(capture);
    for (int ch; (ch = std::fgetc(capture)) != EOF;) printed += static_cast<char>(ch);
    std::fclose(capture);
    out["printed"] = printed;
  });

  if (f.count("skip")) SKIP(f.at("skip"));
  REQUIRE_FALSE(f.count("exception"));
  CHECK(f.at("a_pinned") == "0");
  CHECK(f.at("b_pinned") == "0");
  CHECK(f.at("small_pinned") == "1");  // 4 KiB fits under the 64 KiB limit: pinning is retried
  CHECK(f.at("warnings") == "1");
  CHECK(f.at("fallbacks") == "2");
  CHECK(f.at("pinned_bytes") == "4096");
  CHECK(f.at("unpinned_bytes") == std::to_string(2 * kMiB));
  CHECK(f.at("ledger_host") == std::to_string(2 * kMiB + 4096));
  CHECK(f.at("ledger_states") == std::to_string(kMiB));
  CHECK_THAT(f.at("summary"), ContainsSubstring("2 allocations fell back to pageable memory"));
  // The warning names the bytes, the device, the limit and what to do.
  const std::string& w = f.at("warning");
  CHECK_THAT(w, ContainsSubstring("pinning 1.00 MiB of host memory for optimizer states failed "
                                  "on cpu:0"));
  CHECK_THAT(w, ContainsSubstring("RLIMIT_MEMLOCK") && ContainsSubstring("`ulimit -l`") &&
                    ContainsSubstring("is 64.00 KiB"));
  CHECK_THAT(w, ContainsSubstring("using pageable memory instead") &&
                    ContainsSubstring("HINT: raise the limit"));

  CHECK(f.at("required") == "Error");
  CHECK_THAT(f.at("required_message"),
             ContainsSubstring("pinning 1.00 MiB of host memory for parameters failed on cpu:0") &&
                 ContainsSubstring("RLIMIT_MEMLOCK") && ContainsSubstring("HINT"));
  CHECK(f.at("required_leak") == "0");
  CHECK_THAT(f.at("device"), ContainsSubstring("out of host memory on cpu:0") &&
                                 ContainsSubstring("pinning host memory failed"));
  CHECK(f.at("pinned_rounds") == "200");
  // Printed once for two refusals, as a warning line.
  const std::string& printed = f.at("printed");
  CHECK_THAT(printed, ContainsSubstring("warning: pinning 1.00 MiB of host memory for parameters"));
  CHECK(printed.find("warning:") == printed.rfind("warning:"));
}
