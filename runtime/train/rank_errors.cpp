#include "runtime/train/rank_errors.hpp"

#include <mpi.h>

#include <cstdio>
#include <vector>

#include "core/error.hpp"
#include "core/mpi_check.hpp"

namespace zero::train {

std::string error_text(const std::exception& e) {
  if (const auto* z = dynamic_cast<const Error*>(&e); z && z->library() == "zero")
    return z->message();
  return e.what();
}

bool agree_on_failure(World& world, const std::string& what, const std::string& error) {
  const int failed = error.empty() ? 0 : 1;
  if (!world.any(failed != 0)) return false;
  // Rank 0's message (cut to the buffer) tells the others whether theirs adds anything.
  std::vector<char> root(4096, 0);
  if (world.is_root()) std::snprintf(root.data(), root.size(), "%s", error.c_str());
  ZERO_CHECK_MPI(MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_CHAR, 0, world.comm()));
  if (failed && (world.is_root() || error.substr(0, root.size() - 1) != root.data())) {
    const std::string prefix = world.is_root() ? std::string() : "[rank " + std::to_string(world.rank()) + "] ";
    std::fprintf(stderr, "%szero-train: error: %s: %s\n", prefix.c_str(), what.c_str(), error.c_str());
    std::fflush(stderr);
  }
  return true;
}

}  // namespace zero::train
