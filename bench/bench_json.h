// JSON output of the benchmarks: one object per run, keys in the order they
// are written (bench/eval/*.py and scripts read these by name).
#pragma once

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace polykv::bench {

using Json = nlohmann::ordered_json;

// `x` rounded to `decimals` places, so a record carries what a person would
// read and not 17 digits of timer noise.
inline double Round(double x, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(x * scale) / scale;
}

// Prints `j` on one line to stdout.
inline void PrintJson(const Json& j) {
  std::printf("%s\n", j.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
}

}  // namespace polykv::bench
