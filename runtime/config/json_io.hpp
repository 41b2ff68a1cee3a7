// The two sides of every config block (private to runtime/config; pulls in nlohmann-json, so
// only json_io.cpp, blocks.cpp, zero_block.cpp and parallel_block.cpp include it).
//
// Each block is described once, by a function template over an `Io`:
//
//   template <class Io> void visit(Io& io, Fp16& f) {
//     io.key("enabled", f.enabled, {.auto_value = false});
//     io.key("hysteresis", f.hysteresis, {.min = 1});
//     ...
//   }
//
// With a Reader, io.key() reads the key into the member (leaving the default, the member's
// initializer, when the key is absent), checks its type and range, resolves "auto", command-line
// flags and aliases, and records a diagnostic for anything wrong; Reader::finish() then reports
// the keys nobody asked for. With a Writer, the same calls print every member under its
// DeepSpeed name: that is the effective config. Code that only makes sense while reading sits in
// `if constexpr (Io::reading)`.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/config/batch.hpp"
#include "runtime/config/config.hpp"

namespace zero::config::detail {

// Insertion-ordered: diagnostics come in file order, the effective config in visit order.
using Json = nlohmann::ordered_json;

// How a key appeared in the file.
enum class Source { absent, value, auto_value };

// What one parse shares between its readers. Lives on parse_config's stack.
struct Session {
  const Environment& env;
  std::vector<Diagnostic>& diagnostics;
  std::map<std::string, Source, std::less<>> sources;  // every key read, by JSON path
  std::vector<std::function<void()>> deferred;  // "auto" values known once every block is read

  void error(std::string path, std::string message);
  void warn(std::string path, std::string message);
  Source source(std::string_view path) const;
  std::size_t error_count() const;
  void run_deferred();
};

// Another name a key is read under. deprecated: warn that the key has a new name.
struct AliasOf {
  std::string_view name{};
  bool deprecated = true;
};

// Bounds of a number (or of each element of a list of numbers).
struct Range {
  std::optional<double> min{}, max{};
  bool min_open = false, max_open = false;
};

// How io.key() treats one key. Written with designated initializers: {.min = 1}. (The `{}`
// initializers keep g++'s -Wmissing-field-initializers quiet about the members left out.)
template <class T>
struct Opts {
  std::optional<double> min{};             // lower bound (numbers; each element of a list)
  std::optional<double> max{};             // upper bound
  bool min_open = false;                   // the lower bound itself is not allowed
  bool max_open = false;                   // the upper bound itself is not allowed
  std::optional<T> auto_value{};           // what "auto" means, known now
  std::function<T()> auto_later{};         // what "auto" means, once every block is read
  const std::optional<T>* flag = nullptr;  // a command-line value: fills an absent or "auto" key
  std::string_view flag_name{};            // the flag's spelling, for messages
  std::vector<AliasOf> aliases{};          // other names of the key
  bool required = false;                   // absent is an error
  bool not_implemented = false;            // warn when set to something other than the default
  std::string_view hint{};                 // why the upper bound (told when a value is above it)

