// The bucket layout arithmetic of collectives/bucketer.hpp: padding, capacities, which ranges of
// which tensors a rank's slice holds, and how tensors are packed into buckets. Pure functions,
// one process; the bucketers themselves are tested on 1-4 ranks in tests/mpi/bucketer_test.cpp.
#include <catch2/catch_test_macros.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "collectives/bucketer.hpp"

using zero::DType;
using zero::coll::BucketEntry;
using zero::coll::SliceRange;
using zero::coll::TensorExtent;

TEST_CASE("bucket layout: A is the number of elements in 128 bytes") {
  CHECK(zero::coll::align_elems(DType::f32) == 32);
  CHECK(zero::coll::align_elems(DType::f16) == 64);
  CHECK(zero::coll::align_elems(DType::bf16) == 64);
}

TEST_CASE("bucket layout: padding makes N equal slices of a multiple of A elements") {
  using zero::coll::bucket_padding;
  CHECK(bucket_padding(0, 1, DType::f32) == 0);
  CHECK(bucket_padding(1, 1, DType::f32) == 31);
  CHECK(bucket_padding(32, 1, DType::f32) == 0);
  CHECK(bucket_padding(100, 3, DType::f32) == 92);   // unit 96: 192 - 100
  CHECK(bucket_padding(640, 4, DType::bf16) == 128);  // unit 256: 768 - 640
  CHECK(bucket_padding(768, 4, DType::f16) == 0);
  for (int world = 1; world <= 8; ++world)
    for (DType dt : {DType::f32, DType::f16, DType::bf16})
      for (size_t len = 0; len < 1200; ++len) {
        const size_t unit = static_cast<size_t>(world) * zero::coll::align_elems(dt);
        const size_t pad = bucket_padding(len, world, dt);
        const size_t slice = (len + pad) / static_cast<size_t>(world);
        REQUIRE(pad < unit);                                    // the least padding that works
        REQUIRE((len + pad) % static_cast<size_t>(world) == 0);  // equal slices
        REQUIRE(slice * zero::size_of(dt) % 128 == 0);           // each starts 128-byte aligned
      }
}

TEST_CASE("bucket layout: bucket capacities") {
  using zero::coll::gather_bucket_capacity;
  using zero::coll::reduce_bucket_capacity;
  CHECK(reduce_bucket_capacity(1000, 2, DType::f32) == 1024);  // unit 64
  CHECK(reduce_bucket_capacity(1024, 2, DType::f32) == 1024);
  CHECK(reduce_bucket_capacity(1, 4, DType::bf16) == 256);
  CHECK(reduce_bucket_capacity(500000000, 1, DType::f16) == 500000000);  // the default, 5e8
  // Per rank: ceil(bucket / N) rounded up to A.
  CHECK(gather_bucket_capacity(1000, 3, DType::f32) == 352);  // 334 -> 352
  CHECK(gather_bucket_capacity(1, 4, DType::bf16) == 64);
  CHECK(gather_bucket_capacity(4096, 2, DType::f32) == 2048);
}

TEST_CASE("bucket layout: slice ranges of the header's example, 3 ranks of fp32") {
  // | t3[700, 1000) | t4[0, 250) | t5[0, 90) | pad |: 640 elements, padded to 672, S = 224.
  const std::vector<BucketEntry> entries = {{3, 700, 0, 300}, {4, 0, 300, 250}, {5, 0, 550, 90}};
  const size_t padded = 640 + zero::coll::bucket_padding(640, 3, DType::f32);
  REQUIRE(padded == 672);
  const size_t s = padded / 3;
  using zero::coll::slice_ranges;
  CHECK(slice_ranges(entries, 0 * s, s) == std::vector<SliceRange>{{3, 700, 0, 224}});
  CHECK(slice_ranges(entries, 1 * s, s) ==
        std::vector<SliceRange>{{3, 924, 0, 76}, {4, 0, 76, 148}});
  // Rank 2's slice ends with 122 elements of padding that no range covers.
  CHECK(slice_ranges(entries, 2 * s, s) ==
        std::vector<SliceRange>{{4, 148, 0, 102}, {5, 0, 102, 90}});
  CHECK(slice_ranges(entries, 0, 0).empty());
  CHECK(slice_ranges({}, 0, 224).empty());
}

