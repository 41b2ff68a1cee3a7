#include "offload/host_memory.hpp"

#include <sys/resource.h>

#include <fstream>
#include <sstream>

#include "core/log.hpp"

namespace zero::offload {

namespace {

// "unlimited" or the soft RLIMIT_MEMLOCK in bytes; "unknown" if getrlimit fails.
std::string memlock_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_MEMLOCK, &r) != 0) return "unknown";
  if (r.rlim_cur == RLIM_INFINITY) return "unlimited";
  return format_bytes(static_cast<size_t>(r.rlim_cur));
}

// This process's locked memory (VmLck in /proc/self/status); nullopt where it cannot be read.
std::optional<size_t> locked_now() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) != 0) continue;
    std::istringstream in(line.substr(6));
    size_t kib = 0;
    if (in >> kib) return kib * 1024;
  }
  return std::nullopt;
}

// A pinned allocate_host that threw OutOfMemory was refused either by the ledger (over the host
// capacity: the caller must see that error as it is) or by the pinning allocator. The error's
// snapshot, taken after the refused bytes were handed back, tells which: if the request fits
// under the capacity, the ledger did not refuse it.
bool pinning_refused(const OutOfMemory& e, size_t bytes) {
  const LedgerSnapshot& s = e.snapshot();
  const int host = static_cast<int>(MemSpace::host);
  const size_t cap = s.capacity[host];
  const size_t used = s.total[host].current;
  return used <= cap && cap - used >= bytes;
}

}  // namespace

std::string_view to_string(PinPolicy p) noexcept {
  switch (p) {
    case PinPolicy::required: return "required";
    case PinPolicy::preferred: return "preferred";
    case PinPolicy::off: return "off";
  }
  return "?";
}

std::optional<PinPolicy> parse_pin_policy(std::string_view text) noexcept {
  for (PinPolicy p : {PinPolicy::required, PinPolicy::preferred, PinPolicy::off})
    if (text == to_string(p)) return p;
  return std::nullopt;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    buffer_ = std::move(other.buffer_);
    owner_ = other.owner_;
    other.owner_ = nullptr;
  }
  return *this;
}

void HostBuffer::reset() noexcept {
  if (owner_) owner_->returned(buffer_);
  owner_ = nullptr;
  buffer_.reset();
}

HostMemory::HostMemory(Device& device, HostMemoryOptions options)
    : device_(device), policy_(options.pin), on_warning_(std::move(options.on_warning)) {}

void HostMemory::returned(const Buffer& b) noexcept {
  (b.pinned() ? pinned_ : unpinned_) -= b.bytes();
}

std::string HostMemory::pin_failure_message(size_t bytes, MemCategory category) const {
  std::string why;
  if (device_.kind() == DeviceKind::cpu) {
    why = "mlock(2) refused it; the locked-memory limit RLIMIT_MEMLOCK (`ulimit -l`) is " +
          memlock_limit();
    if (auto locked = locked_now())
      why += " and this process has " + format_bytes(*locked) + " locked already";
  } else {
    why = "cudaHostAlloc refused it; the host may be short of free memory, or the locked-memory "
          "limit RLIMIT_MEMLOCK (`ulimit -l`, now " +
          memlock_limit() + ") too low";
  }
  return "pinning " + format_bytes(bytes) + " of host memory for " +
         std::string(to_string(category)) + " failed on " + device_.name() + ": " + why;
}

HostBuffer HostMemory::allocate(size_t bytes, MemCategory category) {
  HostBuffer out;
  if (policy_ == PinPolicy::off) {
    out.buffer_ = device_.allocate_host(bytes, category, /*pinned=*/false);
  } else {
    try {
      out.buffer_ = device_.allocate_host(bytes, category, /*pinned=*/true);
    } catch (const OutOfMemory& e) {
      if (!pinning_refused(e, bytes)) throw;  // over the host capacity: the ledger's error
      const std::string what = pin_failure_message(bytes, category);
      const char* raise =
          "raise the limit (`ulimit -l unlimited` before the launch, a memlock line in "
          "/etc/security/limits.conf, or `--ulimit memlock=-1` for a container)";
      if (policy_ == PinPolicy::required)
        ZERO_FAIL(what + "\nHINT: " + raise +
                  ", or let it fall back to pageable memory (pin policy 'preferred')");
      ++fallbacks_;
      std::call_once(warned_, [&] {
        const std::string line =
            what + "; using pageable memory instead (this warning is shown once): copies of it "
                   "go through pinned staging buffers and are slower. HINT: " +
            raise + ", or set the pin policy to 'off' to use pageable memory without a warning";
        if (on_warning_)
          on_warning_(line);
        else
          log::rank_info("warning: " + line);
      });
      out.buffer_ = device_.allocate_host(bytes, category, /*pinned=*/false);
    }
  }
  out.owner_ = this;
  (out.buffer_.pinned() ? pinned_ : unpinned_) += out.buffer_.bytes();
  return out;
}

std::string HostMemory::summary() const {
  std::string s = "host memory of " + device_.name() + ": " + format_bytes(pinned_bytes()) +
                  " pinned, " + format_bytes(unpinned_bytes()) + " pageable (pinning " +
                  std::string(to_string(policy_)) + ")";
  if (const size_t n = fallbacks())
    s += ", " + std::to_string(n) + (n == 1 ? " allocation" : " allocations") +
         " fell back to pageable memory";
  return s;
}

}  // namespace zero::offload
