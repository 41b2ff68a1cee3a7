#include "bench/common/report.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <thread>

namespace zero::bench {

Stats time_it(int warmup, int reps, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    fn();
    auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  return stats_of(std::move(t));
}

Stats stats_of(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  Stats s;
  const int n = static_cast<int>(t.size());
  s.reps = n;
  if (n == 0) return s;
  s.min = t.front();
  s.max = t.back();
  s.median = n % 2 ? t[static_cast<size_t>(n / 2)] : 0.5 * (t[static_cast<size_t>(n / 2 - 1)] + t[static_cast<size_t>(n / 2)]);
  return s;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Stats rate(double items, const Stats& seconds) {
  Stats r;
  r.reps = seconds.reps;
  r.median = items / seconds.median;
  r.min = items / seconds.max;
  r.max = items / seconds.min;
  return r;
}

Options parse_options(int argc, char** argv, const char* usage) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) {
      o.quick = true;
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::fputs(usage, stdout);
      std::exit(0);
    } else {
      std::fprintf(stderr, "error: unknown flag '%s'\n%s", argv[i], usage);
      std::exit(2);
    }
  }
  return o;
}

namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto p = line.find(':');
      if (p != std::string::npos) return line.substr(p + 2);
    }
  return "unknown";
}

std::string git_revision() {
  std::string out;
  if (std::FILE* p = popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
    char buf[64];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

Report::Report(std::string benchmark, int argc, char** argv, bool quick, int ranks, int threads) {
  // The exact command, with the launcher for multi-rank runs.
  std::string command = ranks > 1 ? "mpirun -np " + std::to_string(ranks) + " " : "";
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  doc_ = {{"benchmark", benchmark},
          {"version", 1},
          {"date", utc_now()},
          {"git", git_revision()},
          {"command", command},
          {"machine",
           {{"cpu", cpu_model()},
            {"cores", std::thread::hardware_concurrency()},
            {"gpu", nullptr},
            {"ranks", ranks},
            {"threads", threads}}},
          {"quick", quick},
          {"results", nlohmann::json::array()}};
}

void Report::add(Result r) {
  nlohmann::json j = {{"name", r.name},   {"params", r.params}, {"metric", r.metric},
                      {"unit", r.unit},   {"median", r.value.median},
                      {"min", r.value.min}, {"max", r.value.max}, {"reps", r.value.reps}};
  std::optional<double> ratio;
  if (!r.reference_name.empty()) {
    j["reference"] = {{"name", r.reference_name}, {"median", r.reference_median}};
    const bool higher_is_better = r.metric == "throughput" || r.metric == "bandwidth" ||
                                  r.metric == "fraction";
    ratio = higher_is_better ? r.value.median / r.reference_median
                             : r.reference_median / r.value.median;
    j["ratio"] = *ratio;
  }
  if (r.goal) {
    j["goal"] = {{r.goal->kind, r.goal->value}};
    if (ratio && r.goal->kind == "ratio_at_least")
      j["meets_goal"] = *ratio >= r.goal->value;
    else if (ratio && r.goal->kind == "ratio_at_most")
      j["meets_goal"] = *ratio <= r.goal->value;
    else if (ratio && r.goal->kind == "ratio_equals")  // counts against formulas: exact
      j["meets_goal"] = *ratio == r.goal->value;
    else
      j["meets_goal"] = nullptr;
  }
  doc_["results"].push_back(std::move(j));
}

nlohmann::json Report::to_json() const { return doc_; }

void Report::print() const { std::printf("%s\n", doc_.dump(2).c_str()); }

}  // namespace zero::bench
