#include "policies/replay/json.h"

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace polykv::policies::replay {
namespace {

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  absl::StatusOr<Json> Document() {
    Json v;
    if (!Value(&v, 0)) return absl::InvalidArgumentError(Error());
    Ws();
    if (i_ != s_.size()) return absl::InvalidArgumentError(Error("trailing characters"));
    return v;
  }

 private:
  std::string Error(const char* what = nullptr) const {
    return absl::StrCat("json: ", what ? what : (err_.empty() ? "syntax error" : err_.c_str()),
                        " at offset ", i_);
  }
  void Ws() {
    while (i_ < s_.size() &&
           (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) {
      ++i_;
    }
  }
  bool Lit(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) return false;
    i_ += w.size();
    return true;
  }
  bool Value(Json* v, int depth) {
    if (depth > 64) {
      err_ = "nesting too deep";
      return false;
    }
    Ws();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') {
      v->type = Json::Type::kObject;
      ++i_;
      Ws();
      if (i_ < s_.size() && s_[i_] == '}') return ++i_, true;
      while (true) {
        Ws();
        std::string key;
        if (!String(&key)) return false;
        Ws();
        if (i_ >= s_.size() || s_[i_] != ':') return false;
        ++i_;
        if (!Value(&v->obj[key], depth + 1)) return false;
        Ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == '}') return ++i_, true;
        return false;
      }
    }
    if (c == '[') {
      v->type = Json::Type::kArray;
      ++i_;
      Ws();
      if (i_ < s_.size() && s_[i_] == ']') return ++i_, true;
      while (true) {
        v->arr.emplace_back();
        if (!Value(&v->arr.back(), depth + 1)) return false;
        Ws();
        if (i_ < s_.size() && s_[i_] == ',') {
          ++i_;
          continue;
        }
        if (i_ < s_.size() && s_[i_] == ']') return ++i_, true;
        return false;
      }
    }
    if (c == '"') {
      v->type = Json::Type::kString;
      return String(&v->str);
    }
    if (Lit("true")) {
      v->type = Json::Type::kBool;
      v->b = true;
      return true;
    }
    if (Lit("false")) {
      v->type = Json::Type::kBool;
      return true;
    }
    if (Lit("null")) return true;
    const char* begin = s_.data() + i_;
    char* end = nullptr;
    std::string tmp(begin, std::min<size_t>(s_.size() - i_, 64));
    v->num = std::strtod(tmp.c_str(), &end);
    if (end == tmp.c_str()) return false;
    v->type = Json::Type::kNumber;
    i_ += static_cast<size_t>(end - tmp.c_str());
    return true;
  }
  bool String(std::string* out) {
    if (i_ >= s_.size() || s_[i_] != '"') return false;
    ++i_;
    while (i_ < s_.size()) {
      const char c = s_[i_++];
      if (c == '"') return true;
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return false;
      const char e = s_[i_++];
      switch (e) {
        case 'n':
          out->push_back('\n');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'u': {
          if (i_ + 4 > s_.size()) return false;
          const unsigned cp = std::strtoul(std::string(s_.substr(i_, 4)).c_str(), nullptr, 16);
          i_ += 4;
          // UTF-8 encode (surrogate pairs are kept as two 3-byte sequences).
          if (cp < 0x80) {
            out->push_back(static_cast<char>(cp));
          } else if (cp < 0x800) {
            out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
          } else {
            out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
            out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
            out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
          }
          break;
        }
        default:
          out->push_back(e);
          break;
      }
    }
    return false;
  }

  std::string_view s_;
  size_t i_ = 0;
  std::string err_;
};

}  // namespace

absl::StatusOr<Json> ParseJson(std::string_view text) { return Parser(text).Document(); }

std::string JsonEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  return out;
}

}  // namespace polykv::policies::replay
