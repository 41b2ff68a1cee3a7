#include "offload/memory_budget.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/error.hpp"
#include "core/ledger.hpp"
#include "core/mpi_check.hpp"

namespace zero::offload {

namespace {

// A cgroup v1 limit of "no limit" reads as PAGE_COUNTER_MAX pages (9223372036854771712 with 4 KiB
// pages); anything this large bounds nothing a machine has.
constexpr uint64_t kNoLimit = uint64_t{1} << 62;

bool read_text(const std::string& path, std::string& out) {
  std::ifstream in(path);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  out = s.str();
  return true;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// A limit file's value: bytes, or nullopt for "max", "no limit" values and anything unreadable.
std::optional<size_t> read_limit(const std::string& path) {
  std::string text;
  if (!read_text(path, text)) return std::nullopt;
  text = trim(text);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v >= kNoLimit) return std::nullopt;
  return static_cast<size_t>(v);
}

// mountinfo escapes space, tab, newline and backslash as \ooo (three octal digits).
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool octal = s[i] == '\\' && i + 3 < s.size() &&
                       std::all_of(s.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                                   s.begin() + static_cast<std::ptrdiff_t>(i) + 4,
                                   [](char c) { return c >= '0' && c <= '7'; });
    if (!octal) {
      out += s[i];
      continue;
    }
    out += static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
    i += 3;
  }
  return out;
}

struct Mount {
  std::string root;   // the directory of the hierarchy the mount shows ("/" usually)
  std::string point;  // where it is mounted
};

// The first mount of cgroup2 (v2) or of the cgroup v1 hierarchy with the memory controller.
std::optional<Mount> find_mount(const std::string& root, int version) {
  std::ifstream in(root + "/proc/self/mountinfo");
  std::string line;
  while (in && std::getline(in, line)) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    const auto dash = std::find(f.begin(), f.end(), "-");
    if (f.size() < 5 || dash == f.end() || dash + 1 == f.end()) continue;
    const std::string& type = *(dash + 1);
    const std::string super = dash + 3 < f.end() ? *(dash + 3) : std::string();
    bool match = false;
    if (version == 2) {
      match = type == "cgroup2";
    } else if (type == "cgroup") {
      std::istringstream opts(super);
      for (std::string o; std::getline(opts, o, ',');) match = match || o == "memory";
    }
    if (match) return Mount{unescape(f[3]), unescape(f[4])};
  }
  if (in.is_open()) return std::nullopt;  // mountinfo was read: no such hierarchy is mounted
  // No mountinfo: the usual places.
  namespace fs = std::filesystem;
  std::error_code ec;
  if (version == 1) return Mount{"/", "/sys/fs/cgroup/memory"};
  if (fs::exists(root + "/sys/fs/cgroup/cgroup.controllers", ec)) return Mount{"/", "/sys/fs/cgroup"};
  return Mount{"/", "/sys/fs/cgroup/unified"};
}

// The tightest limit in `dir` and its parents up to `top` (both under the same root).
void walk_up(std::string dir, const std::string& top, const char* file, int version,
             std::optional<CgroupLimit>& best) {
  while (true) {
    const std::string path = dir + "/" + file;
    if (const std::optional<size_t> v = read_limit(path); v && (!best || *v < best->bytes))
      best = CgroupLimit{*v, version, path};
    if (dir.size() <= top.size()) return;
    const size_t slash = dir.find_last_of('/');
    if (slash == std::string::npos || slash < top.size()) return;
    dir.resize(slash);
  }
}

std::string strip_trailing_slash(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

std::string percent(double fraction) {
  char b[16];
  std::snprintf(b, sizeof b, "%g%%", 100.0 * fraction);
  return b;
}

std::string ranks_text(int n) {
  return std::to_string(n) + (n == 1 ? " rank" : " ranks");
}

}  // namespace

std::optional<CgroupLimit> cgroup_memory_limit(const std::string& root_in) {
  try {
    const std::string root = root_in == "/" ? std::string() : strip_trailing_slash(root_in);
    std::ifstream in(root + "/proc/self/cgroup");
    std::optional<CgroupLimit> best;
    std::string line;
    while (in && std::getline(in, line)) {
      // hierarchy-id:controllers:path (the path may itself contain ':').
      const size_t a = line.find(':');
      const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
      const std::string path = strip_trailing_slash(line.substr(b + 1));
      int version = 0;
      if (id == "0" && controllers.empty()) {
        version = 2;
      } else {
        std::istringstream list(controllers);
        for (std::string c; std::getline(list, c, ',');)
          if (c == "memory") version = 1;
      }
      if (version == 0 || path.empty() || path[0] != '/') continue;
      const std::optional<Mount> m = find_mount(root, version);
      if (!m) continue;
      // The cgroup's directory under the mount: the path minus the part of the hierarchy above
      // what the mount shows. A path outside it (another cgroup namespace) is seen only as the
      // mount itself.
      const std::string mroot = strip_trailing_slash(m->root);
      std::string rel;
      if (mroot == "/") rel = path == "/" ? "" : path;
      else if (path == mroot) rel = "";
      else if (path.rfind(mroot + "/", 0) == 0) rel = path.substr(mroot.size());
      const std::string top = root + strip_trailing_slash(m->point);
      walk_up(top + rel, top, version == 2 ? "memory.max" : "memory.limit_in_bytes", version, best);
    }
    return best;
  } catch (...) {
    return std::nullopt;  // a budget from physical memory alone is still a budget
  }
}

