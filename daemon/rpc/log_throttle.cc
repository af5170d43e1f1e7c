#include "daemon/rpc/log_throttle.h"

namespace polykv::daemon {

std::optional<uint64_t> LogThrottle::Admit(absl::string_view kind, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!kinds_.contains(kind) && kinds_.size() >= options_.max_kinds) kind = "(other)";
  Kind& k = kinds_[kind];
  if (now - k.last_logged < options_.period) {
    ++k.num_suppressed;
    return std::nullopt;
  }
  k.last_logged = now;
  const uint64_t skipped = k.num_suppressed;
  k.num_suppressed = 0;
  return skipped;
}

}  // namespace polykv::daemon
