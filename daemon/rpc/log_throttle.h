// LogThrottle: at most `lines_per_period` log lines per `period` for each kind
// of event, so a peer repeating a bad request (or a refused connection, or
// opening and closing sessions in a loop) cannot flood the daemon's log. The
// first line let through after a quiet spell says how many were left out.
//
//   if (auto skipped = throttle.Admit("refused:per_uid")) {
//     log->warn("... ({} like it not logged)", *skipped);
//   }
//
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace polykv::daemon {

class LogThrottle {
 public:
  struct Options {
    absl::Duration period = absl::Seconds(10);
    uint32_t lines_per_period = 1;
    // Kinds are chosen by the daemon (method names, reasons), but bound the
    // map anyway: past this many, new kinds share one slot.
    size_t max_kinds = 256;
  };
  explicit LogThrottle(Options options) : options_(options) {}
  LogThrottle(const LogThrottle&) = delete;
  LogThrottle& operator=(const LogThrottle&) = delete;

  // Whether an event of `kind` at `now` may be logged: the number of events
  // of that kind left out since its last logged line, or nullopt to stay quiet.
  std::optional<uint64_t> Admit(absl::string_view kind, absl::Time now = absl::Now())
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Kind {
    absl::Time window_start = absl::InfinitePast();
    uint32_t lines_in_window = 0;
    uint64_t num_suppressed = 0;
  };

  const Options options_;  // Constant after construction.

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Kind> kinds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace polykv::daemon
