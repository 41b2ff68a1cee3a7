// The MPI world: who we are (rank, size, rank on this host), and the rule that a fatal error on
// any rank ends the whole job with its message instead of leaving the others hanging.
//
// Works under `mpirun -np N ...` and as a plain process (a world of one, no launcher needed).
// MPI is initialised with MPI_THREAD_MULTIPLE so that communication threads may call MPI.
//
// Typical program:
//   int main(int argc, char** argv) {
//     return zero::run_main(argc, argv, [](zero::World& world) { ...; return 0; });
//   }
// run_main initialises the world, runs the body, finalises MPI and returns the body's exit
// code. An exception escaping the body on any rank is printed with that rank's number and the
// job is aborted with MPI_Abort (exit code 1) when there is more than one rank.
//
// Thread-safety: the accessors are safe from any thread after init; collective members
// (barrier, any) must be called by every rank, from one thread per rank at a time.
#pragma once

#include <mpi.h>

#include <functional>
#include <string>
#include <string_view>

namespace zero {

class World {
 public:
  // Initialises MPI once per process (later calls return the same World).
  static World& init(int* argc, char*** argv);
  // The initialised world; throws if init has not run.
  static World& get();
  static bool initialized() noexcept;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int local_rank() const noexcept { return local_rank_; }  // rank among this host's ranks
  int local_size() const noexcept { return local_size_; }  // ranks on this host
  bool is_root() const noexcept { return rank_ == 0; }
  const std::string& hostname() const noexcept { return hostname_; }
  // A duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN: failures come back as zero::Error.
  MPI_Comm comm() const noexcept { return comm_; }
  int thread_level() const noexcept { return thread_level_; }

  void barrier();
  // True on every rank if `flag` is true on any rank.
  bool any(bool flag);

  // Prints `message` on this rank and ends the whole job with `exit_code`. Never returns.
  [[noreturn]] void abort(int exit_code, std::string_view message);
  // Finalises MPI (idempotent). Every rank must call it, after all communication.
  void finalize();

 private:
  World() = default;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, thread_level_ = 0;
  std::string hostname_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm local_comm_ = MPI_COMM_NULL;
  bool finalized_ = false;
};

// Runs `body` inside an initialised world; see the header comment. Returns the exit code.
int run_main(int argc, char** argv, const std::function<int(World&)>& body);

}  // namespace zero
