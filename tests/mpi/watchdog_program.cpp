// Jobs in which one rank stops answering, or only looks as if it might: the watchdog
// (core/watchdog.hpp) must end the first kind within its timeout, with a report naming
// the rank and both sides' phases, and must leave the second kind alone.
//   watchdog_program stop RANK TIMEOUT_S     RANK stops itself (SIGSTOP) while the others wait
//                                            in a barrier: the job must end with exit code 3
//   watchdog_program slow RANK TIMEOUT_S     RANK works for 3 x TIMEOUT_S without calling MPI
//                                            (a long checkpoint save) while the others wait:
//                                            the job must finish, exit 0
//   watchdog_program leave RANK TIMEOUT_S    RANK stops its watchdog and idles for 3 x TIMEOUT_S
//                                            before finalising while the others keep theirs
//                                            running: a goodbye is not a fault, exit 0
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "core/phase.hpp"
#include "core/watchdog.hpp"
#include "core/world.hpp"

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: watchdog_program stop|slow|leave RANK TIMEOUT_S\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int target = std::atoi(argv[2]);
  const double timeout = std::atof(argv[3]);
  return zero::run_main(argc, argv, [&](zero::World& world) {
    std::optional<zero::Watchdog> dog(std::in_place, world, zero::WatchdogOptions{.timeout_s = timeout});
    zero::phase::set_step(7);
    world.barrier();
    const auto idle = std::chrono::duration<double>(3 * timeout);
    if (mode == "stop") {
      if (world.rank() == target) {
        zero::phase::set("stopping itself");
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // one heartbeat says so
        std::this_thread::sleep_for(std::chrono::duration<double>(dog->interval_s() * 1.5));
        raise(SIGSTOP);
      } else {
        zero::phase::set("a test barrier");
      }
      // Passes only after the watchdog has ended the job: Open MPI's kill sequence continues a
      // stopped process (SIGCONT) just before it terminates it, so the barrier may complete in
      // that moment; the ranks then wait here to be killed. Without the watchdog the job would
      // hang in the barrier (the test's timeout fails it) or end with exit 0 (its RC check).
      world.barrier();
      std::this_thread::sleep_for(std::chrono::seconds(30));
      return 0;
    }
    if (mode == "slow") {
      if (world.rank() == target) {
        zero::phase::Scope s("a long checkpoint save (simulated)");
        std::this_thread::sleep_for(idle);
      }
      world.barrier();
    } else if (mode == "leave") {
      if (world.rank() == target) {
        dog.reset();
        std::this_thread::sleep_for(idle);
      } else {
        std::this_thread::sleep_for(idle);
      }
    } else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 2;
    }
    dog.reset();
    world.barrier();
    if (world.is_root()) std::printf("watchdog_program %s: done, nobody was declared lost\n", mode.c_str());
    return 0;
  });
}