  Range range() const { return {min, max, min_open, max_open}; }
};

// One allowed string of a choice key and the value it stands for. The first entry with a
// given value is the spelling printed.
template <class E>
struct Choice {
  std::string_view name;
  E value;
};

struct ChoiceOpts {
  bool case_insensitive = false;  // "adamw" == "AdamW"
  bool nullable = false;          // null gives E{}
  bool required = false;          // absent is an error
  bool suggest = false;           // a wrong string also gets "did you mean" the nearest choice
  std::string_view hint{};        // appended to the "expected one of" message
};

// ---- parsing (json_parse.cpp) --------------------------------------------------------------------

// Parses `text` into `out` in time linear in its length. Duplicate keys are errors (DeepSpeed
// rejects them; a JSON parser would keep the last), listed up to a bound, then counted. Returns
// false, with one error naming line and column, on a syntax error, a number too large for a
// double (1e999) or nesting too deep for a config. Errors are reported at `base_path` and
// below (the JSON path `text` stands for: "" for the file) and start with "<origin>: " when
// origin is not empty (a command-line flag's value).
bool parse_json(std::string_view text, Session& s, Json& out, std::string base_path = "",
                std::string_view origin = "");

// ---- value conversion and messages (json_io.cpp) ------------------------------------------------

bool is_auto(const Json& v);
std::string describe(const Json& v);  // the offending value, for "got ..." ("\"3\" (a string)")
std::string to_text(double v);
std::string to_text(long long v);

// JSON value -> member type; false when the type does not fit (5.5 for an integer, "true" for
// a boolean). Integers accept integral floats (5e8).
bool convert(const Json& v, bool& out);
bool convert(const Json& v, int& out);
bool convert(const Json& v, long long& out);
bool convert(const Json& v, double& out);
bool convert(const Json& v, std::string& out);
bool convert(const Json& v, std::array<double, 2>& out);
template <class T>
bool convert(const Json& v, std::optional<T>& out) {
  if (v.is_null()) {
    out.reset();
    return true;
  }
  T x{};
  if (!convert(v, x)) return false;
  out = std::move(x);
  return true;
}

bool within(double v, const Range& r);
inline bool within(long long v, const Range& r) { return within(static_cast<double>(v), r); }
inline bool within(int v, const Range& r) { return within(static_cast<double>(v), r); }
inline bool within(bool, const Range&) { return true; }
inline bool within(const std::string&, const Range&) { return true; }
inline bool within(const std::array<double, 2>& a, const Range& r) {
  return within(a[0], r) && within(a[1], r);
}
template <class T>
bool within(const std::optional<T>& v, const Range& r) {
  return !v || within(*v, r);
}

// Whether a number is beyond the upper bound (where Opts::hint explains the bound).
template <class T>
bool above_max(const T& v, const Range& r) {
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
    return r.max && (r.max_open ? !(static_cast<double>(v) < *r.max) : static_cast<double>(v) > *r.max);
  else return false;
}

std::string range_text(const Range& r, bool integer);  // " >= 1", " in 0..3", " in [0, 1)"
template <class T>
std::string expected_text(const Range& r) {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_integral_v<T>) return "an integer" + range_text(r, true);
  else if constexpr (std::is_same_v<T, double>) return "a number" + range_text(r, false);
  else if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_same_v<T, std::array<double, 2>>)
    return "a list of 2 numbers" + (r.min || r.max ? ", each" + range_text(r, false) : "");
  else return expected_text<typename T::value_type>(r) + ", or null";
}

inline Json to_json(bool v) { return v; }
inline Json to_json(int v) { return v; }
inline Json to_json(long long v) { return v; }
inline Json to_json(double v) { return v; }
inline Json to_json(const std::string& v) { return v; }
inline Json to_json(const std::array<double, 2>& v) { return Json::array({v[0], v[1]}); }
template <class T>
Json to_json(const std::optional<T>& v) {
  return v ? to_json(*v) : Json(nullptr);
}

template <class T>
std::string value_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>) return v ? "true" : "false";
  else if constexpr (std::is_integral_v<T>) return to_text(static_cast<long long>(v));
  else if constexpr (std::is_same_v<T, double>) return to_text(v);
  else return to_json(v).dump();
}

// ---- Reader -------------------------------------------------------------------------------------

class Reader {
 public:
  static constexpr bool reading = true;

  // How keys nobody asked for are reported: inside a block, an error naming the nearest valid
  // key; at the top level, a warning (DeepSpeed ignores them), "ignored" for the DeepSpeed
  // features listed in `ignored`.
  enum class Unknown { error, warn };

  // `object` must outlive the Reader. path: the JSON path of `object` ("" for the top level).
  Reader(Session& session, const Json& object, std::string path, bool given,
         Unknown unknown = Unknown::error, std::span<const std::string_view> ignored = {});

  template <class T>
  void key(std::string_view name, T& member, const Opts<std::type_identity_t<T>>& opts = {});

  template <class E>
  void choice(std::string_view name, E& member, std::span<const Choice<std::type_identity_t<E>>> table,
              const ChoiceOpts& opts = {});

