// A small JSON reader for traces (objects, arrays, numbers, strings, bools,
// null). Not a general-purpose library: enough for polykv-replay.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace polykv::policies::replay {

struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> arr;
  std::map<std::string, Json> obj;

  const Json* get(const std::string& key) const {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &it->second;
  }
};

absl::StatusOr<Json> ParseJson(std::string_view text);

// Escapes a string for a JSON string literal (without the quotes).
std::string JsonEscape(std::string_view s);

}  // namespace polykv::policies::replay
