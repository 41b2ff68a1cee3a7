// The config's JSON text -> Json, in time linear in the text's length, whatever the input.
//
// nlohmann's own parser keeps an ordered_json object as a vector and looks every new key up in
// it, so an object of n keys costs n^2/2 string comparisons (a million keys: hours). Here a SAX
// handler builds the same Json, appending each key to its object's vector and finding duplicates
// in a hash set per open object. It also refuses what later code could not survive: nesting
// deeper than kMaxDepth (dump() and the readers recurse) and numbers no double holds (1e999,
// which nlohmann reports as an out_of_range exception rather than a parse error).
#include <algorithm>
#include <deque>
#include <string>
#include <unordered_set>
#include <vector>

#include "runtime/config/json_io.hpp"

namespace zero::config::detail {
namespace {

// A ds_config.json is at most 4 levels deep (zero_optimization.offload_param.device); 64 leaves
// room for any data a user keeps in an ignored section while keeping recursion shallow.
constexpr std::size_t kMaxDepth = 64;
// Duplicate keys are listed one by one up to this many, then counted: a file made of copies of
// one key gets one paragraph, not a million lines.
constexpr std::size_t kMaxListed = 20;

struct LineColumn {
  std::size_t line, column;
};

// `chars_read` counts the characters read, the offending one included.
LineColumn locate(std::string_view text, std::size_t chars_read) {
  const std::size_t at = std::min<std::size_t>(chars_read == 0 ? 0 : chars_read - 1, text.size());
  std::size_t line = 1, line_start = 0;
  for (std::size_t i = 0; i < at; ++i)
    if (text[i] == '\n') ++line, line_start = i + 1;
  return {line, at - line_start + 1};
}

class Builder {
 public:
  Builder(std::string_view text, Session& s, std::string base, std::string_view origin, Json& out)
      : text_(text), s_(s), base_(std::move(base)), origin_(origin), out_(out) {}

  // ---- nlohmann's SAX interface -----------------------------------------------------------------
  bool null() { return put(Json(nullptr)); }
  bool boolean(bool v) { return put(Json(v)); }
  bool number_integer(Json::number_integer_t v) { return put(Json(v)); }
  bool number_unsigned(Json::number_unsigned_t v) { return put(Json(v)); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return put(Json(v)); }
  bool string(Json::string_t& v) { return put(Json(std::move(v))); }
  bool binary(Json::binary_t&) { return put(Json(nullptr)); }  // never produced from JSON text

  bool start_object(std::size_t) { return open(Json::object(), false); }
  bool start_array(std::size_t) { return open(Json::array(), true); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(Json::string_t& k) {
    Frame& top = stack_.back();
    top.key = k;
    if (top.keys.insert(k).second) {
      auto& object = top.value->get_ref<Json::object_t&>();
      object.emplace_back(std::move(k), nullptr);  // ordered_map is a vector: no lookup
      pending_ = &object.back().second;
      return true;
    }
    // A duplicate: its value is parsed into a discarded slot (the first one stays).
    if (++duplicates_ <= kMaxListed)
      s_.error(path(), prefix() + "duplicate key: it appears twice in the same object (DeepSpeed rejects "
                       "this too); keep one");
    pending_ = &discarded_.emplace_back();
    return true;
  }

  bool parse_error(std::size_t position, const std::string& token, const nlohmann::detail::exception& e) {
    // For a number, `position` is just past it: point at its first character.
    const bool number = e.id == 406;
    const LineColumn at =
        locate(text_, number && position >= token.size() ? position - token.size() + 1 : position);
    const std::string where =
        "line " + std::to_string(at.line) + ", column " + std::to_string(at.column);
    if (number) {  // beyond the largest double
      const std::string shown = token.size() > 40 ? token.substr(0, 37) + "..." : token;
      s_.error(path(), prefix() + "the number " + shown + " at " + where +
                                 " is too large for a 64-bit floating-point number; write a "
                                 "finite value");
      return false;
    }
    std::string what = e.what();
    // nlohmann: "[json.exception.parse_error.101] parse error at line 3, column 5: <what>".
    if (const auto colon = what.find(": ", what.find("parse error")); colon != std::string::npos)
      what = what.substr(colon + 2);
    const bool blank = text_.find_first_not_of(" \t\r\n") == std::string_view::npos;
    s_.error(base_, prefix() + "invalid JSON at " + where + ": " + what + ". " +
                        (blank ? (origin_.empty() ? "The file is empty; a config is a JSON object, at least {}"
                                                  : "The value is empty")
                               : "JSON allows no comments and no trailing comma after the last "
                                 "item of an object or list; check there and at the end of the "
                                 "line before"));
    return false;
  }

  // After a successful parse: the duplicates not listed one by one.
  void finish() {
    if (duplicates_ > kMaxListed)
      s_.error(base_, prefix() + std::to_string(duplicates_ - kMaxListed) +
                          " more duplicate keys (not listed); keep one of each");
  }

 private:
  struct Frame {
    Json* value;                               // the object or array being filled
    bool array;
    std::unordered_set<std::string> keys{};    // objects: the keys so far
    std::string key{};                         // objects: the current key (for paths)
  };

  // Where the next value goes: the root, the end of the open array, or the slot of the key
  // just read. Addresses stay valid: a container only grows while it is the innermost one.
  Json* slot() {
    if (stack_.empty()) return &out_;
    Frame& top = stack_.back();
    if (top.array) {
      auto& array = top.value->get_ref<Json::array_t&>();
      array.emplace_back();
      return &array.back();
    }
    Json* p = pending_;
    pending_ = nullptr;
    return p;
  }

  bool put(Json v) {
    *slot() = std::move(v);
    return true;
  }

  bool open(Json empty, bool array) {
    if (stack_.size() >= kMaxDepth) {
      s_.error(path(), prefix() + "nested more than " + std::to_string(kMaxDepth) +
                                 " levels deep; a DeepSpeed config is a few levels deep: is this "
                                 "the right file?");
      return false;
    }
    Json* v = slot();
    *v = std::move(empty);
    stack_.push_back({v, array});
    return true;
  }

  bool close() {
    stack_.pop_back();
    return true;
  }

  // The JSON path of the current key ("zero_optimization.stage"; "[]" stands for any element).
  std::string path() const {
    std::string p = base_;
    for (const Frame& f : stack_) {
      if (!p.empty() && !f.array) p += ".";
      p += f.array ? std::string("[]") : f.key;
    }
    return p;
  }
  std::string prefix() const { return origin_.empty() ? "" : std::string(origin_) + ": "; }

  std::string_view text_;
  Session& s_;
  std::string base_;
  std::string_view origin_;
  Json& out_;
  std::vector<Frame> stack_;
  Json* pending_ = nullptr;
  std::deque<Json> discarded_;  // values of duplicate keys (a deque: addresses stay valid)
  std::size_t duplicates_ = 0;
};

}  // namespace

bool parse_json(std::string_view text, Session& s, Json& out, std::string base_path,
                std::string_view origin) {
  Builder b(text, s, std::move(base_path), origin, out);
  if (!Json::sax_parse(text.begin(), text.end(), &b, Json::input_format_t::json,
                       /*strict=*/true, /*ignore_comments=*/false))
    return false;
  b.finish();
  return true;
}

}  // namespace zero::config::detail
