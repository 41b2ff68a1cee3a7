// Bucketing of reduce-scatters and all-gathers; the layouts are drawn in bucketer.hpp.
#include "collectives/bucketer.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "core/error.hpp"

namespace zero::coll {

namespace {

size_t round_up(size_t n, size_t unit) noexcept { return (n + unit - 1) / unit * unit; }

// The first 128-byte boundary at or after p.
char* align_up(void* p) noexcept {
  const auto u = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<char*>((u + kBucketAlignBytes - 1) / kBucketAlignBytes *
                                 kBucketAlignBytes);
}

// One allocation for the whole pool: `slots` slots of `slot_bytes`, plus slack to start the
// first slot on a 128-byte boundary (Device::allocate promises less: 64 bytes on cpu).
Buffer allocate_pool(Device& device, int slots, size_t slot_bytes, const char* what) {
  const size_t n = static_cast<size_t>(slots);
  ZERO_REQUIRE(slot_bytes <= (SIZE_MAX - kBucketAlignBytes) / n,
               std::string(what) + ": a pool of " + std::to_string(n) + " buckets of " +
                   std::to_string(slot_bytes) + " bytes overflows size_t");
  return device.allocate(n * slot_bytes + kBucketAlignBytes, MemCategory::comm_buffers);
}

void check_setup(const Communicator& comm, const Device& device, size_t bucket_elems,
                 int pool_size, const char* what) {
  ZERO_REQUIRE(bucket_elems >= 1, std::string(what) + ": the bucket size must be at least 1 "
                                  "element\nHINT: check reduce_bucket_size / allgather_bucket_size");
  ZERO_REQUIRE(pool_size >= 1, std::string(what) + ": the buffer pool needs at least 1 bucket, "
                               "got " + std::to_string(pool_size));
  ZERO_REQUIRE(comm.kind() == device.kind(),
               std::string(what) + ": the communicator works on " +
                   std::string(to_string(comm.kind())) + " buffers but the device is " +
                   device.name() + "\nHINT: use the MPI communicator with a cpu device and NCCL "
                   "with a cuda device (make_communicator picks it)");
}

}  // namespace

// ---- layout arithmetic --------------------------------------------------------------------------

size_t bucket_padding(size_t len, int world, DType dtype) noexcept {
  const size_t unit = static_cast<size_t>(world) * align_elems(dtype);
  return round_up(len, unit) - len;
}

size_t reduce_bucket_capacity(size_t bucket_elems, int world, DType dtype) noexcept {
  return bucket_elems + bucket_padding(bucket_elems, world, dtype);
}

size_t gather_bucket_capacity(size_t bucket_elems, int world, DType dtype) noexcept {
  const size_t w = static_cast<size_t>(world);
  return round_up((bucket_elems + w - 1) / w, align_elems(dtype));
}

std::vector<SliceRange> slice_ranges(std::span<const BucketEntry> entries, size_t slice_begin,
                                     size_t slice_len) {
  const size_t slice_end = slice_begin + slice_len;
  std::vector<SliceRange> out;
  for (const BucketEntry& e : entries) {
    if (e.bucket_offset >= slice_end) break;  // sorted: nothing later reaches the slice
    const size_t lo = std::max(e.bucket_offset, slice_begin);
    const size_t hi = std::min(e.bucket_offset + e.length, slice_end);
    if (lo >= hi) continue;
    out.push_back({e.tensor_id, e.tensor_offset + (lo - e.bucket_offset), lo - slice_begin,
                   hi - lo});
  }
  return out;
}

BucketEntry next_piece(size_t tensor_id, size_t tensor_offset, size_t remaining, size_t fill,
                       size_t capacity) noexcept {
  return {tensor_id, tensor_offset, fill, std::min(remaining, capacity - fill)};
}

std::vector<std::vector<BucketEntry>> plan_buckets(std::span<const TensorExtent> tensors,
                                                   size_t capacity) {
  ZERO_REQUIRE(capacity >= 1, "plan_buckets: the capacity must be at least 1 element");
  std::vector<std::vector<BucketEntry>> buckets;
  std::vector<BucketEntry> open;
  size_t fill = 0;
  for (const TensorExtent& t : tensors) {
    for (size_t off = 0; off < t.count;) {
      const BucketEntry e = next_piece(t.tensor_id, off, t.count - off, fill, capacity);
      open.push_back(e);
      fill += e.length;
      off += e.length;
      if (fill == capacity) {
        buckets.push_back(std::move(open));
        open.clear();
        fill = 0;
      }
    }
  }
  if (!open.empty()) buckets.push_back(std::move(open));
  return buckets;
}

// ---- ReduceScatterBucketer ----------------------------------------------------------------------

ReduceScatterBucketer::ReduceScatterBucketer(Communicator& comm, Device& device, DType dtype,
                                             ReduceOp op, size_t bucket_elems, Callback callback,
                                             int pool_size)
    : comm_(comm), device_(device), dtype_(dtype), op_(op), callback_(std::move(callback)),
      pool_size_(pool_size) {
  check_setup(comm, device, bucket_elems, pool_size, "reduce-scatter bucketer");
  ZERO_REQUIRE(callback_ != nullptr, "reduce-scatter bucketer: a callback is required");
  capacity_ = reduce_bucket_capacity(bucket_elems, comm.size(), dtype);
  slot_bytes_ = capacity_ * size_of(dtype);
  pool_ = allocate_pool(device, pool_size, slot_bytes_, "reduce-scatter bucketer");
  base_ = align_up(pool_.data());
  stream_ = device.create_stream("rs-bucket");
  for (int s = 0; s < pool_size; ++s) free_slots_.push_back(s);
}

ReduceScatterBucketer::~ReduceScatterBucketer() {
  // The collectives still in flight read and write the pool: it must outlive them.
  for (InFlight& f : in_flight_) {
    try {
      f.work.wait();
    } catch (...) {  // reported to whoever waits on the Work; nothing to add here
    }
  }
  try {
    stream_->synchronize();
  } catch (...) {
  }
}

char* ReduceScatterBucketer::slot_data(int slot) const noexcept {
  return base_ + static_cast<size_t>(slot) * slot_bytes_;
}

Work ReduceScatterBucketer::add(size_t tensor_id, const void* data, size_t count, Event* ready) {
  if (count == 0) return Work{};
  ZERO_REQUIRE(data != nullptr, "reduce-scatter bucketer: tensor " + std::to_string(tensor_id) +
                                    " has " + std::to_string(count) + " elements but no data");
  poll();
  // The copies below read `data`: they must not start before its producer has written it.
  if (ready) stream_->wait(*ready);
  const size_t esz = size_of(dtype_);
  const auto* src = static_cast<const char*>(data);
  for (size_t off = 0; off < count;) {
    if (open_slot_ < 0) open_bucket();
    const BucketEntry e = next_piece(tensor_id, off, count - off, fill_, capacity_);
    device_.copy_async(slot_data(open_slot_) + e.bucket_offset * esz, src + off * esz,
                       e.length * esz, *stream_);
    entries_.push_back(e);
    fill_ += e.length;
    off += e.length;
    if (fill_ == capacity_) launch();
  }
  // Protects `data`: the caller may overwrite it once every copy above has run.
  std::shared_ptr<Event> copied = device_.create_event();
  stream_->record(*copied);
  return Work(std::move(copied));
}

void ReduceScatterBucketer::flush() {
  if (open_slot_ >= 0 && fill_ > 0) launch();
}

size_t ReduceScatterBucketer::poll() {
  size_t n = 0;
  while (!in_flight_.empty() && in_flight_.front().work.test()) {
    deliver_oldest();
    ++n;
  }
  return n;
}

void ReduceScatterBucketer::wait() {
  flush();
  while (!in_flight_.empty()) deliver_oldest();
  stream_->synchronize();
}

void ReduceScatterBucketer::open_bucket() {
  // Every buffer in flight: back-pressure, the one place add() blocks.
  if (free_slots_.empty()) deliver_oldest();
  open_slot_ = free_slots_.front();
  free_slots_.pop_front();
  // The slot's previous collective completed before deliver_oldest() returned, and whatever the
  // callback enqueued on stream_ to read it comes before the copies that will refill it.
}

void ReduceScatterBucketer::launch() {
  const size_t esz = size_of(dtype_);
  const int world = comm_.size();
  const size_t padded = fill_ + bucket_padding(fill_, world, dtype_);
  const size_t slice = padded / static_cast<size_t>(world);
  const size_t begin = static_cast<size_t>(comm_.rank()) * slice;
  char* buf = slot_data(open_slot_);
  // The pad takes part in the reduction: zero, it reduces to zero under sum, avg and max.
  device_.fill_async(buf + fill_ * esz, 0, (padded - fill_) * esz, *stream_);
  // Protects the bucket's contents: the collective starts once every copy into it has run.
  std::shared_ptr<Event> filled = device_.create_event();
  stream_->record(*filled);
  // In place: this rank's reduced slice overwrites its own part of the bucket.
  Work work = comm_.reduce_scatter(buf, buf + begin * esz, slice, dtype_, op_, filled.get());

  InFlight f{open_slot_, std::move(work), {}, std::move(filled)};
  f.bucket.index = launched_++;
  f.bucket.ranges = slice_ranges(entries_, begin, slice);
  f.bucket.entries = std::move(entries_);
  f.bucket.data_elems = fill_;
  f.bucket.padded_elems = padded;
  f.bucket.slice_elems = slice;
  f.bucket.slice_begin = begin;
  f.bucket.slice = buf + begin * esz;
  in_flight_.push_back(std::move(f));
  entries_.clear();
  fill_ = 0;
  open_slot_ = -1;
}

void ReduceScatterBucketer::deliver_oldest() {
  ZERO_REQUIRE(!in_flight_.empty(), "reduce-scatter bucketer: no bucket in flight to deliver");
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  free_slots_.push_back(f.slot);
  f.work.wait();  // returns at once when poll() saw it complete; rethrows the collective's error
  callback_(f.bucket, *stream_);
}

// ---- AllGatherBucketer --------------------------------------------------------------------------

AllGatherBucketer::AllGatherBucketer(Communicator& comm, Device& device, DType dtype,
                                     size_t bucket_elems, int pool_size)
    : comm_(comm), device_(device), dtype_(dtype), pool_size_(pool_size) {
  check_setup(comm, device, bucket_elems, pool_size, "all-gather bucketer");
  const size_t world = static_cast<size_t>(comm.size());
  capacity_ = gather_bucket_capacity(bucket_elems, comm.size(), dtype);
  // A world of one gathers in place: the send part is the receive part.
  slot_bytes_ = capacity_ * (world == 1 ? 1 : world + 1) * size_of(dtype);
  pool_ = allocate_pool(device, pool_size, slot_bytes_, "all-gather bucketer");
  base_ = align_up(pool_.data());
  fill_stream_ = device.create_stream("ag-bucket-fill");
  scatter_stream_ = device.create_stream("ag-bucket-scatter");
  slot_free_.resize(static_cast<size_t>(pool_size));
  slot_filled_.resize(static_cast<size_t>(pool_size));
}

AllGatherBucketer::~AllGatherBucketer() {
  // The scatter stream waits for every launched gather: once it drained, no collective touches
  // the pool any more. The fill stream may still be copying into an unlaunched bucket.
  try {
    scatter_stream_->synchronize();
  } catch (...) {  // reported to whoever waits on a gathered() Work
  }
  try {
    fill_stream_->synchronize();
  } catch (...) {
  }
}

char* AllGatherBucketer::send_part(int slot) const noexcept {
  return base_ + static_cast<size_t>(slot) * slot_bytes_;
}

char* AllGatherBucketer::recv_part(int slot) const noexcept {
  return comm_.size() == 1 ? send_part(slot) : send_part(slot) + capacity_ * size_of(dtype_);
}

void AllGatherBucketer::add(size_t tensor_id, const void* my_shard, size_t shard_count,
                            void* full_out, Event* ready) {
  if (shard_count == 0) {
    gathered_[tensor_id] = Work{};  // nothing to gather: complete
    return;
  }
  ZERO_REQUIRE(my_shard != nullptr && full_out != nullptr,
               "all-gather bucketer: tensor " + std::to_string(tensor_id) + " has a shard of " +
                   std::to_string(shard_count) + " elements but a null shard or output");
  // The copies below read the shard: not before its producer (e.g. the optimizer) wrote it.
  if (ready) fill_stream_->wait(*ready);
  const size_t esz = size_of(dtype_);
  const auto* src = static_cast<const char*>(my_shard);
  for (size_t off = 0; off < shard_count;) {
    if (open_slot_ < 0) open_bucket();
    const BucketEntry e = next_piece(tensor_id, off, shard_count - off, fill_, capacity_);
    device_.copy_async(send_part(open_slot_) + e.bucket_offset * esz, src + off * esz,
                       e.length * esz, *fill_stream_);
    fill_ += e.length;
    off += e.length;
    targets_.push_back({e, shard_count, static_cast<char*>(full_out), off == shard_count});
    open_ids_.insert(tensor_id);
    if (fill_ == capacity_) launch();
  }
}

void AllGatherBucketer::flush() {
  if (open_slot_ >= 0 && fill_ > 0) launch();
}

Work AllGatherBucketer::gathered(size_t tensor_id) {
  if (open_ids_.contains(tensor_id)) flush();
  const auto it = gathered_.find(tensor_id);
  ZERO_REQUIRE(it != gathered_.end(), "all-gather bucketer: gathered(" +
                                          std::to_string(tensor_id) +
                                          ") for a tensor that was never added");
  return it->second;
}

void AllGatherBucketer::wait() {
  flush();
  scatter_stream_->synchronize();
}

void AllGatherBucketer::open_bucket() {
  open_slot_ = next_slot_;
  next_slot_ = (next_slot_ + 1) % pool_size_;
  // The slot's previous bucket is still being gathered or scattered until this event: writing
  // its send part earlier would corrupt that gather (no host wait: the fill stream waits).
  if (const auto& free = slot_free_[static_cast<size_t>(open_slot_)]) fill_stream_->wait(*free);
}

void AllGatherBucketer::launch() {
  const size_t esz = size_of(dtype_);
  const size_t world = static_cast<size_t>(comm_.size());
  // Every rank's part of the gathered bucket starts 128-byte aligned.
  const size_t part = fill_ + bucket_padding(fill_, 1, dtype_);
  char* send = send_part(open_slot_);
  char* recv = recv_part(open_slot_);
  const size_t slot = static_cast<size_t>(open_slot_);
  device_.fill_async(send + fill_ * esz, 0, (part - fill_) * esz, *fill_stream_);
  // Protects the send part: the gather starts once every shard has been copied into it.
  slot_filled_[slot] = device_.create_event();
  fill_stream_->record(*slot_filled_[slot]);
  Work work = comm_.all_gather(send, recv, part, dtype_, slot_filled_[slot].get());

  // Scatter [rank 0's part | rank 1's part | ...] into each tensor's full_out, after the gather.
  work.chain(*scatter_stream_);
  for (const Target& t : targets_) {
    const BucketEntry& e = t.entry;
    for (size_t q = 0; q < world; ++q)
      device_.copy_async(t.full_out + (q * t.shard_count + e.tensor_offset) * esz,
                         recv + (q * part + e.bucket_offset) * esz, e.length * esz,
                         *scatter_stream_);
  }
  // Completes the tensors whose last piece this was, and frees the slot for its next bucket.
  std::shared_ptr<Event> scattered = device_.create_event();
  scatter_stream_->record(*scattered);
  for (const Target& t : targets_)
    if (t.last_piece) gathered_[t.entry.tensor_id] = Work(scattered);
  slot_free_[slot] = std::move(scattered);

  targets_.clear();
  open_ids_.clear();
  fill_ = 0;
  open_slot_ = -1;
  ++launched_;
}

}  // namespace zero::coll