  // A byte count: an integer >= 0 or a string like "24GiB" (parse_byte_size).
  void bytes(std::string_view name, long long& member);

  // A nested block: `visit(Reader&, B&)` reads it; absent or null reads as {} (defaults).
  template <class B, class F>
  void block(std::string_view name, B& member, F&& visit);

  // Reports the keys no call above asked for: the first kMaxUnknownListed one by one, the rest
  // counted in one more diagnostic (linear in the object's size). Call once, after the visit.
  void finish();
  static constexpr std::size_t kMaxUnknownListed = 20;

  // For code that needs more than the calls above.
  const Json* find(std::string_view name) const;  // the raw value, or null
  void known(std::string_view name);              // accept `name` without reading it
  std::string path_of(std::string_view name) const;
  const std::string& path() const { return path_; }
  bool given() const { return given_; }  // the block was in the file (not filled in for absent)
  Session& session() const { return session_; }
  const Environment& env() const { return session_.env; }
  void error(std::string_view name, std::string message);
  void warn(std::string_view name, std::string message);

 private:
  void deprecated_alias(std::string_view alias, std::string_view name);
  void alias_conflict(std::string_view alias, const Json& alias_value, std::string_view name,
                      const Json& value);
  void no_auto(const std::string& at, const std::string& expected);
  void wrong(const std::string& at, const Json& v, const std::string& expected,
             std::string_view hint = {});
  void not_implemented(const std::string& at, const std::string& value, const std::string& def);
  void flag_conflict(const std::string& at, const Json& v, std::string_view flag_name,
                     const std::string& flag_value);
  int choose(const Json& v, std::span<const std::string_view> names, bool case_insensitive) const;
  void bad_choice(const std::string& at, const Json* v, std::span<const std::string_view> names,
                  const ChoiceOpts& opts);  // v null: the key is missing

  Session& session_;
  const Json& object_;
  std::string path_;
  bool given_;
  Unknown unknown_;
  std::span<const std::string_view> ignored_;
  std::vector<std::string> known_;
};

template <class T>
void Reader::key(std::string_view name, T& member, const Opts<std::type_identity_t<T>>& opts) {
  known(name);
  for (const AliasOf& a : opts.aliases) known(a.name);
  const Json* v = find(name);
  std::string at = path_of(name);
  const std::string canonical = at;
  for (const AliasOf& a : opts.aliases) {
    const Json* av = find(a.name);
    if (av == nullptr) continue;
    if (a.deprecated) deprecated_alias(a.name, name);
    if (v != nullptr && !(*v == *av)) {
      alias_conflict(a.name, *av, name, *v);
      continue;
    }
    if (v == nullptr) v = av, at = path_of(a.name);
  }
  const Range range = opts.range();
  const T before = member;
  const bool flag = opts.flag != nullptr && opts.flag->has_value();
  Source source = Source::absent;
  if (v == nullptr) {
    if (opts.required) session_.error(at, "missing: expected " + expected_text<T>(range));
    else if (flag) member = **opts.flag;
  } else if (is_auto(*v)) {
    source = Source::auto_value;
    if (flag) member = **opts.flag;
    else if (opts.auto_value) member = *opts.auto_value;
    else if (opts.auto_later) session_.deferred.push_back([&member, f = opts.auto_later] { member = f(); });
    else no_auto(at, expected_text<T>(range));
  } else {
    source = Source::value;
    T x{};
    if (!convert(*v, x)) {
      wrong(at, *v, expected_text<T>(range));
    } else if (!within(x, range)) {
      wrong(at, *v, expected_text<T>(range), above_max(x, range) ? opts.hint : std::string_view());
    } else {
      member = std::move(x);
      if (flag && !(**opts.flag == member)) flag_conflict(at, *v, opts.flag_name, value_text(**opts.flag));
    }
  }
  session_.sources[canonical] = source;
  if (opts.not_implemented && !(member == before))
    not_implemented(at, value_text(member), value_text(before));
}

