#include "client/worker/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace polykv::worker {

absl::StatusOr<JsonValue> ParseJson(std::string_view text) {
  try {
    return JsonValue::parse(text.begin(), text.end());
  } catch (const JsonValue::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("JSON: ", e.what()));
  }
}

// nlohmann's string escaping is Python's with ensure_ascii=False: only '"',
// '\\' and U+0000..U+001F (\b \f \n \r \t by name, else \u00xx).
std::string DumpJson(const JsonValue& value) {
  return value.dump(-1, ' ', false, JsonValue::error_handler_t::replace);
}

std::string JsonQuote(std::string_view s) { return DumpJson(JsonValue(std::string(s))); }

namespace {

// float.__repr__: shortest round-trip digits, exponent form when the decimal
// exponent is < -4 or >= 16 (nlohmann switches at 15, so it cannot be used).
void AppendPythonFloat(double d, std::string* out) {
  if (std::isinf(d)) {
    *out += d < 0 ? "-Infinity" : "Infinity";
    return;
  }
  if (std::isnan(d)) {
    *out += "NaN";
    return;
  }
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), std::fabs(d), std::chars_format::scientific);
  const std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp10 = std::atoi(sci.c_str() + e + 1);
  const int decpt = exp10 + 1;  // Value = 0.DIGITS x 10^decpt.
  const int n = static_cast<int>(digits.size());
  if (std::signbit(d)) out->push_back('-');
  if (decpt <= -4 || decpt > 16) {
    *out += digits.substr(0, 1);
    if (n > 1) absl::StrAppend(out, ".", digits.substr(1));
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    *out += ebuf;
  } else if (decpt <= 0) {
    absl::StrAppend(out, "0.", std::string(-decpt, '0'), digits);
  } else if (decpt < n) {
    absl::StrAppend(out, digits.substr(0, decpt), ".", digits.substr(decpt));
  } else {
    absl::StrAppend(out, digits, std::string(decpt - n, '0'), ".0");
  }
}

void AppendPython(const JsonValue& v, std::string* out) {
  if (v.is_number_float()) {
    AppendPythonFloat(v.get<double>(), out);
  } else if (v.is_array()) {
    out->push_back('[');
    bool first = true;
    for (const JsonValue& e : v) {
      if (!first) *out += ", ";
      first = false;
      AppendPython(e, out);
    }
    out->push_back(']');
  } else if (v.is_object()) {
    out->push_back('{');
    bool first = true;
    for (const auto& [key, val] : v.items()) {
      if (!first) *out += ", ";
      first = false;
      *out += JsonQuote(key);
      *out += ": ";
      AppendPython(val, out);
    }
    out->push_back('}');
  } else {
    // null, booleans, integers (str(int)) and strings: nlohmann writes them as Python does.
    *out += DumpJson(v);
  }
}

}  // namespace

std::string PythonJsonDumps(const JsonValue& value) {
  std::string out;
  AppendPython(value, &out);
  return out;
}

}  // namespace polykv::worker
