#include "client/worker/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "client/worker/utf8.h"

namespace polykv::worker {
namespace {

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  absl::StatusOr<JsonValue> ParseTop() {
    auto v = Value(0);
    if (!v.ok()) return v;
    Ws();
    if (i_ != s_.size()) return Error("trailing characters");
    return v;
  }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("JSON: ", std::string(what), " at column ", i_ + 1));
  }
  void Ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool Lit(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  absl::StatusOr<JsonValue> Value(int depth) {
    if (depth > 64) return Error("nesting too deep");
    Ws();
    if (i_ >= s_.size()) return Error("unexpected end");
    JsonValue out;
    const char c = s_[i_];
    if (c == '{') {
      ++i_;
      auto obj = std::make_shared<JsonObject>();
      Ws();
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
      } else {
        while (true) {
          Ws();
          if (i_ >= s_.size() || s_[i_] != '"') return Error("expected a key string");
          auto key = String();
          if (!key.ok()) return key.status();
          Ws();
          if (i_ >= s_.size() || s_[i_] != ':') return Error("expected ':'");
          ++i_;
          auto val = Value(depth + 1);
          if (!val.ok()) return val;
          obj->Set(std::move(*key), std::move(*val));
          Ws();
          if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
          if (i_ < s_.size() && s_[i_] == '}') { ++i_; break; }
          return Error("expected ',' or '}'");
        }
      }
      out.v = std::move(obj);
    } else if (c == '[') {
      ++i_;
      auto arr = std::make_shared<JsonValue::Array>();
      Ws();
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
      } else {
        while (true) {
          auto val = Value(depth + 1);
          if (!val.ok()) return val;
          arr->push_back(std::move(*val));
          Ws();
          if (i_ < s_.size() && s_[i_] == ',') { ++i_; continue; }
          if (i_ < s_.size() && s_[i_] == ']') { ++i_; break; }
          return Error("expected ',' or ']'");
        }
      }
      out.v = std::move(arr);
    } else if (c == '"') {
      auto str = String();
      if (!str.ok()) return str.status();
      out.v = std::move(*str);
    } else if (Lit("true")) {
      out.v = true;
    } else if (Lit("false")) {
      out.v = false;
    } else if (Lit("null")) {
      out.v = nullptr;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      const size_t start = i_;
      while (i_ < s_.size() && (std::string_view("+-.eE0123456789").find(s_[i_]) != std::string_view::npos)) ++i_;
      std::string num(s_.substr(start, i_ - start));
      char* end = nullptr;
      const double d = std::strtod(num.c_str(), &end);
      if (end != num.c_str() + num.size()) return Error("bad number");
      out.v = d;
      out.number_text = std::move(num);
    } else {
      return Error("unexpected character");
    }
    return out;
  }
  absl::StatusOr<uint32_t> Hex4() {
    if (i_ + 4 > s_.size()) return Error("short \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = s_[i_++];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= h - '0';
      else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
      else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
      else return Error("bad \\u escape");
    }
    return v;
  }
  absl::StatusOr<std::string> String() {
    ++i_;  // Opening quote.
    std::string out;
    while (true) {
      if (i_ >= s_.size()) return Error("unterminated string");
      const char c = s_[i_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) return Error("control character in string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return Error("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          auto hi = Hex4();
          if (!hi.ok()) return hi.status();
          uint32_t cp = *hi;
          if (cp >= 0xD800 && cp <= 0xDBFF && s_.substr(i_, 2) == "\\u") {
            i_ += 2;
            auto lo = Hex4();
            if (!lo.ok()) return lo.status();
            if (*lo >= 0xDC00 && *lo <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (*lo - 0xDC00);
            } else {
              return Error("unpaired surrogate");
            }
          } else if (cp >= 0xD800 && cp <= 0xDFFF) {
            return Error("unpaired surrogate");
          }
          AppendUtf8(cp, &out);
          break;
        }
        default:
          return Error("bad escape");
      }
    }
    return out;
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

JsonObject::const_iterator JsonObject::find(std::string_view key) const {
  for (auto it = members_.begin(); it != members_.end(); ++it) {
    if (it->first == key) return it;
  }
  return members_.end();
}

const JsonValue& JsonObject::at(std::string_view key) const {
  auto it = find(key);
  if (it == end()) throw std::out_of_range(absl::StrCat("JSON object has no key ", std::string(key)));
  return it->second;
}

void JsonObject::Set(std::string key, JsonValue value) {
  for (Member& m : members_) {
    if (m.first == key) {
      m.second = std::move(value);
      return;
    }
  }
  members_.emplace_back(std::move(key), std::move(value));
}

absl::StatusOr<JsonValue> ParseJson(std::string_view text) { return Parser(text).ParseTop(); }

std::string JsonQuote(std::string_view s) {
  std::string out = "\"";
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"') { out += "\\\""; ++i; continue; }
    if (c == '\\') { out += "\\\\"; ++i; continue; }
    if (c == '\n') { out += "\\n"; ++i; continue; }
    if (c == '\r') { out += "\\r"; ++i; continue; }
    if (c == '\t') { out += "\\t"; ++i; continue; }
    if (c < 0x20 || c == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      ++i;
      continue;
    }
    if (c < 0x80) { out.push_back(static_cast<char>(c)); ++i; continue; }
    // Copy a valid multi-byte sequence; replace anything else with U+FFFD.
    int len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  out.push_back('"');
  return out;
}

namespace {

// Python's json.dumps string escaping with ensure_ascii=False (its ESCAPE
// table: only '"', '\\' and U+0000..U+001F; DEL and non-ASCII stay raw).
void AppendPythonString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

// json.loads makes an int of a literal without fraction or exponent, a float
// otherwise; json.dumps writes str(int) and float.__repr__ respectively.
void AppendPythonNumber(const JsonValue& v, std::string* out) {
  const std::string& text = v.number_text;
  if (!text.empty() && text.find_first_of(".eE") == std::string::npos) {
    *out += text == "-0" ? "0" : text;
    return;
  }
  const double d = v.num();
  if (std::isinf(d)) {
    *out += d < 0 ? "-Infinity" : "Infinity";
    return;
  }
  // Shortest round-trip digits (as repr), then Python's layout: exponent
  // form when the decimal exponent is < -4 or >= 16.
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
  if (std::holds_alternative<std::nullptr_t>(v.v)) {
    *out += "null";
  } else if (const bool* b = std::get_if<bool>(&v.v)) {
    *out += *b ? "true" : "false";
  } else if (v.is_number()) {
    AppendPythonNumber(v, out);
  } else if (v.is_string()) {
    AppendPythonString(v.str(), out);
  } else if (v.is_array()) {
    out->push_back('[');
    bool first = true;
    for (const JsonValue& e : v.arr()) {
      if (!first) *out += ", ";
      first = false;
      AppendPython(e, out);
    }
    out->push_back(']');
  } else {
    out->push_back('{');
    bool first = true;
    for (const auto& [key, val] : v.obj()) {
      if (!first) *out += ", ";
      first = false;
      AppendPythonString(key, out);
      *out += ": ";
      AppendPython(val, out);
    }
    out->push_back('}');
  }
}

}  // namespace

std::string PythonJsonDumps(const JsonValue& value) {
  std::string out;
  AppendPython(value, &out);
  return out;
}

}  // namespace polykv::worker
