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

// `x` rounded to `digits` significant digits, for values spread over decades
// (errors from 1e-5 to 0.5, device times from microseconds to seconds) where a
// fixed number of decimals would print the small ones as 0.
inline double RoundSignificant(double x, int digits) {
  if (x == 0 || !std::isfinite(x)) return x;
  return Round(x, digits - 1 - static_cast<int>(std::floor(std::log10(std::fabs(x)))));
}

// Prints `j` on one line to stdout.
inline void PrintJson(const Json& j) {
  std::printf("%s\n", j.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
}

}  // namespace polykv::bench
