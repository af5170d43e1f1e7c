// EventChannel: a session's queue of daemon events, read by Watch streams.
//
// The pool pushes, a Watch handler pops. The channel outlives the session (a
// watcher holds a shared_ptr), so a watcher blocked in Next() sees the final
// event and Closed() after the session is gone.
#pragma once

#include <deque>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/pool/types.h"

namespace polykv::daemon {

class EventChannel {
 public:
  void Push(SessionEventMsg event) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    // Bounded: a watcher that never reads must not grow daemon memory.
    if (events_.size() >= kMaxQueued) events_.pop_front();
    events_.push_back(std::move(event));
  }
  // After Close, Next drains what is queued and then returns nullopt at once.
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Waits up to `timeout` for an event. nullopt on timeout or when closed and empty.
  std::optional<SessionEventMsg> Next(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &EventChannel::Ready), timeout);
    if (events_.empty()) return std::nullopt;
    SessionEventMsg e = std::move(events_.front());
    events_.pop_front();
    return e;
  }
  bool Closed() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return closed_ && events_.empty();
  }
  // A Watch stream holds a daemon thread while it lasts, so a session may
  // have at most kMaxWatchers at once (issue 14, finding 5: 2,000 streams of
  // one client made 2,017 threads). False when the session has them all.
  bool AddWatcher() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (watchers_ >= kMaxWatchers) return false;
    ++watchers_;
    return true;
  }
  void RemoveWatcher() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (watchers_ > 0) --watchers_;
  }
  static constexpr int kMaxWatchers = 2;  // the worker, and an operator's tool

 private:
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !events_.empty() || closed_; }

  static constexpr size_t kMaxQueued = 64;
  mutable absl::Mutex mu_;
  std::deque<SessionEventMsg> events_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  int watchers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace polykv::daemon
