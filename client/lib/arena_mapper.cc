#include "client/lib/arena_mapper.h"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/device.h"
#include "proto/polykv/v1/fd_socket.h"

namespace polykv {
namespace {

constexpr int kFdFetchTimeoutSeconds = 2;

absl::Status ArenaError(const v1::ArenaHandle& h, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("cannot map arena ", h.arena_id(), " (device ",
                                             h.cuda_device(), "): ", s.message()));
}

}  // namespace

absl::StatusOr<int> FetchArenaFd(const std::string& path, const SessionRef& ref,
                                 uint32_t arena_id, uint64_t* size_bytes) {
  // A dumpable process's fds can be taken from /proc/<pid>/fd by any process
  // of its uid; an arena fd maps every page of the tenant. (Also stops
  // same-uid ptrace and core dumps, which would expose the same memory.)
  if (prctl(PR_SET_DUMPABLE, 0) != 0) {
    return absl::InternalError(absl::StrCat("prctl(PR_SET_DUMPABLE, 0): ", std::strerror(errno)));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return absl::InvalidArgumentError("fd socket path too long");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  // The daemon answers in microseconds; a fetch that hangs must fail while
  // the session's lease still has time to spare (issue 14, finding 3).
  const timeval tv{kFdFetchTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  auto fail = [&](absl::Status s) {
    close(fd);
    return s;
  };
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail(absl::UnavailableError(absl::StrCat("cannot reach the fd socket ", path, ": ",
                                                    std::strerror(errno))));
  }
  v1::FdRequest req;
  req.session_id = ref.session_id;
  std::memcpy(req.token, ref.token.data(), std::min(ref.token.size(), sizeof(req.token)));
  req.arena_id = arena_id;
  if (send(fd, &req, sizeof(req), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(req))) {
    return fail(absl::UnavailableError("fd socket closed the connection (peer refused?)"));
  }
  v1::FdReply reply;
  int arena_fd = -1;
  const ssize_t n = internal::RecvFdReply(fd, &reply, &arena_fd);
  const int recv_errno = errno;
  close(fd);
  if (n != static_cast<ssize_t>(sizeof(reply)) && arena_fd >= 0) close(arena_fd);
  if (n < 0 && (recv_errno == EAGAIN || recv_errno == EWOULDBLOCK)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "no answer from the fd socket ", path, " within ", kFdFetchTimeoutSeconds, " s"));
  }
  if (n != static_cast<ssize_t>(sizeof(reply))) {
    return absl::UnavailableError("fd socket closed the connection (peer not allowed?)");
  }
  if (reply.status != 0) {
    if (arena_fd >= 0) close(arena_fd);
    reply.message[sizeof(reply.message) - 1] = '\0';
    return absl::Status(static_cast<absl::StatusCode>(reply.status), reply.message);
  }
  if (arena_fd < 0) return absl::InternalError("fd socket replied OK without a descriptor");
  if (size_bytes != nullptr) *size_bytes = reply.size_bytes;
  return arena_fd;
}

namespace internal {

ssize_t RecvFdReply(int sock, v1::FdReply* reply, int* fd) {
  *fd = -1;
  char* const buf = reinterpret_cast<char*>(reply);
  size_t got = 0;
  while (got < sizeof(*reply)) {
    iovec iov{buf + got, sizeof(*reply) - got};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(sock, &msg, MSG_WAITALL | MSG_CMSG_CLOEXEC);
    // A signal (a profiler's, a timer's) ends MSG_WAITALL early: with nothing
    // read as EINTR, even under SA_RESTART since the socket has a timeout,
    // else as a short read. Either way the rest is still coming.
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS && *fd < 0) {
        std::memcpy(fd, CMSG_DATA(cm), sizeof(int));
      }
    }
    if (n == 0) break;  // EOF
    got += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(got);
}

ArenaMapper::~ArenaMapper() {
  for (auto& [id, m] : mappings_) {
    if (m.base && !m.device_memory) munmap(m.base, m.size);
  }
}

absl::Status ArenaMapper::Add(const v1::ArenaHandle& h) {
  if (mappings_.contains(h.arena_id())) return absl::OkStatus();
  switch (h.kind()) {
    case v1::ArenaHandle::KIND_HOST_SHM:
    case v1::ArenaHandle::KIND_CUDA_VMM:
      break;
    case v1::ArenaHandle::KIND_CUDA_IPC: {
      auto m = kernels::SharedDeviceMemory::ImportIpc(h.cuda_device(), h.cuda_ipc_handle(),
                                                      h.size_bytes());
      if (!m.ok()) return ArenaError(h, m.status());
      mappings_[h.arena_id()] = Mapping{(*m)->ptr(), h.size_bytes(), *std::move(m)};
      return absl::OkStatus();
    }
    default:
      return absl::InternalError(absl::StrCat("polykvd announced arena ", h.arena_id(),
                                              " of unknown kind ", int(h.kind())));
  }
  // A device arena this process cannot map is refused before its descriptor
  // is fetched: the fetch registers this process as a holder of the arena.
  if (h.kind() == v1::ArenaHandle::KIND_CUDA_VMM && kernels::CudaDeviceCount() == 0) {
    return ArenaError(h, absl::FailedPreconditionError(
                             kernels::CudaBuilt() ? "no CUDA device is visible to this process"
                                                  : "libpolykv_client was built without CUDA"));
  }
  uint64_t size = 0;
  auto fd = FetchArenaFd(fd_socket_path_, ref_, h.arena_id(), &size);
  // Retired between its announcement and this fetch: it was empty, so no
  // page of ours is in it; were its id used again, it would be announced
  // again (and mapped then).
  if (absl::IsNotFound(fd.status())) return absl::OkStatus();
  if (!fd.ok()) return fd.status();
  if (size != h.size_bytes()) {
    close(*fd);
    return absl::InternalError(absl::StrCat("arena ", h.arena_id(), " was announced with ",
                                            h.size_bytes(), " bytes and handed out with ", size));
  }
  if (h.kind() == v1::ArenaHandle::KIND_CUDA_VMM) {
    auto m = kernels::SharedDeviceMemory::ImportFd(h.cuda_device(), *fd, h.size_bytes());
    close(*fd);
    if (!m.ok()) return ArenaError(h, m.status());
    mappings_[h.arena_id()] = Mapping{(*m)->ptr(), h.size_bytes(), *std::move(m)};
    return absl::OkStatus();
  }
  void* base = mmap(nullptr, h.size_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  close(*fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap of arena ", h.arena_id(), ": ", std::strerror(errno)));
  }
  mappings_[h.arena_id()] = Mapping{base, h.size_bytes(), nullptr};
  return absl::OkStatus();
}

absl::StatusOr<void*> ArenaMapper::Address(uint32_t arena_id, uint64_t offset,
                                           uint64_t size) const {
  auto it = mappings_.find(arena_id);
  if (it == mappings_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("page names unknown arena ", arena_id));
  }
  if (offset + size > it->second.size || offset + size < offset) {
    return absl::InvalidArgumentError(absl::StrCat("page at ", offset, "+", size,
                                                   " lies outside arena ", arena_id));
  }
  return static_cast<char*>(it->second.base) + offset;
}

}  // namespace internal
}  // namespace polykv
