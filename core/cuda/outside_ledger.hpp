// Measuring the device memory a library takes outside a Device's ledger (cuda backend only).
//
// cuBLAS's handle and NCCL's communicators allocate device memory of their own (NCCL: a few MiB
// per peer, channel and protocol for its connection buffers). The ledger never sees it, so the
// Device is told (Device::take_outside_ledger) and lowers its capacity: the run's own
// allocations then stop where the GPU's memory really ends, with the ledger's clear
// out-of-memory error, instead of a library failing later inside a collective.
//
// count_outside_ledger(device, what, f) runs f() and charges the drop of cudaMemGetInfo's free
// bytes across it to `what`. Contract: f allocates nothing through the ledger, and nothing else
// allocates or frees on that GPU meanwhile (call it while setting up, before training); a rise of
// the free memory counts as zero. Freed later (a communicator destroyed), the memory is not given
// back to the capacity: set-up is once per run, and a capacity that only shrinks is the safe side.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string_view>

#include "core/cuda/checks.hpp"
#include "core/device.hpp"

namespace zero::cuda {

// cudaMemGetInfo's free bytes on GPU `device`; the calling thread's current device is restored.
inline size_t free_device_memory(int device) {
  int previous = 0;
  ZERO_CHECK_CUDA(cudaGetDevice(&previous));
  if (previous != device) ZERO_CHECK_CUDA(cudaSetDevice(device));
  size_t free = 0, total = 0;
  const cudaError_t rc = cudaMemGetInfo(&free, &total);
  if (previous != device) ZERO_CHECK_CUDA(cudaSetDevice(previous));
  ZERO_CHECK_CUDA(rc);
  return free;
}

// Runs f() and charges the device memory it took to `what` (see the top of the file). Returns
// the bytes charged.
template <class F>
size_t count_outside_ledger(Device& device, std::string_view what, F&& f) {
  const size_t before = free_device_memory(device.index());
  f();
  const size_t after = free_device_memory(device.index());
  const size_t taken = before > after ? before - after : 0;
  device.take_outside_ledger(taken, what);  // zero too: the report shows what was measured
  return taken;
}

}  // namespace zero::cuda
