// Plain HTTP over 127.0.0.1, enough to read the daemon's Prometheus page in
// tests without curl, and to hold connections open against it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

namespace polykv::testing {

// A TCP connection to 127.0.0.1:port, or -1 when nothing listens. With
// timeout_ms > 0, each read on it gives up after that long.
inline int ConnectLoopback(int port, int timeout_ms = 0) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (timeout_ms > 0) {
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `request` as it is and returns the whole response (headers and body),
// or "" when nothing listens. With timeout_ms > 0, what arrived by a read
// timeout is returned.
inline std::string HttpRequest(int port, const std::string& request, int timeout_ms = 0) {
  const int fd = ConnectLoopback(port, timeout_ms);
  if (fd < 0) return "";
  (void)!write(fd, request.data(), request.size());
  std::string out;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

inline std::string HttpGet(int port, const std::string& path, int timeout_ms = 0) {
  return HttpRequest(port, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", timeout_ms);
}

}  // namespace polykv::testing
