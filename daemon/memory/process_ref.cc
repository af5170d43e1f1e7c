#include "daemon/memory/process_ref.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace polykv::daemon {
namespace {

class PidfdRef final : public ProcessRef {
 public:
  PidfdRef(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  ~PidfdRef() override { close(fd_); }
  PidfdRef(const PidfdRef&) = delete;
  PidfdRef& operator=(const PidfdRef&) = delete;

  pid_t pid() const override { return pid_; }
  bool Alive() const override {
    // A pidfd polls readable once the process has exited (zombie or reaped).
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, 0) == 0;
  }

 private:
  const pid_t pid_;
  const int fd_;
};

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace

bool PidfdsSupported() {
  const int fd = PidfdOpen(getpid());
  if (fd < 0) return false;
  close(fd);
  return true;
}

ProcessWatcher PidfdWatcher() {
  return [](pid_t pid) -> std::shared_ptr<const ProcessRef> {
    if (pid <= 0) return nullptr;
    const int fd = PidfdOpen(pid);
    if (fd < 0) return nullptr;  // ESRCH: gone already; ENOSYS: see PidfdsSupported
    return std::make_shared<PidfdRef>(pid, fd);
  };
}

}  // namespace polykv::daemon
