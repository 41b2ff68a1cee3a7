// How zero-train fails on many ranks: an error on one rank becomes the same decision on every
// rank, and each distinct message is printed once.
//
// on_all_ranks is collective over the world: every rank must call it at the same point, in the
// same order. read_or_end_job is for code that runs while the other ranks may already wait in a
// collective for this one: it never returns on failure.
#pragma once

#include <exception>
#include <string>

#include "core/world.hpp"
#include "runtime/train/exit_codes.hpp"

namespace zero::train {

// The text of an error as the user should read it: a zero::Error of our own says what, where and
// what to do in its message (its file:line is for developers); anything else, its what().
std::string error_text(const std::exception& e);

// Collective: whether any rank's `error` is non-empty (false: no rank failed). When one did,
// prints "zero-train: error: <what>: <error>" on stderr once per distinct message: rank 0's, and
// that of any other rank whose message differs (prefixed "[rank r] ").
bool agree_on_failure(World& world, const std::string& what, const std::string& error);

// Runs `body` on every rank; when it throws on any rank, every rank gets false, and the errors
// are printed once each: rank 0's, and that of any other rank whose message differs (a rank
// that failed on its own, e.g. a corrupt file only it reads, while the others only learned
// that it failed).
template <class F>
bool on_all_ranks(World& world, const std::string& what, F&& body) {
  std::string error;
  try {
    body();
  } catch (const std::exception& e) {
    error = error_text(e);
  }
  return !agree_on_failure(world, what, error);
}

// Reads data inside a step or an evaluation, where the other ranks may already wait in a
// collective for this one: a failure (a token shard changed under the run, a read error) ends
// the whole job at once with this rank's message and exit code 1, rather than unwinding through
// an engine whose peers would wait forever.
template <class F>
auto read_or_end_job(World& world, const char* what, F&& read) {
  try {
    return read();
  } catch (const std::exception& e) {
    world.abort(kExitFailure, std::string("zero-train: ") + what + " on rank " + std::to_string(world.rank()) +
                                  ": " + error_text(e));
  }
}

}  // namespace zero::train
