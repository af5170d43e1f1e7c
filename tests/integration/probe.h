// Reading what the programs under test print: one field of a JSON line
// (polykv-test-worker, polykvctl --json) and one sample of a Prometheus page.
// Regexes, not a JSON parser: the lines are flat and ours.
#pragma once

#include <cctype>
#include <cstdint>
#include <regex>
#include <string>

namespace polykv::testing {

// The value of "key" in a JSON line: a string without its quotes, an array
// with its brackets, or a bare number/bool; "" when absent.
inline std::string Field(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\":\\s*(\"[^\"]*\"|\\[[^\\]]*\\]|[^,}]+)");
  if (!std::regex_search(json, m, re)) return "";
  std::string v = m[1];
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
  if (!v.empty() && v.front() == '"') v = v.substr(1, v.size() - 2);
  return v;
}

// Field(json, key) as a number; 0 when absent.
inline uint64_t FieldNum(const std::string& json, const std::string& key) {
  return std::stoull("0" + Field(json, key));
}

// Value of the first sample line starting with `prefix` (a name, or a name
// and the start of its labels) in a Prometheus text page; -1 when absent.
inline double Sample(const std::string& page, const std::string& prefix) {
  size_t at = page.find("\n" + prefix);
  if (at == std::string::npos) return -1;
  size_t sp = page.find(' ', at + 1 + prefix.size());
  return std::stod(page.substr(sp + 1, page.find('\n', sp) - sp - 1));
}

// Sum of every sample of the family `name` (all label sets); 0 when absent.
inline double SampleSum(const std::string& page, const std::string& name) {
  double sum = 0;
  std::regex re("\n" + name + "(\\{[^}]*\\})? ([-0-9.e+]+)");
  for (std::sregex_iterator it(page.begin(), page.end(), re), end; it != end; ++it) {
    sum += std::stod((*it)[2]);
  }
  return sum;
}

}  // namespace polykv::testing
