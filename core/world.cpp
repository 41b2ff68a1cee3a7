#include "core/world.hpp"

#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <memory>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/mpi_check.hpp"

namespace zero {

namespace {

World* g_world = nullptr;

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
  return false;
}

// Called for an exception nobody caught (for example on a worker thread): end the whole job
// rather than leaving the other ranks waiting for this one.
[[noreturn]] void terminate_handler() {
  std::string what = "terminate called without an active exception";
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = std::string("uncaught exception: ") + ex.what();
    } catch (...) {
      what = "uncaught exception of unknown type";
    }
  }
  log::error(what);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

}  // namespace

World& World::init(int* argc, char*** argv) {
  if (g_world) return *g_world;
  // A plain process (no launcher) is a world of one. Open MPI would otherwise fork a helper
  // daemon for a singleton; "isolated" skips it (must be set before MPI_Init).
  if (!launched_by_mpirun()) setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);

  int already = 0;
  MPI_Initialized(&already);
  auto w = std::unique_ptr<World>(new World());
  if (!already) {
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &w->thread_level_);
    if (rc != MPI_SUCCESS) {
      std::fprintf(stderr, "error: MPI_Init_thread failed (code %d): cannot start the job\n", rc);
      std::exit(1);
    }
  } else {
    MPI_Query_thread(&w->thread_level_);
  }
  // From here on MPI failures are returned to us and raised as zero::Error with context.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  ZERO_CHECK_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &w->comm_));
  ZERO_CHECK_MPI(MPI_Comm_set_errhandler(w->comm_, MPI_ERRORS_RETURN));
  ZERO_CHECK_MPI(MPI_Comm_rank(w->comm_, &w->rank_));
  ZERO_CHECK_MPI(MPI_Comm_size(w->comm_, &w->size_));
  ZERO_CHECK_MPI(MPI_Comm_split_type(w->comm_, MPI_COMM_TYPE_SHARED, w->rank_, MPI_INFO_NULL,
                                     &w->local_comm_));
  ZERO_CHECK_MPI(MPI_Comm_rank(w->local_comm_, &w->local_rank_));
  ZERO_CHECK_MPI(MPI_Comm_size(w->local_comm_, &w->local_size_));
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  w->hostname_ = host;
  log::set_rank(w->rank_, w->size_);
  std::set_terminate(terminate_handler);
  g_world = w.release();  // lives until the process ends
  return *g_world;
}

World& World::get() {
  ZERO_REQUIRE(g_world, "World::get() called before World::init()");
  return *g_world;
}

bool World::initialized() noexcept { return g_world != nullptr; }

void World::barrier() { ZERO_CHECK_MPI(MPI_Barrier(comm_)); }

bool World::any(bool flag) {
  int local = flag ? 1 : 0, global = 0;
  ZERO_CHECK_MPI(MPI_Allreduce(&local, &global, 1, MPI_INT, MPI_MAX, comm_));
  return global != 0;
}

void World::abort(int exit_code, std::string_view message) {
  log::error(message);
  if (size_ > 1) {
    // Ends every rank; mpirun reports which rank called it and returns exit_code.
    MPI_Abort(MPI_COMM_WORLD, exit_code);
  }
  finalize();
  std::exit(exit_code);
}

void World::finalize() {
  if (finalized_) return;
  finalized_ = true;
  if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  int done = 0;
  MPI_Finalized(&done);
  if (!done) MPI_Finalize();
}

int run_main(int argc, char** argv, const std::function<int(World&)>& body) {
  World& world = World::init(&argc, &argv);
  int code = 0;
  try {
    code = body(world);
  } catch (const std::exception& e) {
    world.abort(1, e.what());
  } catch (...) {
    world.abort(1, "unknown exception");
  }
  world.finalize();
  return code;
}

}  // namespace zero
