// Just enough JSON for the worker's script and output lines: parses one
// value (objects, arrays, strings with \u escapes, numbers, true/false/null)
// and escapes strings for output. Not a general-purpose library.
//
// Objects keep their keys in document order and numbers keep their literal
// text, so a value re-serializes the way Python's json.dumps writes what
// json.loads read (chat templates render tool schemas with `tojson`).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace polykv::worker {

class JsonObject;

struct JsonValue {
  using Object = JsonObject;
  using Array = std::vector<JsonValue>;
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<Array>,
               std::shared_ptr<Object>>
      v = nullptr;
  // The number as written in the document ("1", "2.50", "1e3"); numbers only.
  std::string number_text;

  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_number() const { return std::holds_alternative<double>(v); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  double num() const { return std::get<double>(v); }
  const Object& obj() const { return *std::get<std::shared_ptr<Object>>(v); }
  const Array& arr() const { return *std::get<std::shared_ptr<Array>>(v); }
};

// An object's members in document order. A repeated key keeps its first
// position and its last value, as Python's json.loads does. Lookup is linear:
// script lines have a handful of keys.
class JsonObject {
 public:
  using Member = std::pair<std::string, JsonValue>;
  using const_iterator = std::vector<Member>::const_iterator;

  const_iterator begin() const { return members_.begin(); }
  const_iterator end() const { return members_.end(); }
  size_t size() const { return members_.size(); }
  const_iterator find(std::string_view key) const;
  size_t count(std::string_view key) const { return find(key) == end() ? 0 : 1; }
  // REQUIRES: the key is present (std::out_of_range otherwise, like std::map).
  const JsonValue& at(std::string_view key) const;
  // Inserts or overwrites in place.
  void Set(std::string key, JsonValue value);

 private:
  std::vector<Member> members_;
};

// Parses exactly one JSON value (surrounding whitespace allowed).
absl::StatusOr<JsonValue> ParseJson(std::string_view text);

// `s` as a JSON string literal, quotes included. Invalid UTF-8 bytes become
// U+FFFD so the output line is always valid JSON.
std::string JsonQuote(std::string_view s);

// What Python's json.dumps(value, ensure_ascii=False) writes for the value
// json.loads would read from the same text: ", " and ": " separators, keys in
// document order, non-ASCII kept, only '"', '\\' and controls escaped
// (\n \r \t \b \f, else \u00XX), integers as written, other numbers as
// Python's float repr (1e+16, 1e-05, 2.5, Infinity).
std::string PythonJsonDumps(const JsonValue& value);

}  // namespace polykv::worker
