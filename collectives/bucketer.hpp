// Bucketing: many tensors of any size through few large collectives, with a bounded pool of
// flat buffers, on top of the Communicator API only (the same code drives MPI on host buffers
// and NCCL on device buffers).
//
//   ReduceScatterBucketer  gradients: tensors are appended to a flat bucket as backward produces
//                          them; a full bucket is reduce-scattered at once, and this rank gets
//                          one equal slice of it, described by (tensor, offset, length) ranges.
//   AllGatherBucketer      parameters: this rank's shards of several tensors are coalesced into
//                          one bucket and all-gathered; the result is scattered back into every
//                          tensor's full buffer.
//
// Layout of a reduce-scatter bucket (N ranks; A = elements in 128 bytes: 32 fp32, 64 fp16/bf16):
//
//     bucket  | t3[700, 1000) | t4[0, 250) | t5[0, 90) | zero pad ................ |
//             0               300          550         640 = data_elems           L = padded_elems
//             |<------ rank 0: [0, S) ------>|<----- rank 1: [S, 2S) ----->|  ...  |
//
//   L = data_elems rounded up to a multiple of N*A, S = L / N (a multiple of A, so every slice
//   starts 128-byte aligned and all slices are equal). An entry (tensor, tensor_offset,
//   bucket_offset, length) is one contiguous piece of a tensor; a tensor that does not fit in the
//   space left is split, its remainder opening the next bucket. Rank r's slice [r*S, (r+1)*S)
//   cuts the entries into SliceRanges (tensor, tensor_offset, slice_offset, length); positions
//   of the slice no range covers are padding and reduce to zero. The capacity of a bucket is the
//   configured reduce_bucket_size rounded up to a multiple of N*A, so a full bucket needs no pad.
//
// Layout of an all-gather bucket (C = per-rank capacity, a multiple of A):
//
//     send    | my shard of t1 | my shard of t2[0, k) | zero pad |     B = fill rounded up to A
//     recv    | rank 0's send (B) | rank 1's send (B) | ... | rank N-1's send (B) |
//
//   Tensor t (shard of s elements, full_out = [piece_0 | piece_1 | ... | piece_N-1], s each)
//   with the piece [a, a + len) of its shard at bucket offset o:
//     recv[q*B + o, + len)  ->  full_out_t[q*s + a, + len)    for every rank q.
//   C = allgather_bucket_size / N rounded up to A: the gathered bucket holds about
//   allgather_bucket_size elements (DeepSpeed bounds the gathered size the same way).
//
// The functions below are the one place that knows these offsets; the bucketers and an engine
// that must know in advance which gradient ranges a rank will own (plan_buckets + slice_ranges)
// use the same ones.
//
// Streams and ownership. Each bucketer owns its buffers (one allocation from the Device,
// MemCategory::comm_buffers, made in the constructor and never grown) and a copy stream of its
// own; the Communicator's stream runs the collectives. Copies into a bucket wait for the
// caller's `ready` event on the copy stream; the collective waits for an event recorded after
// the copies; nothing waits on the host except where a call below says it blocks.
// The Communicator and the Device must outlive the bucketer, and be of the same kind (cpu with
// the MPI backend, cuda with NCCL). Buckets are launched only inside add / flush / wait /
// gathered, determined by the sequence of those calls, so ranks that make the same calls launch
// the same collectives in the same order (as the Communicator requires).
//
// Typical use by the engine (stage 2/3 gradients, stage 3 parameters):
//   ReduceScatterBucketer rs(comm, dev, grad_dtype, ReduceOp::avg, cfg.reduce_bucket_size,
//       [&](const ReducedBucket& b, Stream& s) { accumulate b.ranges of b.slice into the fp32
//                                                shard, on s (or on the host for cpu) });
//   after each Unit's backward:  for each gradient g: rs.add(id(g), g.data, g.count, grad_ready);
//   at the end of backward:      rs.wait();   // flush + every callback run
//   AllGatherBucketer ag(comm, dev, param_dtype, cfg.allgather_bucket_size);
//   before a Unit (and its prefetch): for each param p: ag.add(id(p), shard(p), s, full(p), ev);
//   when the Unit runs:          ag.gathered(id(p)).chain(compute_stream);
//
// Thread-safety: a bucketer is used from one thread at a time (its callbacks run on that thread),
// and shares the Communicator's one-thread-at-a-time rule.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "collectives/communicator.hpp"
#include "core/device.hpp"

