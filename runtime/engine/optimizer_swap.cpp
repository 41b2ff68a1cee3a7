#include "runtime/engine/optimizer_swap.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

#include "core/error.hpp"
#include "runtime/engine/context.hpp"

namespace zero::engine {

namespace {

// The slot the AdamW task running on this thread works on: set by the task around `adam`, so
// that state() called from inside it (OptimizerStep::adam_group) finds the slot.
thread_local const OptimizerSwap* tl_swap = nullptr;
thread_local int tl_group = -1;
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
    : o_(o), numel_(numel), ledger_(memory.device().ledger()), times_(std::make_unique<Times>()) {
  ZERO_REQUIRE(o_.buffer_count >= 1,
               "zero_optimization.offload_optimizer.buffer_count is " + std::to_string(o_.buffer_count) +
                   ": NVMe offload needs at least 1 swap buffer (2 or more to overlap I/O with AdamW)");
  if (shared != nullptr) {
    store_ = shared;
  } else {
    engine_ = std::make_unique<offload::AioEngine>(o_.aio);
    own_store_ = std::make_unique<offload::SwapStore>(*engine_, o_.path, rank);
    store_ = own_store_.get();
  }
  const int G = static_cast<int>(numel_.size());
  size_t largest = 0;
  for (int g = 0; g < G; ++g) largest = std::max(largest, group_bytes(g));
  largest = std::max(largest, offload::kAioAlignment);
  for (int s = 0; s < o_.buffer_count; ++s) {
    slots_.push_back(memory.allocate(largest, MemCategory::optimizer_states));
    slot_free_.push_back(make_cpu_event());
  }
  access_ = memory.allocate(largest, MemCategory::optimizer_states);
  buffer_bytes_ = largest * (slots_.size() + 1);
  // Fresh state is zeros (m and v; the master is written by the engine's set-up).
  std::memset(access_.data(), 0, access_.bytes());
  for (int g = 0; g < G; ++g) {
    read_done_.push_back(make_cpu_event());
    written_.push_back(make_cpu_event());
    if (numel_[static_cast<size_t>(g)] == 0) continue;  // nothing of g is this rank's
    store_->create(file_name(g), group_bytes(g));
    write_now(g, access_.data());
  }
  // The files in the ledger (the drive has no capacity there unless someone set one: the space
  // was reserved on the drive itself already, so a refusal only leaves the files uncounted).
  size_t master = 0, moments = 0;
  for (int g = 0; g < G; ++g)
    if (numel_[static_cast<size_t>(g)] > 0) {
      master += segment(g);
      moments += 2 * segment(g);
    }
  if (ledger_.try_reserve(MemSpace::nvme, MemCategory::master_weights, master)) ledger_master_ = master;
  if (ledger_.try_reserve(MemSpace::nvme, MemCategory::optimizer_states, moments)) ledger_moments_ = moments;
  prefetched_.assign(static_cast<size_t>(G), -1);
  reader_ = make_cpu_stream("nvme-reader");
  writer_ = make_cpu_stream("nvme-writer");
}

OptimizerSwap::~OptimizerSwap() {
  quiesce();
  ledger_.release(MemSpace::nvme, MemCategory::master_weights, ledger_master_);
  ledger_.release(MemSpace::nvme, MemCategory::optimizer_states, ledger_moments_);
}

// One synchronous request of group g's file, timed (io and busy seconds) and counted in `moved`
// once it completed.
template <class Submit>
void OptimizerSwap::timed(int g, std::atomic<uint64_t>& moved, Submit&& submit) {
  if (numel_[static_cast<size_t>(g)] == 0) return;
  const double t0 = now_seconds();
  times_->begin();
  try {
    store_->engine().wait(submit());
  } catch (...) {
    times_->end();
    throw;
  }
  moved += group_bytes(g);
  times_->end();
  times_->io_ns += ns_since(t0);
}

void OptimizerSwap::read_now(int g, void* buffer) {
  timed(g, read_bytes_, [&] { return store_->read(file_name(g), buffer); });
}

void OptimizerSwap::write_now(int g, const void* buffer) {
  timed(g, written_bytes_, [&] { return store_->write(file_name(g), buffer); });
}

void OptimizerSwap::read_ahead(int g, size_t s) {
  unsigned char* slot = static_cast<unsigned char*>(slots_[s].data());
  reader_->wait(*slot_free_[s]);
  reader_->wait(*written_[static_cast<size_t>(g)]);
  reader_->launch_host([this, g, slot] { read_now(g, slot); });
  reader_->record(*read_done_[static_cast<size_t>(g)]);
}

void OptimizerSwap::prefetch() {
  flush();
  std::fill(prefetched_.begin(), prefetched_.end(), -1);
  if (!o_.pipeline_read) return;
  const size_t B = slots_.size();
  for (size_t i = 0; i < B && i < prefetched_.size(); ++i) {
    const size_t s = (next_slot_ + i) % B;
    read_ahead(static_cast<int>(i), s);
    prefetched_[i] = static_cast<int>(s);
  }
}

void OptimizerSwap::schedule(int g, Stream& optimizer, Event* adam_after, std::function<void()> adam,
                             Event& adam_done) {
  flush();  // a group changed between steps is on the drive before any step reads it
  const size_t s = next_slot_;
  next_slot_ = (next_slot_ + 1) % slots_.size();
  unsigned char* slot = static_cast<unsigned char*>(slots_[s].data());
  Event& free = *slot_free_[s];
  Event& read = *read_done_[static_cast<size_t>(g)];
  // g's file is read once g's last write-back (the previous step's, through whichever slot) is
  // done, and the slot once its last group's write-back is.
  Event& written = *written_[static_cast<size_t>(g)];
  if (o_.pipeline_read) {
    const bool ready = prefetched_[static_cast<size_t>(g)] == static_cast<int>(s);
    prefetched_[static_cast<size_t>(g)] = -1;
    if (!ready) read_ahead(g, s);
  } else {
    optimizer.wait(free);
    optimizer.wait(written);
  }
  if (adam_after) optimizer.wait(*adam_after);
  optimizer.launch_host([this, g, slot, &read, adam = std::move(adam)] {
    // The read, waited for (pipelined) or done here: the optimizer thread's I/O not hidden.
    const double t0 = now_seconds();
    if (o_.pipeline_read) read.synchronize();
    else read_now(g, slot);
    times_->exposed_ns += ns_since(t0);
    tl_swap = this;
    tl_group = g;
    tl_slot = slot;
    try {
      adam();
    } catch (...) {
      tl_swap = nullptr;
      throw;
    }
    tl_swap = nullptr;
  });
  optimizer.record(adam_done);
  if (o_.pipeline_write) {
    writer_->wait(adam_done);
    writer_->launch_host([this, g, slot] { write_now(g, slot); });
    writer_->record(free);
    writer_->record(written);
  } else {
    optimizer.launch_host([this, g, slot] {
      const double t0 = now_seconds();
      write_now(g, slot);
      times_->exposed_ns += ns_since(t0);
    });
    optimizer.record(free);
    optimizer.record(written);
  }
}

float* OptimizerSwap::state(int g, int k) {
  const size_t off = static_cast<size_t>(k) * segment(g);
  if (tl_swap == this && tl_group == g) return reinterpret_cast<float*>(tl_slot + off);
  // Between steps, on the driving thread: g in the access buffer.
  if (access_group_ != g) {
    flush();
    read_now(g, access_.data());
    access_group_ = g;
  }
  return reinterpret_cast<float*>(static_cast<unsigned char*>(access_.data()) + off);
}

void OptimizerSwap::flush() {
  if (access_group_ < 0) return;
  // Always written back: the access path cannot tell a read from a write through the pointer.
  write_now(access_group_, access_.data());
  access_group_ = -1;
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
