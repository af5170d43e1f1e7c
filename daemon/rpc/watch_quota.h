// WatchQuota: how many Watch streams each uid holds. A sync gRPC server runs
// a thread per open stream, so one uid with two streams on each of its
// sessions could make the daemon run thousands of threads.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace polykv::daemon {

class WatchQuota {
 public:
  // per_uid: streams one uid may hold at once; 0 = no limit.
  explicit WatchQuota(uint32_t per_uid) : per_uid_(per_uid) {}
  WatchQuota(const WatchQuota&) = delete;
  WatchQuota& operator=(const WatchQuota&) = delete;

  // Takes one of `uid`'s streams; false when it holds per_uid already.
  bool Acquire(uid_t uid) {
    absl::MutexLock lock(&mu_);
    uint32_t& held = held_[uid];
    if (per_uid_ != 0 && held >= per_uid_) return false;
    ++held;
    return true;
  }
  // REQUIRES: a successful Acquire(uid) not released yet.
  void Release(uid_t uid) {
    absl::MutexLock lock(&mu_);
    auto it = held_.find(uid);
    if (it != held_.end() && --it->second == 0) held_.erase(it);
  }
  uint32_t per_uid() const { return per_uid_; }

 private:
  const uint32_t per_uid_;
  absl::Mutex mu_;
  std::map<uid_t, uint32_t> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace polykv::daemon