template <class E>
void Reader::choice(std::string_view name, E& member, std::span<const Choice<std::type_identity_t<E>>> table,
                    const ChoiceOpts& opts) {
  known(name);
  const Json* v = find(name);
  const std::string at = path_of(name);
  std::vector<std::string_view> names;
  for (const Choice<E>& c : table) names.push_back(c.name);
  Source source = Source::absent;
  if (v == nullptr) {
    if (opts.required) bad_choice(at, nullptr, names, opts);
  } else if (v->is_null() && opts.nullable) {
    source = Source::value;
    member = E{};
  } else {
    source = Source::value;  // "auto" only counts as a value where the table lists it
    const int i = choose(*v, names, opts.case_insensitive);
    if (i >= 0) member = table[static_cast<std::size_t>(i)].value;
    else bad_choice(at, v, names, opts);
  }
  session_.sources[at] = source;
}

template <class B, class F>
void Reader::block(std::string_view name, B& member, F&& visit) {
  static const Json kEmpty = Json::object();
  known(name);
  const Json* v = find(name);
  const Json* object = &kEmpty;
  if (v != nullptr && v->is_object()) object = v;
  else if (v != nullptr && !v->is_null()) wrong(path_of(name), *v, "an object");
  Reader child(session_, *object, path_of(name), v != nullptr && v->is_object());
  visit(child, member);
  child.finish();
}

// ---- Writer -------------------------------------------------------------------------------------

class Writer {
 public:
  static constexpr bool reading = false;

  template <class T>
  void key(std::string_view name, T& member, const Opts<std::type_identity_t<T>>& = {}) {
    out_[std::string(name)] = to_json(member);
  }

  template <class E>
  void choice(std::string_view name, E& member, std::span<const Choice<std::type_identity_t<E>>> table,
              const ChoiceOpts& = {}) {
    Json v = nullptr;  // a nullable value outside the table (communication_data_type null)
    for (const Choice<E>& c : table)
      if (c.value == member) {
        v = std::string(c.name);
        break;
      }
    out_[std::string(name)] = std::move(v);
  }

  void bytes(std::string_view name, long long& member) { out_[std::string(name)] = member; }

  template <class B, class F>
  void block(std::string_view name, B& member, F&& visit) {
    Writer child;
    visit(child, member);
    out_[std::string(name)] = std::move(child.out_);
  }

  bool given() const { return true; }
  const Environment& env() const {
    static const Environment kNone;
    return kNone;
  }
  const Json& json() const { return out_; }

 private:
  Json out_ = Json::object();
};

}  // namespace zero::config::detail

namespace zero::config::detail {

// zero_block.cpp: the "zero_optimization" block at the top level, including its legacy forms
// (true | false | a stage number) and the deprecated cpu_offload* keys. `ours` gives the hidden
// size for the "auto" bucket sizes (read when the deferred "auto" values run).
void visit_zero_optimization(Reader& top, Zero& zero, const Ours& ours);
void visit_zero_optimization(Writer& top, Zero& zero, const Ours& ours);

// parallel_block.cpp: the process grid. zero_train.parallel is read inside zero_train
// (visit_parallel); DeepSpeed's top-level "pipeline" block by visit_ds_pipeline, which keeps
// its "stages" and "partition" in `ds` for resolve_grid. resolve_grid runs once both are read:
// it merges them (disagreement is an error naming both paths), checks the grid against
// env.world_size and sets Parallel::data; it returns the data-parallel size for the batch rule
// (0 when the grid is invalid, reported).
struct DsPipelineInput {
  std::optional<int> stages;                 // pipeline.stages; nullopt: absent or "auto"
  std::optional<StagePartition> partition;   // pipeline.partition; nullopt: absent or "best"
};
void visit_parallel(Reader& io, Parallel& p);
void visit_parallel(Writer& io, Parallel& p);
void visit_ds_pipeline(Reader& top, DsPipeline& ds, DsPipelineInput& in);
void visit_ds_pipeline(Writer& top, DsPipeline& ds);
DataParallel resolve_grid(Session& s, Parallel& p, const DsPipelineInput& ds);

}  // namespace zero::config::detail
