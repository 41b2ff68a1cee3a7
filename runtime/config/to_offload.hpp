// The config's "aio" block as offload/'s own option struct. offload/ may not depend on runtime/
// (arrows point down), so it declares AioOptions with the same fields and whoever builds the
// file engine converts here. Header only: field-by-field copies, no link dependency of
// zero_config on zero_offload. Range checks happen in AioOptions::validate (called by the
// engine), whose messages name the "aio." keys.
//
//   aio.block_size, queue_depth, single_submit, overlap_events  -> the same fields
//   aio.intra_op_parallelism (thread_count)                      -> threads
//   aio.use_gds                                                  -> (not built)
#pragma once

#include <cstddef>

#include "offload/aio_options.hpp"
#include "runtime/config/config.hpp"

namespace zero::config {

inline offload::AioOptions to_aio_options(const Aio& a) {
  offload::AioOptions o;
  o.block_size = static_cast<size_t>(a.block_size);
  o.queue_depth = static_cast<int>(a.queue_depth);
  o.threads = static_cast<int>(a.intra_op_parallelism);
  o.single_submit = a.single_submit;
  o.overlap_events = a.overlap_events;
  return o;
}

}  // namespace zero::config
