#include "daemon/rpc/connection_table.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {

ConnectionRefusal ConnectionTable::Admits(uid_t uid) const {
  if (limits_.max_connections > 0 && by_fd_.size() >= limits_.max_connections) {
    return ConnectionRefusal::kTotal;
  }
  if (limits_.max_connections_per_uid > 0 && CountOf(uid) >= limits_.max_connections_per_uid) {
    return ConnectionRefusal::kPerUid;
  }
  return ConnectionRefusal::kNone;
}

absl::StatusOr<Connection> ConnectionTable::Add(int fd, const PeerCreds& peer) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("fstat of accepted fd ", fd, ": ", std::strerror(errno)));
  }
  Connection c{fd, next_id_++, peer, st.st_dev, st.st_ino};
  by_fd_[fd] = c;
  ++per_uid_[peer.uid];
  return c;
}

std::optional<Connection> ConnectionTable::Remove(int fd) {
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  Connection c = it->second;
  by_fd_.erase(it);
  auto u = per_uid_.find(c.peer.uid);
  if (--u->second == 0) per_uid_.erase(u);
  return c;
}

std::vector<Connection> ConnectionTable::RemoveClosed() {
  std::vector<int> closed;
  for (const auto& [fd, c] : by_fd_) {
    struct stat st {};
    if (fstat(fd, &st) != 0 || st.st_dev != c.dev || st.st_ino != c.ino) closed.push_back(fd);
  }
  std::vector<Connection> out;
  out.reserve(closed.size());
  for (int fd : closed) out.push_back(*Remove(fd));
  return out;
}

uint32_t ConnectionTable::CountOf(uid_t uid) const {
  auto it = per_uid_.find(uid);
  return it == per_uid_.end() ? 0 : it->second;
}

}  // namespace polykv::daemon