namespace zero::coll {

// ---- layout arithmetic (pure) -----------------------------------------------------------------

// Slices and bucket parts start on this many bytes.
inline constexpr size_t kBucketAlignBytes = 128;

// A: elements in 128 bytes (32 for fp32, 64 for fp16 / bf16).
constexpr size_t align_elems(DType dtype) noexcept { return kBucketAlignBytes / size_of(dtype); }

// Zero elements to append to `len` so the bucket splits into `world` equal slices of a multiple
// of A elements each. world >= 1.
size_t bucket_padding(size_t len, int world, DType dtype) noexcept;

// Elements of a reduce-scatter bucket holding `bucket_elems` (reduce_bucket_size): rounded up
// to a multiple of world*A. bucket_elems >= 1.
size_t reduce_bucket_capacity(size_t bucket_elems, int world, DType dtype) noexcept;

// Per-rank elements of an all-gather bucket whose gathered size is about `bucket_elems`
// (allgather_bucket_size): ceil(bucket_elems / world) rounded up to a multiple of A.
size_t gather_bucket_capacity(size_t bucket_elems, int world, DType dtype) noexcept;

// One contiguous piece of a tensor inside a bucket.
struct BucketEntry {
  size_t tensor_id = 0;
  size_t tensor_offset = 0;  // first element of the piece within the tensor
  size_t bucket_offset = 0;  // where the piece starts in the bucket (per-rank part for gathers)
  size_t length = 0;         // elements
  friend bool operator==(const BucketEntry&, const BucketEntry&) = default;
};

// The part of a bucket entry that lies in one rank's slice.
struct SliceRange {
  size_t tensor_id = 0;
  size_t tensor_offset = 0;  // first element within the tensor
  size_t slice_offset = 0;   // where it starts within the slice
  size_t length = 0;         // elements
  friend bool operator==(const SliceRange&, const SliceRange&) = default;
};

// The pieces of `entries` (sorted by bucket_offset, not overlapping) that fall in the slice
// [slice_begin, slice_begin + slice_len) of the bucket, in bucket order.
std::vector<SliceRange> slice_ranges(std::span<const BucketEntry> entries, size_t slice_begin,
                                     size_t slice_len);

// The next piece of a tensor in an open bucket that already holds `fill` of `capacity`
// elements: `remaining` elements of tensor `tensor_id` are left, starting at `tensor_offset`.
// The piece is as long as fits (at least 1 when fill < capacity and remaining > 0).
BucketEntry next_piece(size_t tensor_id, size_t tensor_offset, size_t remaining, size_t fill,
                       size_t capacity) noexcept;

struct TensorExtent {
  size_t tensor_id = 0;
  size_t count = 0;  // elements (zero-element tensors take no space and make no entry)
};

// The buckets that adding `tensors` in this order to an empty bucketer of `capacity` elements
// per bucket makes: every bucket but the last is full. Exactly what ReduceScatterBucketer (with
// capacity() as capacity) and AllGatherBucketer (per-rank capacity) do.
std::vector<std::vector<BucketEntry>> plan_buckets(std::span<const TensorExtent> tensors,
                                                   size_t capacity);

// ---- ReduceScatterBucketer ----------------------------------------------------------------------

// One reduced bucket, as the callback sees it.
struct ReducedBucket {
  size_t index = 0;                  // launch order since construction, from 0
  std::vector<BucketEntry> entries;  // the whole bucket's layout, identical on every rank
  size_t data_elems = 0;             // elements carrying tensor data; the rest up to padded is pad
  size_t padded_elems = 0;           // N * slice_elems
  size_t slice_elems = 0;            // elements of every rank's slice (a multiple of A)
  size_t slice_begin = 0;            // rank * slice_elems: where this rank's slice is in the bucket
  const void* slice = nullptr;       // this rank's reduced slice, 128-byte aligned, in the bucket
  std::vector<SliceRange> ranges;    // what the slice holds; positions no range covers are zero
};

class ReduceScatterBucketer {
 public:
  // Called once per bucket, in launch order, on the thread that called add / flush / poll / wait,
  // once the bucket's reduce-scatter has completed on this rank. The slice may be read on the
  // host during the call (cpu device), or by work the callback enqueues on `stream` (the
  // bucketer's copy stream: the buffer is refilled only by work enqueued there after the call
  // returns). Work on any other stream or thread that reads the slice must be finished, or
  // `stream` made to wait for an event recorded after it, before the callback returns.
  // An exception thrown by the callback propagates out of the call that ran it; the bucket
  // counts as delivered.
  using Callback = std::function<void(const ReducedBucket& bucket, Stream& stream)>;

