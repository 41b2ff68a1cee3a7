// The shared shape of every benchmark (see docs/benchmarks.md): timing as median/min/max over
// repetitions after warm-up, results with the reference measured in the same run, the ratio and
// the goal computed (never typed in), printed as one JSON document on stdout.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace zero::bench {

struct Stats {
  double median = 0, min = 0, max = 0;
  int reps = 0;
};

// Runs fn `warmup` times untimed, then `reps` times timed; seconds per call.
Stats time_it(int warmup, int reps, const std::function<void()>& fn);
// Median (mean of the two middle values for an even count), min and max of measured seconds.
Stats stats_of(std::vector<double> seconds);
// A steady clock in seconds.
double now_seconds();
// Turns seconds per call into items per second
// (median of rates = items / median time; min rate = items / max time).
Stats rate(double items, const Stats& seconds);

struct Goal {
  std::string kind;  // "ratio_at_least", "ratio_at_most", "ratio_equals" (exact), ...
  double value = 0;
};

struct Result {
  std::string name;
  nlohmann::json params = nlohmann::json::object();
  std::string metric;  // "throughput", "bandwidth", "time", "bytes", "fraction"
  std::string unit;
  Stats value;
  std::string reference_name;  // empty: no reference
  double reference_median = 0;
  std::optional<Goal> goal;
};

// Command-line handling shared by all benchmarks: --quick, --help.
struct Options {
  bool quick = false;
};
// Exits 0 on --help (printing `usage`), 2 on an unknown flag.
Options parse_options(int argc, char** argv, const char* usage);

class Report {
 public:
  Report(std::string benchmark, int argc, char** argv, bool quick, int ranks, int threads);
  void add(Result r);
  // One JSON document, per ../shared/BENCH.md: ratio = ours / reference for throughput and
  // bandwidth, reference / ours for time and bytes; meets_goal computed from ratio and goal.
  nlohmann::json to_json() const;
  void print() const;  // to stdout

 private:
  nlohmann::json doc_;
};

}  // namespace zero::bench
