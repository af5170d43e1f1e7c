// WakeFd: an eventfd that a thread blocked in poll() watches beside its
// sockets, so that Stop from another thread wakes it at once. The socket
// loops used to poll with a 100 ms timeout and look at a stop flag, so every
// daemon stop waited out up to 100 ms per loop (a restart under the gRPC
// fuzzer spent most of its time there).
//
// Thread-safety: Notify from any thread; fd() is constant.
#pragma once

#include "absl/status/statusor.h"

namespace polykv::daemon {

class WakeFd {
 public:
  static absl::StatusOr<WakeFd> Create();
  WakeFd(WakeFd&& other) noexcept;
  WakeFd& operator=(WakeFd&& other) noexcept;
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;
  ~WakeFd();

  // Poll it for POLLIN; it stays readable once notified.
  int fd() const { return fd_; }
  void Notify();

 private:
  explicit WakeFd(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace polykv::daemon
