// The memory ledger: every byte a device allocates, by category and by memory space, with
// current and peak figures. For a memory-optimising runtime this table is part of the product:
// it is printed at start-up, in the step log, in every benchmark's JSON and in every
// out-of-memory error.
//
// Two spaces: `device` (the accelerator's memory; for the cpu backend, the memory the cpu
// "device" is allowed) and `host` (host RAM used on the device's behalf: pinned staging buffers,
// offloaded optimizer state). Each space has a capacity; an allocation that would take the
// space's total past it is refused (the caller turns that into an OutOfMemory error).
// A ledger may also have a shared capacity that bounds the two spaces' totals together: on the
// cpu backend device memory and host memory are the same RAM, so one budget (this rank's share
// of the machine's or container's memory) must hold both, not each of them.
//
// Bytes are the sizes callers asked for, not the allocator's rounded-up footprint, so the
// figures compare directly with the ZeRO formulas (16Ψ, 4Ψ + 12Ψ/N, ...).
// Thread-safety: all members may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.hpp"

namespace zero {

enum class MemCategory : uint8_t {
  parameters,        // working (16-bit or fp32) model parameters
  gradients,         // gradient buffers and shard accumulators
  master_weights,    // fp32 master copy of the parameters
  optimizer_states,  // Adam first and second moments
  activations,       // forward activations kept for backward, and their gradients
  comm_buffers,      // buckets and staging for collectives
  pinned_host,       // pinned host staging not covered by a category above
  other,
};
inline constexpr int kMemCategoryCount = 8;
std::string_view to_string(MemCategory c) noexcept;

// nvme: bytes in swap files on a drive (optimizer state on NVMe, docs/nvme-offload.md); no
// capacity by default (the drive's free space is checked when the files are made) and never
// part of the shared capacity, which bounds device + host only.
enum class MemSpace : uint8_t { device, host, nvme };
inline constexpr int kMemSpaceCount = 3;
std::string_view to_string(MemSpace s) noexcept;

inline constexpr size_t kUnlimited = std::numeric_limits<size_t>::max();

struct LedgerEntry {
  size_t current = 0;
  size_t peak = 0;
};

// A consistent copy of the ledger at one moment.
struct LedgerSnapshot {
  std::string owner;  // e.g. "cpu:0" or "cuda:0 (NVIDIA H100 80GB HBM3)"
  std::array<std::array<LedgerEntry, kMemCategoryCount>, kMemSpaceCount> by_category{};
  std::array<LedgerEntry, kMemSpaceCount> total{};  // peak of the sum, not the sum of peaks
  std::array<size_t, kMemSpaceCount> capacity{kUnlimited, kUnlimited, kUnlimited};
  size_t shared_capacity = kUnlimited;  // device + host together; kUnlimited: no such bound

  const LedgerEntry& at(MemSpace s, MemCategory c) const {
    return by_category[static_cast<int>(s)][static_cast<int>(c)];
  }
  // A fixed-width table, one row per category, device and host columns, totals and capacities.
  std::string table() const;
};

class MemoryLedger {
 public:
  MemoryLedger(std::string owner, size_t device_capacity, size_t host_capacity,
               size_t shared_capacity = kUnlimited);

  // Adds `bytes` to (space, category) if the space's total stays within its capacity and the
  // two spaces' totals together within the shared capacity. Returns false, changing nothing, if
  // it would not.
  bool try_reserve(MemSpace space, MemCategory category, size_t bytes);
  void release(MemSpace space, MemCategory category, size_t bytes);

  size_t capacity(MemSpace space) const;
  size_t shared_capacity() const;
  // A new capacity for `space` (e.g. when a library took device memory outside the ledger).
  // Allocations already made stay; the total may then exceed the capacity until they go.
  void set_capacity(MemSpace space, size_t bytes);
  size_t current(MemSpace space) const;
  size_t current(MemSpace space, MemCategory category) const;
  LedgerSnapshot snapshot() const;
  // Peaks restart from the current figures (e.g. after start-up, to measure a step).
  void reset_peaks();

 private:
  mutable std::mutex mutex_;
  LedgerSnapshot state_;
};

// "0 B", "512 B", "1.50 KiB", "3.25 GiB".
std::string format_bytes(size_t bytes);

// "24GiB", "512MiB", "1.5GB", "4096", "1e9": bytes. Units B, kB/KB, MB, GB, TB (powers of 1000)
// and KiB, MiB, GiB, TiB (powers of 1024), case-insensitive; the result must be a whole number
// of bytes. nullopt when the text is not such a size or does not fit in a long long.
std::optional<long long> parse_byte_size(std::string_view text) noexcept;

// An allocation refused for lack of memory. what() carries the ledger table.
class OutOfMemory : public Error {
 public:
  OutOfMemory(std::string message, LedgerSnapshot snapshot);
  const LedgerSnapshot& snapshot() const noexcept { return snapshot_; }

 private:
  LedgerSnapshot snapshot_;
};

}  // namespace zero
