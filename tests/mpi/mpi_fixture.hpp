// The fixture the multi-rank tests share: one cpu device and one MPI Communicator over the whole
// World, made on first use and kept for the process (every rank makes it at the same point,
// inside the first test case that asks). Test-only.
#pragma once

#include <memory>

#include "collectives/communicator.hpp"
#include "core/device.hpp"
#include "core/world.hpp"

namespace zero::test {

struct MpiEnv {
  std::unique_ptr<Device> device = make_device(DeviceKind::cpu);
  std::unique_ptr<coll::Communicator> comm =
      coll::make_mpi_communicator(World::get().comm(), *device);
};

inline MpiEnv& env() {
  static MpiEnv e;
  return e;
}

}  // namespace zero::test
