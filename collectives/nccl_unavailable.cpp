// make_nccl_communicator for builds without the cuda backend: it exists, so code that picks a
// backend at run time links everywhere, and it says why it cannot work and what to do instead.
// With the cuda backend, collectives/nccl_communicator.cpp defines it and this file is empty.
#include "collectives/communicator.hpp"

#ifndef ZERO_HAVE_CUDA

#include "core/error.hpp"

namespace zero::coll {

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, Device& device) {
  ZERO_FAIL("this build has no cuda backend, so there is no NCCL communicator (asked for on " +
            device.name() +
            ")\nHINT: rebuild with -DZERO_CUDA=ON on a machine with nvcc and NCCL, or run on a cpu "
            "device, whose collectives use MPI (make_communicator picks it)");
}

}  // namespace zero::coll

#endif  // ZERO_HAVE_CUDA
