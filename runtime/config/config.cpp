// The JSON-free part of the public API: reading the file, formatting diagnostics, names of enums.
#include "runtime/config/config.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace zero::config {

std::string_view to_string(Precision p) noexcept {
  switch (p) {
    case Precision::fp16: return "fp16";
    case Precision::bf16: return "bf16";
    case Precision::fp32: break;
  }
  return "fp32";
}

std::string_view to_string(OptimizerType t) noexcept {
  return t == OptimizerType::Adam ? "Adam" : "AdamW";
}

std::string_view to_string(OffloadDevice d) noexcept {
  switch (d) {
    case OffloadDevice::cpu: return "cpu";
    case OffloadDevice::nvme: return "nvme";
    case OffloadDevice::none: break;
  }
  return "none";
}

std::string_view to_string(PipelineSchedule s) noexcept {
  switch (s) {
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::zb_h1: return "zb-h1";
    case PipelineSchedule::one_f_one_b: break;
  }
  return "1f1b";
}

std::string_view to_string(StagePartition p) noexcept {
  switch (p) {
    case StagePartition::uniform: return "uniform";
    case StagePartition::flops: return "flops";
    case StagePartition::parameters: break;
  }
  return "parameters";
}

std::string_view Scheduler::type_name() const noexcept {
  constexpr std::string_view kNames[] = {"",         "WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                         "OneCycle", "LRRangeTest"};
  return kNames[params.index()];
}

Precision Config::precision() const noexcept {
  if (fp16.enabled) return Precision::fp16;
  if (bf16.enabled) return Precision::bf16;
  return Precision::fp32;
}

Precision Config::communication_precision() const noexcept {
  return communication_data_type.value_or(precision());
}

bool LoadResult::ok() const noexcept {
  return std::none_of(diagnostics.begin(), diagnostics.end(), [](const Diagnostic& d) {
    return d.severity == Diagnostic::Severity::error;
  });
}

std::string format_diagnostic(const Diagnostic& d, std::string_view source_name) {
  std::string line(source_name);
  line += d.severity == Diagnostic::Severity::error ? ": error: " : ": warning: ";
  if (!d.path.empty()) line += d.path + ": ";
  line += d.message;
  return line;
}

LoadResult load_config_file(const std::string& path, const Environment& env) {
  const auto fail = [&](const std::string& why) {
    LoadResult r;
    r.diagnostics.push_back({Diagnostic::Severity::error, "",
                             "cannot read config file '" + path + "': " + why +
                                 "; check the --config path"});
    return r;
  };
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return fail("it is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return fail(std::strerror(errno));
  return parse_config(text.str(), path, env);
}

}  // namespace zero::config
