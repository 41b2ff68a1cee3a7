#include "core/ledger.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace zero {

std::string_view to_string(MemCategory c) noexcept {
  switch (c) {
    case MemCategory::parameters: return "parameters";
    case MemCategory::gradients: return "gradients";
    case MemCategory::master_weights: return "master weights";
    case MemCategory::optimizer_states: return "optimizer states";
    case MemCategory::activations: return "activations";
    case MemCategory::comm_buffers: return "communication buffers";
    case MemCategory::pinned_host: return "pinned host";
    case MemCategory::other: return "other";
  }
  return "?";
}

std::string_view to_string(MemSpace s) noexcept {
  switch (s) {
    case MemSpace::device: return "device";
    case MemSpace::host: return "host";
    case MemSpace::nvme: return "nvme";
  }
  return "?";
}

std::string format_bytes(size_t bytes) {
  if (bytes == kUnlimited) return "unlimited";
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

std::optional<long long> parse_byte_size(std::string_view text) noexcept {
  auto trim = [](std::string_view s) {
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
    return s;
  };
  text = trim(text);
  // The number: digits, '.', an exponent. from_chars does not accept a leading '+'.
  double value = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), value);
  if (r.ec != std::errc{} || !std::isfinite(value) || value < 0) return std::nullopt;
  std::string unit;
  for (char c : trim(std::string_view(r.ptr, text.data() + text.size() - r.ptr)))
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  struct Unit {
    std::string_view name;
    double factor;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},           {"b", 1},
      {"kb", 1e3},       {"mb", 1e6},           {"gb", 1e9},           {"tb", 1e12},
      {"kib", 1024.0},   {"mib", 1048576.0},    {"gib", 1073741824.0}, {"tib", 1099511627776.0},
  };
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    // "0.3MB" is 299999.99999999994 in binary floating point: round, but refuse fractions of
    // a byte that are real ("1.5B").
    const double bytes = value * u.factor;
    const double whole = std::round(bytes);
    if (std::fabs(bytes - whole) > 1e-9 * std::max(1.0, bytes) || whole >= 9.2e18)
      return std::nullopt;
    return static_cast<long long>(whole);
  }
  return std::nullopt;
}

std::string LedgerSnapshot::table() const {
  // The nvme columns only when something was ever on the drive, so runs without NVMe offload
  // print the table they always did.
  const bool nvme = total[2].peak > 0;
  std::string t;
  char line[220];
  std::snprintf(line, sizeof line, "memory ledger of %s\n", owner.c_str());
  t += line;
  std::snprintf(line, sizeof line, "  %-22s %12s %12s %12s %12s", "category", "device now",
                "device peak", "host now", "host peak");
  t += line;
  t += nvme ? "     nvme now    nvme peak\n" : "\n";
  auto row = [&](std::string_view name, int c) {
    const LedgerEntry& d = c < 0 ? total[0] : by_category[0][c];
    const LedgerEntry& h = c < 0 ? total[1] : by_category[1][c];
    const LedgerEntry& n = c < 0 ? total[2] : by_category[2][c];
    std::snprintf(line, sizeof line, "  %-22.*s %12s %12s %12s %12s", static_cast<int>(name.size()),
                  name.data(), format_bytes(d.current).c_str(), format_bytes(d.peak).c_str(),
                  format_bytes(h.current).c_str(), format_bytes(h.peak).c_str());
    t += line;
    if (nvme) {
      std::snprintf(line, sizeof line, " %12s %12s", format_bytes(n.current).c_str(), format_bytes(n.peak).c_str());
      t += line;
    }
    t += "\n";
  };
  for (int c = 0; c < kMemCategoryCount; ++c) row(to_string(static_cast<MemCategory>(c)), c);
  row("total", -1);
  std::snprintf(line, sizeof line, "  %-22s %12s %12s %12s %12s", "capacity",
                format_bytes(capacity[0]).c_str(), "", format_bytes(capacity[1]).c_str(), "");
  t += line;
  if (nvme) {
    std::snprintf(line, sizeof line, " %12s %12s", format_bytes(capacity[2]).c_str(), "");
    t += line;
  }
  t += "\n";
  if (shared_capacity != kUnlimited) {
    std::snprintf(line, sizeof line, "  %-22s %12s for device and host together (in use %s)\n",
                  "shared capacity", format_bytes(shared_capacity).c_str(),
                  format_bytes(total[0].current + total[1].current).c_str());
    t += line;
  }
  return t;
}

MemoryLedger::MemoryLedger(std::string owner, size_t device_capacity, size_t host_capacity,
                           size_t shared_capacity) {
  state_.owner = std::move(owner);
  state_.capacity = {device_capacity, host_capacity, kUnlimited};
  state_.shared_capacity = shared_capacity;
}

bool MemoryLedger::try_reserve(MemSpace space, MemCategory category, size_t bytes) {
  const int s = static_cast<int>(space), c = static_cast<int>(category);
  std::lock_guard lock(mutex_);
  LedgerEntry& total = state_.total[s];
  if (bytes > state_.capacity[s] || total.current > state_.capacity[s] - bytes) return false;
  // The totals count real allocations: their sum does not wrap. The drive is not RAM: the
  // shared capacity bounds device and host only.
  const size_t both = state_.total[0].current + state_.total[1].current;
  if (space != MemSpace::nvme && (bytes > state_.shared_capacity || both > state_.shared_capacity - bytes))
    return false;
  LedgerEntry& e = state_.by_category[s][c];
  e.current += bytes;
  e.peak = std::max(e.peak, e.current);
  total.current += bytes;
  total.peak = std::max(total.peak, total.current);
  return true;
}

void MemoryLedger::release(MemSpace space, MemCategory category, size_t bytes) {
  const int s = static_cast<int>(space), c = static_cast<int>(category);
  std::lock_guard lock(mutex_);
  LedgerEntry& e = state_.by_category[s][c];
  ZERO_REQUIRE(e.current >= bytes && state_.total[s].current >= bytes,
               "memory ledger of " + state_.owner + ": releasing more " +
                   std::string(to_string(category)) + " bytes than were allocated");
  e.current -= bytes;
  state_.total[s].current -= bytes;
}

size_t MemoryLedger::capacity(MemSpace space) const {
  std::lock_guard lock(mutex_);
  return state_.capacity[static_cast<int>(space)];
}

size_t MemoryLedger::shared_capacity() const {
  std::lock_guard lock(mutex_);
  return state_.shared_capacity;
}

void MemoryLedger::set_capacity(MemSpace space, size_t bytes) {
  std::lock_guard lock(mutex_);
  state_.capacity[static_cast<int>(space)] = bytes;
}

size_t MemoryLedger::current(MemSpace space) const {
  std::lock_guard lock(mutex_);
  return state_.total[static_cast<int>(space)].current;
}

size_t MemoryLedger::current(MemSpace space, MemCategory category) const {
  std::lock_guard lock(mutex_);
  return state_.by_category[static_cast<int>(space)][static_cast<int>(category)].current;
}

LedgerSnapshot MemoryLedger::snapshot() const {
  std::lock_guard lock(mutex_);
  return state_;
}

void MemoryLedger::reset_peaks() {
  std::lock_guard lock(mutex_);
  for (auto& space : state_.by_category)
    for (auto& e : space) e.peak = e.current;
  for (auto& e : state_.total) e.peak = e.current;
}

OutOfMemory::OutOfMemory(std::string message, LedgerSnapshot snapshot)
    : Error("zero", message + "\n" + snapshot.table()), snapshot_(std::move(snapshot)) {}

}  // namespace zero
