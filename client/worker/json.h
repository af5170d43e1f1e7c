// JSON in the worker: nlohmann::ordered_json, so objects keep their keys in
// document order (chat templates render tool schemas with `tojson`, and
// Python's json.loads keeps order too). These helpers add what nlohmann does
// not: a Status instead of an exception, and Python's json.dumps layout.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace polykv::worker {

// Objects in document order; a repeated key keeps its first position and its
// last value, as Python's json.loads does.
using JsonValue = nlohmann::ordered_json;

// Parses exactly one JSON value (surrounding whitespace allowed).
// INVALID_ARGUMENT with nlohmann's message (it names the byte) otherwise.
absl::StatusOr<JsonValue> ParseJson(std::string_view text);

// `value` on one line, compact (no spaces), keys in their order. Invalid
// UTF-8 bytes in strings become U+FFFD so the output is always valid JSON.
std::string DumpJson(const JsonValue& value);

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
