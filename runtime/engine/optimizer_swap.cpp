#include "runtime/engine/optimizer_swap.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "core/error.hpp"
#include "runtime/engine/context.hpp"

namespace zero::engine {

namespace {

// The sub-group the AdamW task running on this thread works on: set by the task around `adam`,
// so that state() called from inside it (OptimizerStep::adam_group) finds the slot.
thread_local const OptimizerSwap* tl_swap = nullptr;
thread_local int tl_group = -1;
thread_local int64_t tl_lo = -1;
thread_local unsigned char* tl_slot = nullptr;

int64_t ns_since(double t0) { return static_cast<int64_t>((now_seconds() - t0) * 1e9); }

}  // namespace

struct OptimizerSwap::Times {
  std::atomic<int64_t> io_ns{0};       // reads and writes, wherever they ran (overlaps summed)
  std::atomic<int64_t> exposed_ns{0};  // the optimizer thread waiting for a read or doing I/O
  // Wall time with at least one read or write in flight (overlapping ones counted once).
  std::mutex mu;
  int in_flight = 0;
  double busy_since = 0;
  int64_t busy_ns = 0;
  void begin() {
    std::lock_guard lock(mu);
    if (in_flight++ == 0) busy_since = now_seconds();
  }
  void end() {
    std::lock_guard lock(mu);
    if (--in_flight == 0) busy_ns += ns_since(busy_since);
  }
};

OptimizerSwap::OptimizerSwap(const NvmeOptimizerOptions& o, int rank, const std::vector<int64_t>& numel,
                             offload::HostMemory& memory, offload::SwapStore* shared)
    : o_(o), ledger_(memory.device().ledger()), times_(std::make_unique<Times>()) {
  ZERO_REQUIRE(o_.buffer_count >= 1,
               "zero_optimization.offload_optimizer.buffer_count is " + std::to_string(o_.buffer_count) +
                   ": NVMe offload needs at least 1 swap buffer (2 or more to overlap I/O with AdamW)");
  ZERO_REQUIRE(o_.sub_group_size >= 1, "zero_optimization.sub_group_size is " +
                                           std::to_string(o_.sub_group_size) + ": it must be at least 1");
  const int G = static_cast<int>(numel.size());
  for (int g = 0; g < G; ++g) {
    first_unit_.push_back(units_.size());
    const std::vector<int64_t> sizes = cut(numel[static_cast<size_t>(g)], o_.sub_group_size);
    for (size_t j = 0; j < sizes.size(); ++j) {
      Unit un;
      un.group = g;
      un.lo = static_cast<int64_t>(j) * o_.sub_group_size;
      un.n = sizes[j];
      un.file = "opt-g" + std::to_string(g) + (sizes.size() > 1 ? "." + std::to_string(j) : "");
      units_.push_back(un);
    }
  }
  first_unit_.push_back(units_.size());
  if (shared != nullptr) {
    store_ = shared;
  } else {
    engine_ = std::make_unique<offload::AioEngine>(o_.aio);
    own_store_ = std::make_unique<offload::SwapStore>(*engine_, o_.path, rank);
    store_ = own_store_.get();
  }
  const size_t U = units_.size();
  size_t largest = offload::kAioAlignment;
  for (size_t u = 0; u < U; ++u) largest = std::max(largest, unit_bytes(u));
  for (int s = 0; s < o_.buffer_count; ++s) {
    slots_.push_back(memory.allocate(largest, MemCategory::optimizer_states));
    slot_free_.push_back(make_cpu_event());
  }
  access_ = memory.allocate(largest, MemCategory::optimizer_states);
  buffer_bytes_ = largest * (slots_.size() + 1);
  // Fresh state is zeros (m and v; the master is written by the engine's set-up).
  std::memset(access_.data(), 0, access_.bytes());
  size_t master = 0, moments = 0;
  for (size_t u = 0; u < U; ++u) {
    read_done_.push_back(make_cpu_event());
    written_.push_back(make_cpu_event());
    if (units_[u].n == 0) continue;  // nothing of the group is this rank's
    store_->create(units_[u].file, unit_bytes(u));
    write_now(u, access_.data());
    master += segment(u);
    moments += 2 * segment(u);
  }
  // The files in the ledger (the drive has no capacity there unless someone set one: the space
  // was reserved on the drive itself already, so a refusal only leaves the files uncounted).
  if (ledger_.try_reserve(MemSpace::nvme, MemCategory::master_weights, master)) ledger_master_ = master;
  if (ledger_.try_reserve(MemSpace::nvme, MemCategory::optimizer_states, moments)) ledger_moments_ = moments;
  prefetched_.assign(U, -1);
  reader_ = make_cpu_stream("nvme-reader");
  writer_ = make_cpu_stream("nvme-writer");
}

std::vector<int64_t> OptimizerSwap::cut(int64_t numel, int64_t sub_group_size) {
  std::vector<int64_t> sizes;
  for (int64_t lo = 0; lo < numel; lo += sub_group_size) sizes.push_back(std::min(sub_group_size, numel - lo));
  if (sizes.empty()) sizes.push_back(0);
  return sizes;
}

OptimizerSwap::~OptimizerSwap() {
  quiesce();
  ledger_.release(MemSpace::nvme, MemCategory::master_weights, ledger_master_);
  ledger_.release(MemSpace::nvme, MemCategory::optimizer_states, ledger_moments_);
}

// One synchronous request of sub-group u's file, timed (io and busy seconds) and counted in
// `moved` once it completed.
template <class Submit>
void OptimizerSwap::timed(size_t u, std::atomic<uint64_t>& moved, Submit&& submit) {
  if (units_[u].n == 0) return;
  const double t0 = now_seconds();
  times_->begin();
  try {
    store_->engine().wait(submit());
  } catch (...) {
    times_->end();
    throw;
  }
  moved += unit_bytes(u);
  times_->end();
  times_->io_ns += ns_since(t0);
}

void OptimizerSwap::read_now(size_t u, void* buffer) {
  timed(u, read_bytes_, [&] { return store_->read(units_[u].file, buffer); });
}

void OptimizerSwap::write_now(size_t u, const void* buffer) {
  timed(u, written_bytes_, [&] { return store_->write(units_[u].file, buffer); });
}

void OptimizerSwap::read_ahead(size_t u, size_t s) {
  unsigned char* slot = static_cast<unsigned char*>(slots_[s].data());
  reader_->wait(*slot_free_[s]);
  reader_->wait(*written_[u]);
  reader_->launch_host([this, u, slot] { read_now(u, slot); });
  reader_->record(*read_done_[u]);
}

void OptimizerSwap::prefetch() {
  flush();
  std::fill(prefetched_.begin(), prefetched_.end(), -1);
  if (!o_.pipeline_read) return;
  const size_t B = slots_.size();
  for (size_t i = 0; i < B && i < prefetched_.size(); ++i) {
    const size_t s = (next_slot_ + i) % B;
    read_ahead(i, s);
    prefetched_[i] = static_cast<int>(s);
  }
}

void OptimizerSwap::schedule(int g, Stream& optimizer, Event* adam_after, Adam adam, Event& adam_done) {
  flush();  // a sub-group changed between steps is on the drive before any step reads it
  if (adam_after) optimizer.wait(*adam_after);
  for (size_t u = first_unit_[static_cast<size_t>(g)]; u < first_unit_[static_cast<size_t>(g) + 1]; ++u) {
    const size_t s = next_slot_;
    next_slot_ = (next_slot_ + 1) % slots_.size();
    unsigned char* slot = static_cast<unsigned char*>(slots_[s].data());
    Event& free = *slot_free_[s];
    Event& read = *read_done_[u];
    // u's file is read once u's last write-back (the previous step's, through whichever slot)
    // is done, and the slot once its last sub-group's write-back is.
    Event& written = *written_[u];
    if (o_.pipeline_read) {
      const bool ready = prefetched_[u] == static_cast<int>(s);
      prefetched_[u] = -1;
      if (!ready) read_ahead(u, s);
    } else {
      optimizer.wait(free);
      optimizer.wait(written);
    }
    optimizer.launch_host([this, u, slot, &read, adam] {
      // The read, waited for (pipelined) or done here: the optimizer thread's I/O not hidden.
      const double t0 = now_seconds();
      if (o_.pipeline_read) read.synchronize();
      else read_now(u, slot);
      times_->exposed_ns += ns_since(t0);
      tl_swap = this;
      tl_group = units_[u].group;
      tl_lo = units_[u].lo;
      tl_slot = slot;
      try {
        adam(units_[u].lo, units_[u].n);
      } catch (...) {
        tl_swap = nullptr;
        throw;
      }
      tl_swap = nullptr;
    });
    optimizer.record(adam_done);  // the last record (the last sub-group's) is what waits see
    if (o_.pipeline_write) {
      writer_->wait(adam_done);
      writer_->launch_host([this, u, slot] { write_now(u, slot); });
      writer_->record(free);
      writer_->record(written);
    } else {
      optimizer.launch_host([this, u, slot] {
        const double t0 = now_seconds();
        write_now(u, slot);
        times_->exposed_ns += ns_since(t0);
      });
      optimizer.record(free);
      optimizer.record(written);
    }
  }
}

float* OptimizerSwap::state(int g, int k, int64_t lo) const {
  ZERO_REQUIRE(tl_swap == this && tl_group == g && tl_lo == lo,
               "OptimizerSwap::state: group " + std::to_string(g) + " from element " + std::to_string(lo) +
                   " is not the sub-group of the AdamW task running here (between steps use read_state / write_state)");
  const size_t u = unit_at(g, lo);
  return reinterpret_cast<float*>(tl_slot + static_cast<size_t>(k) * segment(u));
}

size_t OptimizerSwap::unit_at(int g, int64_t off) const {
  const size_t first = first_unit_[static_cast<size_t>(g)];
  return first + static_cast<size_t>(off / o_.sub_group_size);
}

unsigned char* OptimizerSwap::access(size_t u) {
  if (access_unit_ != static_cast<int64_t>(u)) {
    flush();
    read_now(u, access_.data());
    access_unit_ = static_cast<int64_t>(u);
  }
  return static_cast<unsigned char*>(access_.data());
}

// copy(pointer into the access buffer, index into the caller's range, count) for each sub-group
// piece of g's array k over [off, off + n).
template <class Copy>
void OptimizerSwap::access_range(int g, int k, int64_t off, int64_t n, Copy&& copy) {
  const size_t end = first_unit_[static_cast<size_t>(g) + 1];
  for (int64_t done = 0; done < n;) {
    const size_t u = unit_at(g, off + done);
    ZERO_REQUIRE(u < end && off + done - units_[u].lo < units_[u].n,
                 "OptimizerSwap: elements [" + std::to_string(off) + ", " + std::to_string(off + n) +
                     ") are outside group " + std::to_string(g) + "'s owned range");
    const int64_t at = off + done - units_[u].lo;
    const int64_t count = std::min(n - done, units_[u].n - at);
    float* base = reinterpret_cast<float*>(access(u) + static_cast<size_t>(k) * segment(u));
    copy(base + at, done, count);
    done += count;
  }
}

void OptimizerSwap::read_state(int g, int k, int64_t off, float* dst, int64_t n) {
  access_range(g, k, off, n, [&](const float* p, int64_t i, int64_t c) {
    std::memcpy(dst + i, p, static_cast<size_t>(c) * 4);
  });
}

void OptimizerSwap::write_state(int g, int k, int64_t off, const float* src, int64_t n) {
  access_range(g, k, off, n, [&](float* p, int64_t i, int64_t c) {
    if (src) std::memcpy(p, src + i, static_cast<size_t>(c) * 4);
    else std::memset(p, 0, static_cast<size_t>(c) * 4);
  });
}

void OptimizerSwap::flush() {
  if (access_unit_ < 0) return;
  // Always written back: the access path does not track whether the sub-group changed.
  write_now(static_cast<size_t>(access_unit_), access_.data());
  access_unit_ = -1;
}
void OptimizerSwap::sync() {
  reader_->synchronize();
  writer_->synchronize();
}

void OptimizerSwap::quiesce() noexcept {
  if (reader_) try { reader_->synchronize(); } catch (...) {}
  if (writer_) try { writer_->synchronize(); } catch (...) {}
}

double OptimizerSwap::io_seconds() const { return static_cast<double>(times_->io_ns.load()) * 1e-9; }
double OptimizerSwap::io_busy_seconds() const {
  std::lock_guard lock(times_->mu);
  return static_cast<double>(times_->busy_ns) * 1e-9;
}
double OptimizerSwap::io_exposed_seconds() const { return static_cast<double>(times_->exposed_ns.load()) * 1e-9; }

}  // namespace zero::engine
