#include "runtime/engine/activation_offload.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#include "core/error.hpp"
#include "core/log.hpp"

namespace zero::engine {

ActivationOffload::ActivationOffload(Device& device, Stream& compute, offload::PinPolicy pin)
    : dev_(device), compute_(compute) {
  offload::HostMemoryOptions hm;
  hm.pin = pin;
  host_ = std::make_unique<offload::HostMemory>(device, hm);
  copies_ = std::make_unique<offload::CopyEngine>(device, *host_);
  point_ = device.create_event();
}

ActivationOffload::~ActivationOffload() { quiesce(); }

std::shared_ptr<offload::HostBuffer> ActivationOffload::take_buffer(size_t bytes) {
  // The same shapes recur every step: an idle buffer of exactly this size is reused.
  const auto it = std::find_if(free_.begin(), free_.end(), [&](const auto& b) { return b->bytes() == bytes; });
  if (it != free_.end()) {
    std::shared_ptr<offload::HostBuffer> b = std::move(*it);
    free_.erase(it);
    return b;
  }
  ++counters_.host_buffers;
  return std::make_shared<offload::HostBuffer>(host_->allocate(bytes, MemCategory::activations));
}

StashedActivation ActivationOffload::stash(Tensor&& t) {
  sweep();
  StashedActivation s;
  if (!t || t.bytes() == 0 || !to_dtype(t.type())) return s;
  const size_t bytes = t.bytes();
  s.host = take_buffer(bytes);
  s.shape = t.shape();
  s.type = t.type();
  compute_.record(*point_);  // the tensor is complete at this point of the compute stream
  s.down = std::make_shared<offload::CopyHandle>(copies_->to_host(*s.host, 0, t.data(), bytes, point_.get()));
  counters_.to_host_bytes += bytes;
  pending_.push_back({s.down, std::move(t), nullptr});
  t = Tensor();
  return s;
}

void ActivationOffload::prefetch(StashedActivation& s) {
  ZERO_REQUIRE(static_cast<bool>(s), "activation offload: prefetch of an empty stash");
  if (s.up_copy) return;
  sweep();
  // The forward's copy down ran long ago in every schedule (a Unit's backward comes after the
  // forward passes that follow it); waiting here keeps the H2D path simple (a pageable
  // fallback stages through another stream, which could not wait on the D2H event).
  s.down->wait();
  s.up = Tensor::empty(dev_, s.shape, s.type, MemCategory::activations);
  // cuda: s.up comes from the compute stream's pool; the copy stream may write it only after
  // an event recorded after the allocation.
  compute_.record(*point_);
  s.up_copy = std::make_shared<offload::CopyHandle>(copies_->to_device(s.up.data(), *s.host, 0, s.up.bytes(),
                                                                       point_.get()));
  counters_.to_device_bytes += s.up.bytes();
  pending_.push_back({s.up_copy, Tensor(), s.host});
}

Tensor ActivationOffload::fetch(StashedActivation& s) {
  prefetch(s);
  s.up_copy->order_before(compute_);  // the recomputation waits for the bytes; the host does not
  Tensor t = std::move(s.up);
  s = StashedActivation();
  return t;
}

void ActivationOffload::sweep() {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (!it->handle->done()) {
      ++it;
      continue;
    }
    // A done copy: the device tensor it read can go (dropped here, on the driving thread), and
    // a host buffer it read returns to the pool unless a stash still holds it.
    if (it->host && it->host.use_count() == 1) free_.push_back(std::move(it->host));
    it = pending_.erase(it);
  }
}

void ActivationOffload::quiesce() noexcept {
  for (Pending& p : pending_) {
    try {
      p.handle->wait();
    } catch (const std::exception& e) {
      log::error(std::string("activation offload: a copy failed: ") + e.what());
    }
  }
  try {
    sweep();
  } catch (const std::exception& e) {
    log::error(std::string("activation offload: ") + e.what());
  }
}

}  // namespace zero::engine
