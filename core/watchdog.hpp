// The watchdog: every rank notices, within a bounded time, that another rank stopped answering
// (its process stopped by a signal or frozen, its host lost or cut off), says which one and where
// each side was, and ends the job with a non-zero exit code instead of hanging forever. A rank
// whose process runs but whose training thread is stuck is not detected (its heartbeats go on).
//
// Why heartbeats and not a timeout on each collective (PyTorch's NCCL watchdog): a collective's
// duration says nothing about the peers' health — a slow step, a long checkpoint save or an
// evaluation on rank 0 alone can keep the others waiting for minutes, and a timeout long enough
// for all of that (PyTorch: 30 minutes) is far too long to notice a lost host. Here each rank's
// watchdog thread sends a small heartbeat to its two ring neighbours (rank r-1 and r+1, modulo the
// world) every `interval` seconds on its own communicator, whatever the training thread is
// doing, and watches theirs. Silence means the process itself is not running or not reachable,
// which no amount of legitimate work causes. The rank that notices tells every other rank (one
// message each), prints a paragraph and ends the job; the others print one line and end too.
// Ring neighbours keep the steady cost at two small messages per interval per rank and two
// connections, at any world size; the ring crosses every partition of the hosts, so when a host
// is cut off, some rank on each side notices and tells its side.
//
// The heartbeat carries the sender's phase (core/phase.hpp): the report says what the
// silent rank was last doing and what the noticing rank is doing.
//
// Ending the job: MPI_Abort (mpirun then ends every rank); should that not return to the system
// within a few seconds (its launcher unreachable), the process exits by itself.
//
// Thread-safety: construct and destroy on the training thread; the heartbeat thread calls MPI
// (MPI_THREAD_MULTIPLE, which World::init requests) only on the watchdog's own communicator.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/world.hpp"

namespace zero {

struct WatchdogOptions {
  // A neighbour silent this long is declared lost. 0 = no watchdog.
  double timeout_s = 20;
  // Heartbeat period; 0 = min(1 s, timeout / 10). Must leave several beats per timeout.
  double interval_s = 0;
  // The exit code of a job the watchdog ends (documented by the program that uses it).
  int exit_code = 3;
};

class Watchdog {
 public:
  // Collective over `world` (every rank, the same options): duplicates the world's communicator,
  // learns every rank's host name, and starts the heartbeat thread. With one rank, a timeout of
  // 0 or no MPI_THREAD_MULTIPLE it watches nothing (active() is false).
  Watchdog(World& world, const WatchdogOptions& options);
  // Not collective: tells the neighbours that this rank is leaving (its silence from now on is
  // not a fault), stops the thread and frees the communicator. Never blocks for long (a
  // neighbour that is gone cannot hold it up).
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  bool active() const noexcept { return thread_.joinable(); }
  double timeout_s() const noexcept { return options_.timeout_s; }
  double interval_s() const noexcept { return interval_s_; }

 private:
  void run();

  World& world_;
  WatchdogOptions options_;
  double interval_s_ = 1;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::vector<std::string> hosts_;  // host name of every rank
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace zero
