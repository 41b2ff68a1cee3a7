#include "runtime/engine/param_swap.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace zero::engine {

ParamSwap::ParamSwap(offload::SwapStore& store, offload::HostMemory& host, int buffer_count, size_t buffer_bytes)
    : store_(store), ledger_(host.device().ledger()), buffer_bytes_(offload::SwapStore::padded(buffer_bytes)) {
  ZERO_REQUIRE(buffer_count >= 1, "zero_optimization.offload_param.buffer_count is " +
                                      std::to_string(buffer_count) +
                                      ": parameters on NVMe need at least 1 swap buffer");
  bufs_.resize(static_cast<size_t>(buffer_count));
  for (Buffer& b : bufs_) b.mem = host.allocate(buffer_bytes_, MemCategory::parameters);
}

ParamSwap::~ParamSwap() {
  quiesce();
  ledger_.release(MemSpace::nvme, MemCategory::parameters, ledger_bytes_);
}

void ParamSwap::add(int g, size_t bytes) {
  ZERO_REQUIRE(bytes > 0 && offload::SwapStore::padded(bytes) <= buffer_bytes_,
               "engine: group " + std::to_string(g) + "'s parameter shard is " + std::to_string(bytes) +
                   " bytes, larger than an NVMe swap buffer (" + std::to_string(buffer_bytes_) +
                   " bytes): raise zero_optimization.offload_param.buffer_size (elements) to at least "
                   "the largest shard, or spread the model over more ranks");
  if (bytes_.size() <= static_cast<size_t>(g)) bytes_.resize(static_cast<size_t>(g) + 1, 0);
  store_.create(name(g), bytes);
  bytes_[static_cast<size_t>(g)] = bytes;
  // The file, padded, in the ledger's nvme space (which has no capacity: never refused).
  const size_t file = offload::SwapStore::padded(bytes);
  if (ledger_.try_reserve(MemSpace::nvme, MemCategory::parameters, file)) ledger_bytes_ += file;
}

int ParamSwap::find(int g) const {
  for (size_t i = 0; i < bufs_.size(); ++i)
    if (bufs_[i].state != State::free && bufs_[i].group == g) return static_cast<int>(i);
  return -1;
}

void ParamSwap::settle(Buffer& b) {
  if (b.state == State::staged) {  // its bytes reach the drive before anything replaces them
    b.io = store_.write(name(b.group), b.mem.data());
    written_ += offload::SwapStore::padded(bytes_[static_cast<size_t>(b.group)]);
    b.state = State::writing;
  }
  if (b.state == State::reading || b.state == State::writing) {
    const offload::AioHandle h = b.io;
    b.io = {};
    b.state = State::clean;
    try {
      store_.engine().wait(h);
    } catch (...) {
      b.state = State::free;  // what it holds is not to be trusted
      b.group = -1;
      throw;
    }
  }
}

int ParamSwap::take(const std::vector<int>* keep) {
  int best = -1;
  for (size_t i = 0; i < bufs_.size(); ++i) {
    const Buffer& b = bufs_[i];
    if (b.state == State::free) return static_cast<int>(i);
    if (b.held) continue;
    if (keep && std::find(keep->begin(), keep->end(), b.group) != keep->end()) continue;
    if (best < 0 || b.used < bufs_[static_cast<size_t>(best)].used) best = static_cast<int>(i);
  }
  if (best >= 0) {
    Buffer& b = bufs_[static_cast<size_t>(best)];
    settle(b);
    b.state = State::free;
    b.group = -1;
  }
  return best;
}

void ParamSwap::read_ahead(const std::vector<int>& next) {
  for (int g : next) {
    if (!holds(g) || find(g) >= 0) continue;
    const int i = take(&next);
    if (i < 0) return;  // every buffer holds a group needed sooner
    Buffer& b = bufs_[static_cast<size_t>(i)];
    b.io = store_.read(name(g), b.mem.data());
    read_ += offload::SwapStore::padded(bytes_[static_cast<size_t>(g)]);
    b.state = State::reading;
    b.group = g;
    b.used = ++tick_;
  }
}

