// The non-template half of json_io.hpp: value conversion, the wording of every "expected ..., got
// ..." message, and the unknown-key check with its did-you-mean.
#include "runtime/config/json_io.hpp"

#include "core/ledger.hpp"  // parse_byte_size

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "runtime/config/text.hpp"

namespace zero::config::detail {

// ---- Session ------------------------------------------------------------------------------------

void Session::error(std::string path, std::string message) {
  diagnostics.push_back({Diagnostic::Severity::error, std::move(path), std::move(message)});
}

void Session::warn(std::string path, std::string message) {
  diagnostics.push_back({Diagnostic::Severity::warning, std::move(path), std::move(message)});
}

Source Session::source(std::string_view path) const {
  const auto it = sources.find(path);
  return it == sources.end() ? Source::absent : it->second;
}

std::size_t Session::error_count() const {
  return static_cast<std::size_t>(std::count_if(
      diagnostics.begin(), diagnostics.end(),
      [](const Diagnostic& d) { return d.severity == Diagnostic::Severity::error; }));
}

void Session::run_deferred() {
  // In registration order: a later "auto" may read an earlier one (warmup_max_lr reads lr).
  for (auto& f : deferred) f();
  deferred.clear();
}

// ---- values -------------------------------------------------------------------------------------

bool is_auto(const Json& v) { return v.is_string() && v.get_ref<const std::string&>() == "auto"; }

std::string describe(const Json& v) {
  constexpr std::size_t kMax = 60;  // keep a pasted object from flooding the message
  std::string text = v.dump();
  if (text.size() > kMax) text = text.substr(0, kMax - 3) + "...";
  switch (v.type()) {
    case Json::value_t::string: return text + " (a string)";
    case Json::value_t::boolean: return text + " (a boolean)";
    case Json::value_t::array: return text + " (a list)";
    case Json::value_t::object: return text + " (an object)";
    default: return text;
  }
}

std::string to_text(double v) { return format_number(v); }
std::string to_text(long long v) { return std::to_string(v); }

bool convert(const Json& v, bool& out) {
  if (!v.is_boolean()) return false;
  out = v.get<bool>();
  return true;
}

bool convert(const Json& v, long long& out) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<long long>::max())) return false;
    out = static_cast<long long>(u);
    return true;
  }
  if (v.is_number_integer()) {
    out = v.get<long long>();
    return true;
  }
  if (v.is_number_float()) {  // 5e8 is a float in JSON; accept it when it is a whole number
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::trunc(d) || d < -9.2e18 || d > 9.2e18) return false;
    out = static_cast<long long>(d);
    return true;
  }
  return false;
}

bool convert(const Json& v, int& out) {
  long long x = 0;
  if (!convert(v, x) || x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
    return false;
  out = static_cast<int>(x);
  return true;
}

bool convert(const Json& v, double& out) {
  if (!v.is_number()) return false;
  out = v.get<double>();
  return std::isfinite(out);
}

bool convert(const Json& v, std::string& out) {
  if (!v.is_string()) return false;
  out = v.get<std::string>();
  return true;
}

bool convert(const Json& v, std::array<double, 2>& out) {
  if (!v.is_array() || v.size() != 2) return false;
  return convert(v[0], out[0]) && convert(v[1], out[1]);
}

bool within(double v, const Range& r) {
  if (r.min && (r.min_open ? !(v > *r.min) : !(v >= *r.min))) return false;
  if (r.max && (r.max_open ? !(v < *r.max) : !(v <= *r.max))) return false;
  return true;
}

std::string range_text(const Range& r, bool integer) {
  const auto n = [](double x) { return format_number(x); };
  if (r.min && r.max) {
    if (integer && !r.min_open && !r.max_open) return " in " + n(*r.min) + ".." + n(*r.max);
    return std::string(" in ") + (r.min_open ? "(" : "[") + n(*r.min) + ", " + n(*r.max) +
           (r.max_open ? ")" : "]");
  }
  if (r.min) return (r.min_open ? " > " : " >= ") + n(*r.min);
  if (r.max) return (r.max_open ? " < " : " <= ") + n(*r.max);
  return "";
}

// ---- Reader -------------------------------------------------------------------------------------

Reader::Reader(Session& session, const Json& object, std::string path, bool given, Unknown unknown,
               std::span<const std::string_view> ignored)
    : session_(session),
      object_(object),
      path_(std::move(path)),
      given_(given),
      unknown_(unknown),
      ignored_(ignored) {}

const Json* Reader::find(std::string_view name) const {
  const auto it = object_.find(name);
  return it == object_.end() ? nullptr : &*it;
}

void Reader::known(std::string_view name) {
  if (std::find(known_.begin(), known_.end(), name) == known_.end()) known_.emplace_back(name);
}

std::string Reader::path_of(std::string_view name) const {
  return path_.empty() ? std::string(name) : path_ + "." + std::string(name);
}

void Reader::error(std::string_view name, std::string message) {
  session_.error(path_of(name), std::move(message));
}

void Reader::warn(std::string_view name, std::string message) {
  session_.warn(path_of(name), std::move(message));
}

void Reader::bytes(std::string_view name, long long& member) {
  known(name);
  const Json* v = find(name);
  const std::string at = path_of(name);
  session_.sources[at] = v == nullptr ? Source::absent : Source::value;
  if (v == nullptr) return;
  long long x = 0;
  if (v->is_string()) {
    if (const auto b = zero::parse_byte_size(v->get_ref<const std::string&>())) {
      member = *b;
      return;
    }
  } else if (convert(*v, x) && x >= 0) {
    member = x;
    return;
  }
  wrong(at, *v,
        "a byte count: an integer >= 0 or a string such as \"24GiB\", \"512MiB\", \"1.5GB\" "
        "(0 = no limit)");
}

void Reader::finish() {
  std::vector<std::string_view> candidates(known_.begin(), known_.end());
  if (unknown_ == Unknown::warn) candidates.insert(candidates.end(), ignored_.begin(), ignored_.end());
  std::size_t unknown = 0;
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(known_.begin(), known_.end(), k) != known_.end()) continue;
    if (++unknown > kMaxUnknownListed) continue;  // counted below
    const std::string_view near = nearest(k, candidates);
    if (unknown_ == Unknown::error) {
      error(k, "unknown key; did you mean '" + std::string(near) + "'?");
    } else if (std::find(ignored_.begin(), ignored_.end(), k) != ignored_.end()) {
      warn(k, "ignored: not used by zero-train");
    } else if (!near.empty() && is_close(k, near)) {
      warn(k, "unknown key, ignored; did you mean '" + std::string(near) + "'?");
    } else {
      warn(k, "unknown key, ignored (DeepSpeed ignores it too)");
    }
  }
  if (unknown > kMaxUnknownListed) {
    const std::string more = std::to_string(unknown - kMaxUnknownListed) + " more unknown keys in " +
                             (path_.empty() ? std::string("the top-level object") : "'" + path_ + "'") +
                             " (not listed)";
    if (unknown_ == Unknown::error) session_.error(path_, more + "; remove them");
    else session_.warn(path_, more + ", ignored");
  }
}

