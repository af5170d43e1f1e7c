// Subprocess: runs a program with its stdout on a pipe, for integration tests
// that start real daemons and workers.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace polykv::testing {

inline std::string BinDir() {
  const char* d = std::getenv("POLYKV_BIN_DIR");
  return d ? d : "build/bin";
}

class Subprocess {
 public:
  // Starts argv[0] (a path) with stdout piped back; stderr is inherited so a
  // failing test shows what the program said.
  explicit Subprocess(std::vector<std::string> argv) {
    // The child only calls async-signal-safe functions before execv: the
    // soak forks from a process whose other threads may hold malloc's locks.
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    out_fd_ = fds[0];
  }
  ~Subprocess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      Wait();
    }
    if (out_fd_ >= 0) close(out_fd_);
  }
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }

  // Reads one line of stdout, waiting up to timeout_ms. "" on EOF/timeout.
  std::string ReadLine(int timeout_ms = 30000) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (true) {
      auto nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) return "";
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) return "";
      char buf[4096];
      ssize_t n = read(out_fd_, buf, sizeof(buf));
      if (n <= 0) return "";
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }
  // Everything left on stdout until EOF.
  std::string ReadAll() {
    std::string out = buffer_;
    buffer_.clear();
    char buf[4096];
    ssize_t n;
    while ((n = read(out_fd_, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }
  // Exit code, or 128 + signal.
  int Wait() {
    if (exited_) return code_;
    int status = 0;
    waitpid(pid_, &status, 0);
    exited_ = true;
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return code_;
  }
  void Signal(int sig) { kill(pid_, sig); }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buffer_;
  bool exited_ = false;
  int code_ = -1;
};

// Runs a program to completion; returns {exit code, stdout}.
inline std::pair<int, std::string> RunProgram(std::vector<std::string> argv) {
  Subprocess p(std::move(argv));
  std::string out = p.ReadAll();
  return {p.Wait(), out};
}

}  // namespace polykv::testing
