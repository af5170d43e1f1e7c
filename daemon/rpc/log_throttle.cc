#include "daemon/rpc/log_throttle.h"

namespace polykv::daemon {

std::optional<uint64_t> LogThrottle::Admit(absl::string_view kind, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!kinds_.contains(kind) && kinds_.size() >= options_.max_kinds) kind = "(other)";
  Kind& k = kinds_[kind];
  if (now - k.window_start >= options_.period) {
    k.window_start = now;
    k.lines_in_window = 0;
  }
  if (k.lines_in_window >= options_.lines_per_period) {
    ++k.num_suppressed;
    return std::nullopt;
  }
  ++k.lines_in_window;
  const uint64_t skipped = k.num_suppressed;
  k.num_suppressed = 0;
  return skipped;
}

}  // namespace polykv::daemon
