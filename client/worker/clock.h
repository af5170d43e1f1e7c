// Seconds on the steady clock: the time base of the worker's, the eval's and
// the benches' own timings. Only differences mean anything.
#pragma once

#include <chrono>

namespace polykv::worker {

inline double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace polykv::worker
