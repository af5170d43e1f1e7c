// A raw Unix stream connection, for tests that play a misbehaving client of
// the fd socket (a silent one, half a request).
#pragma once

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace polykv::testing {

// Connects the socket `fd` to the Unix socket at `path`.
inline bool ConnectSocket(int fd, const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
  return connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
}

// A connection to the Unix socket `path`, or -1. With timeout_ms > 0, each
// read on it gives up after that long (a blocked server fails the test
// instead of hanging it).
inline int ConnectUnix(const std::string& path, int timeout_ms = 0) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (timeout_ms > 0) {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  if (!ConnectSocket(fd, path)) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace polykv::testing