  // bucket_elems: reduce_bucket_size (elements, >= 1); pool_size (>= 1) buffers of capacity()
  // elements are allocated here, once: bucket k+1 fills while bucket k is reduced.
  ReduceScatterBucketer(Communicator& comm, Device& device, DType dtype, ReduceOp op,
                        size_t bucket_elems, Callback callback, int pool_size = 3);
  // Waits for the collectives in flight (their errors are dropped); runs no callback.
  ~ReduceScatterBucketer();
  ReduceScatterBucketer(const ReduceScatterBucketer&) = delete;
  ReduceScatterBucketer& operator=(const ReduceScatterBucketer&) = delete;

  // Appends `count` elements of `data` (dtype(), memory the device can copy from) to the open
  // bucket, splitting across buckets as needed; each bucket that fills is launched at once.
  // The copies run on stream() after `ready` (an event of the device's kind, recorded where
  // `data` was produced; null: data is ready now). Delivers completed buckets (as poll()).
  // Blocks only when every pool buffer is in flight: then it waits for the oldest bucket and
  // delivers it. Returns a Work that completes once `data` has been copied out: the caller may
  // overwrite or free it after that, not before.
  Work add(size_t tensor_id, const void* data, size_t count, Event* ready = nullptr);
  // Launches the open, partly filled bucket (padded); no-op when it is empty. Never blocks.
  void flush();
  // Runs the callback of every bucket that has completed, oldest first; never blocks on a
  // collective. Returns how many it delivered.
  size_t poll();
  // flush(), then blocks until every bucket has completed and been delivered, and until stream()
  // has run what was enqueued on it (including the callbacks' work). Rethrows a collective's or
  // the stream's error.
  void wait();

  size_t capacity() const noexcept { return capacity_; }  // elements per bucket
  int pool_size() const noexcept { return pool_size_; }
  size_t pool_bytes() const noexcept { return pool_.bytes(); }  // what the constructor allocated
  size_t launched() const noexcept { return launched_; }
  size_t in_flight() const noexcept { return in_flight_.size(); }
  DType dtype() const noexcept { return dtype_; }
  Stream& stream() noexcept { return *stream_; }

 private:
  struct InFlight {
    int slot;
    Work work;
    ReducedBucket bucket;
    std::shared_ptr<Event> filled;  // the collective's `after`, kept alive until delivery
  };
  char* slot_data(int slot) const noexcept;
  void open_bucket();
  void launch();
  // Pops the oldest bucket in flight, waits for it (already complete when called from poll)
  // and runs its callback.
  void deliver_oldest();

