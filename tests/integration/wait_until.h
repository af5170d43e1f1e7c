// Waiting for an event with a generous deadline: tests wait for what they
// check, never assert how long it took (these machines are noisy).
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace polykv::testing {

// Polls `done` until it holds or `timeout` passes; whether it held.
inline bool WaitUntil(const std::function<bool()>& done,
                      std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

}  // namespace polykv::testing
