#include "core/log.hpp"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <mutex>
#include <string>

namespace zero::log {

namespace {
std::atomic<int> g_rank{0};
std::atomic<int> g_size{1};
std::mutex g_mutex;
std::atomic<int> g_stdout_errno{0};

void write_line(std::FILE* f, std::string_view prefix, std::string_view line) {
  std::string s;
  s.reserve(prefix.size() + line.size() + 1);
  s.append(prefix).append(line);
  if (s.empty() || s.back() != '\n') s.push_back('\n');
  std::lock_guard lock(g_mutex);
  errno = 0;
  const bool ok = std::fwrite(s.data(), 1, s.size(), f) == s.size() && std::fflush(f) == 0;
  // Kept for stdout_write_error(): stdio's error flag does not say why.
  if (!ok && f == stdout && g_stdout_errno.load() == 0) g_stdout_errno = errno != 0 ? errno : EIO;
}

std::string rank_prefix() {
  return g_size.load() > 1 ? "[rank " + std::to_string(g_rank.load()) + "] " : std::string();
}
}  // namespace

int stdout_write_error() noexcept { return g_stdout_errno.load(); }

void set_rank(int rank, int size) noexcept {
  g_rank = rank;
  g_size = size;
}
int rank() noexcept { return g_rank; }

void info(std::string_view line) {
  if (g_rank == 0) write_line(stdout, "", line);
}
void warn(std::string_view line) {
  if (g_rank == 0) write_line(stderr, "warning: ", line);
}
void error(std::string_view line) { write_line(stderr, rank_prefix() + "error: ", line); }
void rank_info(std::string_view line) { write_line(stdout, rank_prefix(), line); }

}  // namespace zero::log
