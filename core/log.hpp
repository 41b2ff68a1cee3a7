// Logging for a multi-rank job. info() and warn() print on rank 0 only (every rank computes the
// same thing; one copy is enough); error() and rank_info() print on the calling rank with a
// "[rank r]" prefix. Lines are written whole, so ranks sharing a terminal do not interleave
// inside a line. The World sets the rank at start-up; before that everything prints as rank 0.
// Thread-safe.
#pragma once

#include <string_view>

namespace zero::log {

void set_rank(int rank, int size) noexcept;
int rank() noexcept;

void info(std::string_view line);       // stdout, rank 0 only
void warn(std::string_view line);       // stderr, rank 0 only, prefixed "warning: "
void error(std::string_view line);      // stderr, every rank, prefixed "[rank r] error: " (size > 1)
void rank_info(std::string_view line);  // stdout, every rank, prefixed "[rank r] "

// The errno of the first line info() or rank_info() failed to write to stdout (a full disk,
// /dev/full, a closed pipe), or 0. The lines go on being attempted; a program checks this at
// its end so that lost output is not an exit 0.
int stdout_write_error() noexcept;

}  // namespace zero::log
