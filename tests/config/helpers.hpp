// Shared by the tests of runtime/config: parse a snippet, find the diagnostic at a JSON path.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/config/config.hpp"

namespace zero::config::test {

using Severity = Diagnostic::Severity;

inline Environment world(int n) {
  Environment e;
  e.world_size = n;
  return e;
}

inline LoadResult parse(std::string_view text, const Environment& env = {}) {
  return parse_config(text, "test.json", env);
}

// `body` (top-level members, comma-separated) after a batch that is valid on any world size.
inline LoadResult parse_with(std::string_view body, const Environment& env = {}) {
  std::string text = "{\"train_micro_batch_size_per_gpu\": 1";
  if (!body.empty()) text += ", " + std::string(body);
  return parse(text + "}", env);
}

// Every diagnostic, formatted, one per line: what a failing CHECK prints.
inline std::string all(const LoadResult& r) {
  std::string out;
  for (const Diagnostic& d : r.diagnostics) out += format_diagnostic(d, "test.json") + "\n";
  return out;
}

inline std::size_t count(const LoadResult& r, Severity s) {
  std::size_t n = 0;
  for (const Diagnostic& d : r.diagnostics) n += d.severity == s ? 1 : 0;
  return n;
}

// The message of the diagnostic of severity `s` at `path`; "" when there is none, and all
// messages joined with " | " when there are several.
inline std::string message_at(const LoadResult& r, std::string_view path,
                              Severity s = Severity::error) {
  std::string out;
  for (const Diagnostic& d : r.diagnostics)
    if (d.severity == s && d.path == path) out += (out.empty() ? "" : " | ") + d.message;
  return out;
}

inline std::string data_file(std::string_view name) {
  return std::string(ZERO_TEST_DATA_DIR) + "/configs/" + std::string(name);
}

}  // namespace zero::config::test