int ParamSwap::bring(int g, bool count) {
  ZERO_REQUIRE(holds(g), "engine: group " + std::to_string(g) + " has no parameter shard on the drive");
  int i = find(g);
  const bool fresh = i < 0;
  if (fresh) {  // not read ahead: read it now
    i = take(nullptr);
    ZERO_REQUIRE(i >= 0, "engine: every NVMe parameter buffer is held (a ParamSwap misuse)");
    Buffer& b = bufs_[static_cast<size_t>(i)];
    b.io = store_.read(name(g), b.mem.data());
    read_ += offload::SwapStore::padded(bytes_[static_cast<size_t>(g)]);
    b.state = State::reading;
    b.group = g;
  }
  Buffer& b = bufs_[static_cast<size_t>(i)];
  if (count) ++(fresh || (b.state == State::reading && !store_.engine().ready(b.io)) ? waited_uses_ : ready_uses_);
  if (b.state == State::reading) settle(b);  // a writing buffer's bytes are already the new ones
  b.used = ++tick_;
  return i;
}

offload::HostBuffer& ParamSwap::acquire(int g) {
  Buffer& b = bufs_[static_cast<size_t>(bring(g, true))];
  b.held = true;
  return b.mem;
}

void ParamSwap::release(int g) {
  const int i = find(g);
  if (i >= 0) bufs_[static_cast<size_t>(i)].held = false;
}

void ParamSwap::store(int g, const void* src, size_t bytes) {
  ZERO_REQUIRE(holds(g) && bytes <= bytes_[static_cast<size_t>(g)],
               "engine: group " + std::to_string(g) + ": storing " + std::to_string(bytes) +
                   " bytes into its shard on the drive (" + std::to_string(holds(g) ? bytes_[static_cast<size_t>(g)] : 0) +
                   " bytes)");
  // The old copy, if any, is overwritten in its own buffer: a group lives in one buffer only.
  int i = find(g);
  if (i >= 0) {
    Buffer& b = bufs_[static_cast<size_t>(i)];
    if (b.state == State::reading || b.state == State::writing) settle(b);
  } else {
    i = take(nullptr);
    ZERO_REQUIRE(i >= 0, "engine: every NVMe parameter buffer is held (a ParamSwap misuse)");
  }
  Buffer& b = bufs_[static_cast<size_t>(i)];
  // A shard's padding (past `bytes`, up to the file's 4096-byte multiple) is zeros on the drive
  // from its reservation on and stays so.
  std::memcpy(b.mem.data(), src, bytes);
  std::memset(static_cast<unsigned char*>(b.mem.data()) + bytes, 0, offload::SwapStore::padded(bytes_[static_cast<size_t>(g)]) - bytes);
  b.group = g;
  b.io = store_.write(name(g), b.mem.data());
  written_ += offload::SwapStore::padded(bytes_[static_cast<size_t>(g)]);
  b.state = State::writing;
  b.used = ++tick_;
}

unsigned char* ParamSwap::stage(int g) {
  Buffer& b = bufs_[static_cast<size_t>(bring(g, false))];
  if (b.state == State::writing) settle(b);  // no change under a write in flight
  b.state = State::staged;
  return static_cast<unsigned char*>(b.mem.data());
}

void ParamSwap::flush() {
  for (Buffer& b : bufs_) settle(b);
}

void ParamSwap::quiesce() noexcept {
  for (Buffer& b : bufs_)
    if (b.state == State::reading || b.state == State::writing) {
      try { store_.engine().wait(b.io); } catch (...) {}
      b.io = {};
      b.state = State::free;
      b.group = -1;
    }
}

ParamNvmeCounters ParamSwap::counters() const {
  ParamNvmeCounters c;
  for (size_t g = 0; g < bytes_.size(); ++g)
    if (bytes_[g] > 0) c.bytes_on_drive += offload::SwapStore::padded(bytes_[g]);
  c.bytes_read = read_;
  c.bytes_written = written_;
  c.host_buffer_bytes = buffer_bytes_ * bufs_.size();
  c.ready_uses = ready_uses_;
  c.waited_uses = waited_uses_;
  return c;
}

}  // namespace zero::engine