TEST_CASE("bucket layout: every element of a bucket is in exactly one rank's slice") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    // Random entries laid end to end, each a piece of a random tensor.
    std::vector<BucketEntry> entries;
    size_t fill = 0;
    const int n_entries = static_cast<int>(rng() % 12);
    for (int i = 0; i < n_entries; ++i) {
      const size_t len = 1 + rng() % 300;
      entries.push_back({static_cast<size_t>(i), rng() % 1000, fill, len});
      fill += len;
    }
    const int world = 1 + static_cast<int>(rng() % 6);
    const DType dt = trial % 2 ? DType::f32 : DType::bf16;
    const size_t padded = fill + zero::coll::bucket_padding(fill, world, dt);
    const size_t s = padded / static_cast<size_t>(world);
    // Tag each bucket element with (entry index + 1); 0 = padding. Rebuild it from the ranges.
    std::vector<int> expect(padded, 0), seen(padded, 0);
    for (size_t i = 0; i < entries.size(); ++i)
      for (size_t k = 0; k < entries[i].length; ++k)
        expect[entries[i].bucket_offset + k] = static_cast<int>(i) + 1;
    for (int r = 0; r < world; ++r) {
      const size_t begin = static_cast<size_t>(r) * s;
      for (const SliceRange& g : zero::coll::slice_ranges(entries, begin, s)) {
        const BucketEntry& e = entries[g.tensor_id];  // tensor_id == entry index here
        REQUIRE(g.length > 0);
        REQUIRE(g.slice_offset + g.length <= s);
        REQUIRE(g.tensor_offset >= e.tensor_offset);
        REQUIRE(g.tensor_offset + g.length <= e.tensor_offset + e.length);
        // Slice position p holds tensor element tensor_offset + (p - slice_offset), which must
        // be where the entry put it in the bucket.
        for (size_t k = 0; k < g.length; ++k) {
          const size_t pos = begin + g.slice_offset + k;
          REQUIRE(pos - e.bucket_offset == g.tensor_offset + k - e.tensor_offset);
          REQUIRE(seen[pos] == 0);
          seen[pos] = static_cast<int>(g.tensor_id) + 1;
        }
      }
    }
    REQUIRE(seen == expect);
  }
}

TEST_CASE("bucket layout: next_piece takes what fits") {
  using zero::coll::next_piece;
  CHECK(next_piece(9, 0, 5, 0, 8) == BucketEntry{9, 0, 0, 5});
  CHECK(next_piece(9, 3, 10, 6, 8) == BucketEntry{9, 3, 6, 2});
  CHECK(next_piece(9, 3, 2, 6, 8) == BucketEntry{9, 3, 6, 2});  // exactly fills the bucket
}

TEST_CASE("bucket layout: plan_buckets packs tensors in order and splits them") {
  using zero::coll::plan_buckets;
  const std::vector<TensorExtent> tensors = {{0, 5}, {1, 10}, {7, 0}, {2, 3}};
  const auto buckets = plan_buckets(tensors, 8);
  REQUIRE(buckets.size() == 3);
  CHECK(buckets[0] == std::vector<BucketEntry>{{0, 0, 0, 5}, {1, 0, 5, 3}});
  CHECK(buckets[1] == std::vector<BucketEntry>{{1, 3, 0, 7}, {2, 0, 7, 1}});
  CHECK(buckets[2] == std::vector<BucketEntry>{{2, 1, 0, 2}});  // the partial last bucket

  // A tensor spanning several buckets; an exactly full last bucket leaves no empty one behind.
  const std::vector<TensorExtent> big = {{4, 24}};
  const auto b2 = plan_buckets(big, 8);
  REQUIRE(b2.size() == 3);
  CHECK(b2[2] == std::vector<BucketEntry>{{4, 16, 0, 8}});
  CHECK(plan_buckets({}, 8).empty());
  CHECK_THROWS_AS(plan_buckets(big, 0), zero::Error);
}
