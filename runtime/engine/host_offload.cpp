#include "runtime/engine/host_offload.hpp"

#include <algorithm>
#include <cstring>

#include "core/log.hpp"
#include "optim/clip.hpp"

namespace zero::engine {

HostOffload::HostOffload(Context& x, offload::PinPolicy pin) : x_(x) {
  offload::HostMemoryOptions hm;
  hm.pin = pin;
  host_ = std::make_unique<offload::HostMemory>(x.dev, hm);
  copies_ = std::make_unique<offload::CopyEngine>(x.dev, *host_);
  worker_ = make_cpu_stream("host-gradients");
  optimizer_ = make_cpu_stream("host-optimizer");
}

HostOffload::~HostOffload() { quiesce(); }

bool HostOffload::allocate(bool second_bank, int swap_rank, offload::SwapStore* shared) {
  const size_t owned = static_cast<size_t>(x_.owned_total);
  const size_t e = x_.esize();
  // Host memory is not zeroed: the accumulator and the moments must be.
  h_land_ = host_->allocate(owned * e, MemCategory::gradients);
  if (x_.host_fp32_acc()) {
    h_acc_ = host_->allocate(owned * 4, MemCategory::gradients);
    std::memset(h_acc_.data(), 0, h_acc_.bytes());
  }
  const int G = x_.part.group_count();
  if (!x_.o.nvme.enabled()) h_out_ = host_->allocate(owned * e, MemCategory::parameters);
  if (x_.o.nvme.enabled()) {
    std::vector<int64_t> numel;
    for (int g = 0; g < G; ++g) numel.push_back(x_.owned_len(g));
    swap_ = std::make_unique<OptimizerSwap>(x_.o.nvme, swap_rank, numel, *host_, shared);
    if (second_bank)
      log::info("engine: the speculative host step is off with NVMe offload (its second copy of "
                "the optimizer state would double the swap traffic); AdamW runs after backward");
    second_bank = false;
  } else {
    h_master_ = host_->allocate(owned * 4, MemCategory::master_weights);
    h_m_ = host_->allocate(owned * 4, MemCategory::optimizer_states);
    h_v_ = host_->allocate(owned * 4, MemCategory::optimizer_states);
    std::memset(h_m_.data(), 0, h_m_.bytes());
    std::memset(h_v_.data(), 0, h_v_.bytes());
  }
  if (second_bank) {
    // The second bank is a speed-up, not a need: when host memory cannot hold it, the engine
    // says so and runs the norm-first step instead of failing.
    try {
      h_master2_ = host_->allocate(owned * 4, MemCategory::master_weights);
      h_m2_ = host_->allocate(owned * 4, MemCategory::optimizer_states);
      h_v2_ = host_->allocate(owned * 4, MemCategory::optimizer_states);
      for (offload::HostBuffer* b : {&h_master2_, &h_m2_, &h_v2_}) std::memset(b->data(), 0, b->bytes());
    } catch (const OutOfMemory& err) {
      h_master2_ = offload::HostBuffer();
      h_m2_ = offload::HostBuffer();
      h_v2_ = offload::HostBuffer();
      second_bank = false;
      log::warn("engine: the speculative host step is off: host memory cannot hold its second "
                "copy of the optimizer state (" + format_bytes(owned * 12) + " per rank); AdamW "
                "runs after backward (norm-first). " + err.message().substr(0, err.message().find('\n')));
    }
  }
  partial_.assign(static_cast<size_t>(G), 0.0);
  acc_fresh_.assign(static_cast<size_t>(G), 1);
  for (int g = 0; g < G; ++g) {
    adam_done_.push_back(make_cpu_event());
    land_done_.push_back(make_cpu_event());
  }
  norms_done_ = make_cpu_event();
  return second_bank;
}

void HostOffload::wait_worker(Event& e) {
  const double t0 = now_seconds();
  e.synchronize();
  x_.timers.adam_waited += now_seconds() - t0;
}

void HostOffload::sync_counted() {
  const double t0 = now_seconds();
  sync();
  x_.timers.adam_waited += now_seconds() - t0;
}

void HostOffload::land(int g, const void* shard, bool last) {
  const size_t gi = static_cast<size_t>(g);
  const size_t n = static_cast<size_t>(x_.part.group(g).shard_numel);
  const size_t e = x_.esize();
  // The landing area of g is free once the host thread has used the previous micro-batch's
  // (with one micro-batch, the previous step's AdamW read it: the boundary waited for that).
  wait_worker(*land_done_[gi]);
  const double t0 = now_seconds();
  copies_->to_host(h_land_, static_cast<size_t>(x_.owned_off[gi]) * e, shard, n * e).wait();
  x_.timers.d2h += now_seconds() - t0;
  // The accumulator is not zeroed between steps (clear()): the step's first landing of g writes
  // over it, widened, and the later ones add to it, a block at a time on the stack.
  const bool first = acc_fresh_[gi] != 0;
  acc_fresh_[gi] = 0;
  worker_->launch_host([this, g, gi, n, e, last, first] {
    const unsigned char* landed = static_cast<const unsigned char*>(h_land_.data()) + static_cast<size_t>(x_.owned_off[gi]) * e;
    if (h_acc_) {
      float* acc = h_acc_.as<float>() + x_.owned_off[gi];
      if (first) convert(landed, x_.dtype, acc, DType::f32, n);
      else accumulate_widened(acc, landed, x_.dtype, n);
    }
    if (last) {
      double sq = 0;  // the runs the norm counts (a tied copy another stage owns is left out)
      for (const auto& [off, len] : x_.norm_runs[gi])
        sq += optim::local_squared_norm(grad(g) + static_cast<size_t>(off) * size_of(grad_type()),
                                        grad_type(), static_cast<size_t>(len));
      partial_[gi] = sq;
    }
  });
  worker_->record(*land_done_[gi]);
  if (last) worker_->record(*norms_done_);
}

const unsigned char* HostOffload::grad(int g) const {
  const size_t gi = static_cast<size_t>(g);
  if (h_acc_) return static_cast<const unsigned char*>(h_acc_.data()) + static_cast<size_t>(x_.owned_off[gi]) * 4;
  return static_cast<const unsigned char*>(h_land_.data()) + static_cast<size_t>(x_.owned_off[gi]) * x_.esize();
}

float* HostOffload::state(int g, int k, bool second_bank, int64_t lo) const {
  if (swap_) return swap_->state(g, k, lo);
  const offload::HostBuffer& b = k == 0 ? (second_bank ? h_master2_ : h_master_)
                               : k == 1 ? (second_bank ? h_m2_ : h_m_)
                                        : (second_bank ? h_v2_ : h_v_);
  return b.as<float>() + x_.owned_off[static_cast<size_t>(g)] + lo;
}

unsigned char* HostOffload::out(int g) const {
  return static_cast<unsigned char*>(out_buffer().data()) +
         static_cast<size_t>(x_.owned_off[static_cast<size_t>(g)]) * x_.esize();
}

void HostOffload::copy_up(int g, void* dst, size_t bytes) {
  const double t0 = now_seconds();
  copies_->to_device(dst, out_buffer(), static_cast<size_t>(x_.owned_off[static_cast<size_t>(g)]) * x_.esize(), bytes).wait();
  x_.timers.h2d += now_seconds() - t0;
}

void HostOffload::run_adam(int g, std::function<void(int64_t lo, int64_t n)> adam, bool after_landing) {
  const size_t gi = static_cast<size_t>(g);
  if (swap_) return swap_->schedule(g, *optimizer_, after_landing ? land_done_[gi].get() : nullptr,
                                    std::move(adam), *adam_done_[gi]);
  if (after_landing) optimizer_->wait(*land_done_[gi]);
  optimizer_->launch_host([adam = std::move(adam), n = x_.owned_len(g)] { adam(0, n); });
  optimizer_->record(*adam_done_[gi]);
}

void HostOffload::clear() {
  std::fill(acc_fresh_.begin(), acc_fresh_.end(), 1);
}

void HostOffload::quiesce() noexcept {
  if (worker_) try { worker_->synchronize(); } catch (...) {}
  if (optimizer_) try { optimizer_->synchronize(); } catch (...) {}
  if (swap_) swap_->quiesce();
  std::fill(acc_fresh_.begin(), acc_fresh_.end(), 1);  // a failed step's partial sums are not carried over
}

}  // namespace zero::engine