void Reader::deprecated_alias(std::string_view alias, std::string_view name) {
  warn(alias, "deprecated name; use '" + path_of(name) + "' instead");
}

void Reader::alias_conflict(std::string_view alias, const Json& alias_value, std::string_view name,
                            const Json& value) {
  error(alias, "is " + alias_value.dump() + " but '" + path_of(name) + "' (the same setting) is " +
                   value.dump() + "; keep only '" + std::string(name) + "'");
}

void Reader::no_auto(const std::string& at, const std::string& expected) {
  session_.error(at, "\"auto\" is not supported for this key (there is no rule to derive it); "
                     "expected " + expected);
}

void Reader::wrong(const std::string& at, const Json& v, const std::string& expected,
                   std::string_view hint) {
  session_.error(at, "expected " + expected + ", got " + describe(v) +
                         (hint.empty() ? "" : "; " + std::string(hint)));
}

void Reader::not_implemented(const std::string& at, const std::string& value,
                             const std::string& def) {
  session_.warn(at, "accepted but not implemented yet: " + value + " has no effect (runs as the "
                    "default, " + def + ")");
}

void Reader::flag_conflict(const std::string& at, const Json& v, std::string_view flag_name,
                           const std::string& flag_value) {
  session_.error(at, "the file says " + v.dump() + " but " + std::string(flag_name) + " says " +
                         flag_value + "; remove one of them (or set the key to \"auto\" to take "
                         "the flag)");
}

int Reader::choose(const Json& v, std::span<const std::string_view> names,
                   bool case_insensitive) const {
  if (!v.is_string()) return -1;
  const std::string& s = v.get_ref<const std::string&>();
  const auto eq = [&](std::string_view a) {
    if (a.size() != s.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      const bool same = case_insensitive
                            ? std::tolower(static_cast<unsigned char>(a[i])) ==
                                  std::tolower(static_cast<unsigned char>(s[i]))
                            : a[i] == s[i];
      if (!same) return false;
    }
    return true;
  };
  for (std::size_t i = 0; i < names.size(); ++i)
    if (eq(names[i])) return static_cast<int>(i);
  return -1;
}

void Reader::bad_choice(const std::string& at, const Json* v,
                        std::span<const std::string_view> names, const ChoiceOpts& opts) {
  std::string list;
  for (std::size_t i = 0; i < names.size(); ++i)
    list += (i ? ", \"" : "\"") + std::string(names[i]) + "\"";
  std::string message = std::string(v == nullptr ? "missing: " : "") + "expected one of " + list;
  if (opts.case_insensitive) message += " (any case)";
  if (opts.nullable) message += ", or null";
  if (v != nullptr) message += ", got " + describe(*v);
  if (opts.suggest && v != nullptr && v->is_string() && !names.empty())
    message += "; did you mean \"" + std::string(nearest(v->get<std::string>(), names)) + "\"?";
  if (!opts.hint.empty()) message += "; " + std::string(opts.hint);
  session_.error(at, std::move(message));
}

}  // namespace zero::config::detail
