// LogThrottle: at most one log line per `period` for each kind of event, so a
// peer repeating a bad request (or a refused connection) cannot flood the
// daemon's log. The line that is let through says how many were left out.
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
    absl::Time last_logged = absl::InfinitePast();
    uint64_t num_suppressed = 0;
  };

  const Options options_;  // Constant after construction.

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Kind> kinds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace polykv::daemon
