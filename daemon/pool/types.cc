#include "daemon/pool/types.h"

namespace polykv::daemon {

absl::string_view PriorityName(Priority p) {
  switch (p) {
    case Priority::kBestEffort: return "best_effort";
    case Priority::kLow: return "low";
    case Priority::kNormal: return "normal";
    case Priority::kHigh: return "high";
    case Priority::kCritical: return "critical";
  }
  return "normal";
}

std::optional<Priority> ParsePriority(absl::string_view name) {
  for (int v = 1; v <= 5; ++v) {
    if (PriorityName(static_cast<Priority>(v)) == name) return static_cast<Priority>(v);
  }
  return std::nullopt;
}

}  // namespace polykv::daemon
