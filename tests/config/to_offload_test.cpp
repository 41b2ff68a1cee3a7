// runtime/config/to_offload.hpp: the "aio" block as offload's AioOptions, field by field.
#include "runtime/config/to_offload.hpp"

#include <catch2/catch_test_macros.hpp>

#include "tests/config/helpers.hpp"

using namespace zero::config;
using namespace zero::config::test;

TEST_CASE("aio defaults map onto the file engine's defaults", "[aio]") {
  const zero::offload::AioOptions o = to_aio_options(Aio{});
  const zero::offload::AioOptions d;
  CHECK(o.block_size == d.block_size);
  CHECK(o.queue_depth == d.queue_depth);
  CHECK(o.threads == d.threads);
  CHECK(o.single_submit == d.single_submit);
  CHECK(o.overlap_events == d.overlap_events);
  CHECK(o.backend == zero::offload::AioBackend::automatic);
}

TEST_CASE("every aio key reaches its field including the old thread_count", "[aio]") {
  const LoadResult r = parse_with(
      R"("aio": {"block_size": 262144, "queue_depth": 32, "thread_count": 3,)"
      R"( "single_submit": true, "overlap_events": false})");
  INFO(all(r));
  REQUIRE(r.ok());
  const zero::offload::AioOptions o = to_aio_options(r.config.aio);
  CHECK(o.block_size == 262144);
  CHECK(o.queue_depth == 32);
  CHECK(o.threads == 3);
  CHECK(o.single_submit);
  CHECK_FALSE(o.overlap_events);
}
