// The one place internal errors become gRPC statuses (Triton's rule). absl and
// gRPC codes share numbering. Expected refusals (INVALID_ARGUMENT,
// RESOURCE_EXHAUSTED, NOT_FOUND, PERMISSION_DENIED, FAILED_PRECONDITION,
// UNAVAILABLE, ...) pass their message through: it is written for the person
// reading the client's error. Unexpected ones (INTERNAL, UNKNOWN, DATA_LOSS: a
// broken invariant, a bug) are logged here once, with their detail, and the
// client gets a clean message that points at the daemon's log.
#pragma once

#include <grpcpp/support/status.h>
#include <spdlog/logger.h>

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace polykv::daemon {

// True for the codes that mean a bug or a broken invariant, not a refusal.
bool IsUnexpected(absl::StatusCode code);

// Logs unexpected errors at most `max_lines` per `window`, so that a flood of
// bad requests cannot flood the log; a line after a quiet spell says how many
// were left out. Every error gets an incident number, logged and sent to the
// client, so a user's report finds its line. Thread-safe.
class ErrorLog {
 public:
  struct Options {
    std::shared_ptr<spdlog::logger> logger;  // Required.
    int max_lines = 10;                      // Lines per window.
    absl::Duration window = absl::Seconds(60);
  };
  explicit ErrorLog(Options options) : options_(std::move(options)) {}
  ErrorLog(const ErrorLog&) = delete;
  ErrorLog& operator=(const ErrorLog&) = delete;

  // Logs `status` (unless rate-limited) and returns its incident number.
  uint64_t Record(absl::string_view rpc, const absl::Status& status, absl::Time now = absl::Now());

 private:
  const Options options_;  // Constant after construction.

  absl::Mutex mu_;
  uint64_t num_incidents_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int lines_in_window_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t num_suppressed_ ABSL_GUARDED_BY(mu_) = 0;  // Since the last logged line.
};

// Translates `status` of the RPC `rpc`. Unexpected errors are recorded in
// `log` (may be null: tests) and reach the client as
// "internal error in polykvd (rpc X, incident N); the daemon's log has the detail".
grpc::Status ToGrpc(const absl::Status& status, absl::string_view rpc = "", ErrorLog* log = nullptr);

}  // namespace polykv::daemon
