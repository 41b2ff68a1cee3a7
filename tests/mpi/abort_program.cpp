// A job in which one rank fails while the others wait for it in a collective: the job must end
// with the failing rank's message and a non-zero exit code, never hang.
//   abort_program throw|thread|exit  (which way rank `size-1` fails)
#include <cstring>
#include <stdexcept>
#include <thread>

#include "core/error.hpp"
#include "core/world.hpp"

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "throw";
  return zero::run_main(argc, argv, [&](zero::World& world) {
    if (world.rank() == world.size() - 1) {
      if (std::strcmp(mode, "thread") == 0) {
        // An exception escaping a worker thread: std::terminate -> the World's handler.
        std::thread([] { throw std::runtime_error("deliberate failure on a worker thread"); }).join();
      }
      ZERO_FAIL("deliberate failure on the last rank");
    }
    // The other ranks block here; only an abort of the whole job releases them.
    world.barrier();
    return 0;
  });
}
