// What this process is doing right now, for diagnostics: the watchdog puts it in every heartbeat
// so that, when a rank stops answering, the others can say where it was ("step 12, backward")
// and where they were themselves ("step 12, waiting for the gradient all-reduce").
//
// One process-wide register, written by the training thread, read by any thread. Writing is two
// relaxed atomic stores (no allocation, no lock), cheap enough for the hot loop. Names must have
// static storage duration (string literals): only the pointer is kept.
//
//   phase::set_step(12);
//   { phase::Scope s("backward"); ...; }   // restores the previous name when it ends
#pragma once

namespace zero::phase {

void set(const char* name) noexcept;      // a string literal; nullptr = "idle"
void set_step(long long step) noexcept;   // the optimizer step being worked on; -1 = none
const char* name() noexcept;              // never nullptr
long long step() noexcept;

// Sets a name for the lifetime of the scope and restores the one before.
class Scope {
 public:
  explicit Scope(const char* name) noexcept : previous_(phase::name()) { set(name); }
  ~Scope() { set(previous_); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const char* previous_;
};

}  // namespace zero::phase
