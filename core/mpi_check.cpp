#include "core/mpi_check.hpp"

#include <string>

namespace zero::detail {

void throw_mpi(int rc, const char* statement, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  std::string msg;
  if (MPI_Error_string(rc, text, &len) == MPI_SUCCESS)
    msg.assign(text, static_cast<size_t>(len));
  else
    msg = "unknown MPI error";
  msg += " (code " + std::to_string(rc) + ")";
  throw_error("MPI", std::move(msg), statement, file, line);
}

}  // namespace zero::detail
