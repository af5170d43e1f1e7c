#include "daemon/memory/process_ref.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <mutex>

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
  // One pidfd per live process, however many sessions and arenas watch it
  // (a worker may hold hundreds): refs are shared while any is held.
  struct Cache {
    std::mutex mu;
    std::map<pid_t, std::weak_ptr<const ProcessRef>> refs;
    uint64_t calls = 0;
  };
  auto cache = std::make_shared<Cache>();
  return [cache](pid_t pid) -> std::shared_ptr<const ProcessRef> {
    if (pid <= 0) return nullptr;
    std::lock_guard<std::mutex> lock(cache->mu);
    if (++cache->calls % 1024 == 0) {
      std::erase_if(cache->refs, [](const auto& e) { return e.second.expired(); });
    }
    auto& slot = cache->refs[pid];
    // A cached ref of a process that has exited is not reused: the pid may
    // now name another process.
    if (auto ref = slot.lock(); ref && ref->Alive()) return ref;
    const int fd = PidfdOpen(pid);
    if (fd < 0) return nullptr;  // ESRCH: gone already; ENOSYS: see PidfdsSupported
    auto ref = std::make_shared<PidfdRef>(pid, fd);
    slot = ref;
    return ref;
  };
}

}  // namespace polykv::daemon
