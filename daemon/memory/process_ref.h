// ProcessRef: whether a worker process still exists, without trusting its pid
// to keep meaning the same process (a pidfd, not a number that can be reused).
//
// The pool uses it to know when memory a worker has mapped can change owner:
// an arena stays retired, and the pages of a session taken from a worker
// without its consent stay quarantined, while a process that could still
// write them lives (issue 14, findings 6 and 10).
//
// Thread-safety: Alive is safe from any thread.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>

namespace polykv::daemon {

class ProcessRef {
 public:
  virtual ~ProcessRef() = default;
  virtual pid_t pid() const = 0;
  virtual bool Alive() const = 0;
};

// nullptr when there is nothing to wait for: the pid is unknown (0) or the
// process is already gone. An empty watcher (the default in tests that run
// the pool in-process) watches nothing.
using ProcessWatcher = std::function<std::shared_ptr<const ProcessRef>(pid_t)>;

// pidfd_open(2): a process is alive until its pidfd polls readable. One pidfd
// per live process, shared by every ref to it (thread-safe). On a kernel
// without pidfds (before 5.3) it watches nothing, so memory changes owner as
// soon as the pool lets it; the daemon logs that once.
ProcessWatcher PidfdWatcher();
bool PidfdsSupported();

}  // namespace polykv::daemon