  Communicator& comm_;
  Device& device_;
  DType dtype_;
  ReduceOp op_;
  Callback callback_;
  int pool_size_;
  size_t capacity_;    // elements per bucket
  size_t slot_bytes_;  // capacity_ * element size
  Buffer pool_;        // pool_size_ slots; declared before stream_ so it outlives the copies
  char* base_ = nullptr;  // pool_.data() rounded up to 128 bytes
  std::unique_ptr<Stream> stream_;
  std::deque<int> free_slots_;
  std::deque<InFlight> in_flight_;
  int open_slot_ = -1;  // the slot being filled, -1 when no bucket is open
  size_t fill_ = 0;
  std::vector<BucketEntry> entries_;
  size_t launched_ = 0;
};

// ---- AllGatherBucketer --------------------------------------------------------------------------

class AllGatherBucketer {
 public:
  // bucket_elems: allgather_bucket_size (gathered elements, >= 1). pool_size (>= 1) slots, each a
  // send part of C elements and (world > 1) a receive part of N*C, allocated here, once; a slot
  // is refilled only after its previous bucket has been scattered (ordered on the streams, the
  // host does not wait).
  AllGatherBucketer(Communicator& comm, Device& device, DType dtype, size_t bucket_elems,
                    int pool_size = 2);
  // Waits for everything in flight (errors are dropped).
  ~AllGatherBucketer();
  AllGatherBucketer(const AllGatherBucketer&) = delete;
  AllGatherBucketer& operator=(const AllGatherBucketer&) = delete;

  // Appends this rank's shard of tensor `tensor_id` (shard_count elements of dtype()) to the
  // open bucket, splitting across buckets as needed; each bucket that fills is launched. Once
  // gathered, full_out (N * shard_count elements) receives [piece of rank 0 | ... | rank N-1].
  // The shard is read on the copy stream after `ready` (null: ready now); my_shard must stay
  // unchanged, and full_out unread and unwritten, until gathered(tensor_id) completes.
  // Never blocks.
  void add(size_t tensor_id, const void* my_shard, size_t shard_count, void* full_out,
           Event* ready = nullptr);
  // Launches the open bucket; no-op when empty. Never blocks.
  void flush();
  // A Work that completes when full_out of the latest add(tensor_id) is written: wait() on it,
  // or chain() a compute stream on it. Launches the open bucket first if the tensor is still in
  // it. Throws if tensor_id was never added. Never blocks.
  Work gathered(size_t tensor_id);
  // flush(), then blocks until every bucket has been gathered and scattered; rethrows errors.
  void wait();

  size_t capacity() const noexcept { return capacity_; }  // per-rank elements per bucket
  int pool_size() const noexcept { return pool_size_; }
  size_t pool_bytes() const noexcept { return pool_.bytes(); }
  size_t launched() const noexcept { return launched_; }
  DType dtype() const noexcept { return dtype_; }

 private:
  struct Target {
    BucketEntry entry;   // piece of the shard and where it is in the bucket
    size_t shard_count;  // s: the tensor's shard length
    char* full_out;
    bool last_piece;     // the tensor is complete once this piece is scattered
  };
  char* send_part(int slot) const noexcept;
  char* recv_part(int slot) const noexcept;
  void open_bucket();
  void launch();

  Communicator& comm_;
  Device& device_;
  DType dtype_;
  int pool_size_;
  size_t capacity_;    // per-rank elements
  size_t slot_bytes_;  // send + receive parts
  Buffer pool_;
  char* base_ = nullptr;
  std::unique_ptr<Stream> fill_stream_;     // copies shards into send parts
  std::unique_ptr<Stream> scatter_stream_;  // copies gathered pieces into full_out
  // Per slot: recorded on the scatter stream after the slot's last bucket was scattered; the
  // fill stream waits for it before writing the slot again (it protects the slot's buffers).
  std::vector<std::shared_ptr<Event>> slot_free_;
  // Per slot: the event its gather waits for (kept alive until the slot's next bucket).
  std::vector<std::shared_ptr<Event>> slot_filled_;
  int next_slot_ = 0;
  int open_slot_ = -1;
  size_t fill_ = 0;
  std::vector<Target> targets_;
  std::unordered_set<size_t> open_ids_;           // tensors with a piece in the open bucket
  std::unordered_map<size_t, Work> gathered_;     // tensor -> completion of its latest add
  size_t launched_ = 0;
};

}  // namespace zero::coll
