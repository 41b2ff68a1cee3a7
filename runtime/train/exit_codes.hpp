// zero-train's exit status, the contract scripts and the tests rely on (--help prints it too).
#pragma once

namespace zero::train {

constexpr int kExitFailure = 1;  // something failed while running
constexpr int kExitUsage = 2;    // bad flags, config or input, before training
constexpr int kExitLost = 3;     // a rank or host stopped answering (the watchdog)

}  // namespace zero::train
