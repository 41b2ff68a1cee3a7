// ZERO_CHECK_MPI: checked MPI calls. The World sets MPI_ERRORS_RETURN on its communicators, so
// a failing call returns its code here instead of aborting inside the library.
#pragma once

#include <mpi.h>

#include "core/error.hpp"

namespace zero::detail {
[[noreturn]] void throw_mpi(int rc, const char* statement, const char* file, int line);
}

#define ZERO_CHECK_MPI(expr)                                                        \
  do {                                                                              \
    int zero_mpi_rc_ = (expr);                                                      \
    if (zero_mpi_rc_ != MPI_SUCCESS)                                                \
      ::zero::detail::throw_mpi(zero_mpi_rc_, #expr, __FILE__, __LINE__);           \
  } while (0)