size_t physical_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<size_t>(pages) * static_cast<size_t>(page);
}

MemoryBudget divide_memory(size_t physical, const std::optional<CgroupLimit>& cgroup, int node_ranks,
                           int cgroup_ranks, double fraction) {
  MemoryBudget b;
  b.fraction = fraction;
  b.physical = physical;
  b.node_ranks = std::max(1, node_ranks);
  b.cgroup = cgroup;
  b.cgroup_ranks = std::max(1, cgroup_ranks);
  auto share = [&](size_t total, int ranks) {
    return static_cast<size_t>(fraction * static_cast<double>(total) / ranks);
  };
  const size_t from_physical = physical > 0 ? share(physical, b.node_ranks) : 0;
  const size_t from_cgroup = cgroup ? share(cgroup->bytes, b.cgroup_ranks) : 0;
  b.from_cgroup = cgroup && (physical == 0 || from_cgroup < from_physical);
  b.bytes = b.from_cgroup ? from_cgroup : from_physical;
  if (physical == 0 && !cgroup) {
    b.explanation = "memory budget: unknown (the host's physical memory could not be read and no "
                    "cgroup limit applies): the memory ledger bounds nothing by default";
    return b;
  }
  if (b.from_cgroup) {
    const char* key = cgroup->version == 2 ? "memory.max" : "memory.limit_in_bytes";
    b.reason = percent(fraction) + " of cgroup v" + std::to_string(cgroup->version) + " " + key + " " +
               format_bytes(cgroup->bytes) + " (" + cgroup->file + ") / " + ranks_text(b.cgroup_ranks) +
               " on this node under it";
  } else {
    b.reason = percent(fraction) + " of physical memory " + format_bytes(physical) + " / " +
               ranks_text(b.node_ranks) + " on this node";
    if (cgroup)
      b.reason += "; the cgroup limit " + format_bytes(cgroup->bytes) + " (" + cgroup->file +
                  ") allows more";
  }
  b.explanation = "memory budget: " + format_bytes(b.bytes) + " per rank = " + b.reason;
  return b;
}

MemoryBudget memory_budget(MPI_Comm comm, const std::string& root) {
  const std::optional<CgroupLimit> cgroup = cgroup_memory_limit(root);
  MPI_Comm node = MPI_COMM_NULL;
  ZERO_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int node_ranks = 1, cgroup_ranks = 1;
  try {
    ZERO_CHECK_MPI(MPI_Comm_size(node, &node_ranks));
    // Ranks under the same limit file share it: compare the files' names by hash (two different
    // paths colliding would only make the budget smaller).
    const unsigned long long mine =
        cgroup ? static_cast<unsigned long long>(std::hash<std::string>{}(cgroup->file)) : 0ULL;
    std::vector<unsigned long long> all(static_cast<size_t>(node_ranks));
    ZERO_CHECK_MPI(MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1,
                                 MPI_UNSIGNED_LONG_LONG, node));
    cgroup_ranks = static_cast<int>(std::count(all.begin(), all.end(), mine));
  } catch (...) {
    MPI_Comm_free(&node);
    throw;
  }
  ZERO_CHECK_MPI(MPI_Comm_free(&node));
  return divide_memory(physical_memory_bytes(), cgroup, node_ranks, cgroup_ranks);
}

DeviceOptions device_options(DeviceKind kind, size_t device_limit, size_t host_limit,
                             const MemoryBudget& budget, std::vector<std::string>* warnings) {
  DeviceOptions o;
  o.memory_limit = device_limit;
  auto warn = [&](const std::string& what, size_t bytes) {
    if (warnings && budget.bytes > 0 && bytes > budget.bytes)
      warnings->push_back(what + " " + format_bytes(bytes) + " is more than this rank's " +
                          "memory budget of " + format_bytes(budget.bytes) + " (" + budget.reason +
                          "): past the budget the kernel, not this program, stops the run (the OOM "
                          "killer, without a message). Lower it, or set it to 0 for the budget.");
  };
  if (kind == DeviceKind::cpu) {
    o.host_memory_limit = host_limit;
    o.shared_memory_limit = budget.bytes == 0 ? 0 : std::max(budget.bytes, device_limit + host_limit);
    warn("zero_train.device_memory_limit", device_limit);
    warn("zero_train.host_memory_limit", host_limit);
    if (device_limit > 0 && host_limit > 0 && device_limit <= budget.bytes && host_limit <= budget.bytes)
      warn("on the cpu backend device and host memory are the same RAM, and "
           "zero_train.device_memory_limit + host_memory_limit",
           device_limit + host_limit);
  } else {
    o.host_memory_limit = host_limit > 0 ? host_limit : budget.bytes;
    warn("zero_train.host_memory_limit", host_limit);
  }
  return o;
}

}  // namespace zero::offload
