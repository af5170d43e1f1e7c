#include "daemon/sys/wake_fd.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {

absl::StatusOr<WakeFd> WakeFd::Create() {
  const int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  return WakeFd(fd);
}

WakeFd::WakeFd(WakeFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

WakeFd& WakeFd::operator=(WakeFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

WakeFd::~WakeFd() {
  if (fd_ >= 0) close(fd_);
}

void WakeFd::Notify() {
  // Never read back, so the counter stays non-zero and the fd readable.
  const uint64_t one = 1;
  (void)!write(fd_, &one, sizeof(one));
}

}  // namespace polykv::daemon
