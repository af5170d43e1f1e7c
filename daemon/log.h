// The daemon's logger: named "polykvd", writes to stderr (stdout belongs to
// whoever embeds the daemon, e.g. polykv-bench's JSON). Low layers (pool,
// memory) return errors and never log; the rpc layer and the daemon do.
#pragma once

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>

namespace polykv::daemon {

inline std::shared_ptr<spdlog::logger> DaemonLogger() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::get("polykvd");
    return l ? l : spdlog::stderr_color_mt("polykvd");
  }();
  return logger;
}

}  // namespace polykv::daemon
