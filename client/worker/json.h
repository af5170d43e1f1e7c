// Just enough JSON for the worker's script and output lines: parses one
// value (objects, arrays, strings with \u escapes, numbers, true/false/null)
// and escapes strings for output. Not a general-purpose library.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace polykv::worker {

struct JsonValue {
  using Object = std::map<std::string, JsonValue>;
  using Array = std::vector<JsonValue>;
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<Array>,
               std::shared_ptr<Object>>
      v = nullptr;

  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_number() const { return std::holds_alternative<double>(v); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  double num() const { return std::get<double>(v); }
  const Object& obj() const { return *std::get<std::shared_ptr<Object>>(v); }
};

// Parses exactly one JSON value (surrounding whitespace allowed).
absl::StatusOr<JsonValue> ParseJson(std::string_view text);

// `s` as a JSON string literal, quotes included. Invalid UTF-8 bytes become
// U+FFFD so the output line is always valid JSON.
std::string JsonQuote(std::string_view s);

}  // namespace polykv::worker
