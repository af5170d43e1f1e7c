#include "daemon/rpc/peer_registry.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"

namespace polykv::daemon {

void PeerRegistry::Add(int fd, uint64_t connection_id, const PeerCreds& creds) {
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = Entry{connection_id, creds};
}

void PeerRegistry::Remove(int fd, uint64_t connection_id) {
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it != by_fd_.end() && it->second.connection_id == connection_id) by_fd_.erase(it);
}

std::optional<PeerCreds> PeerRegistry::Lookup(absl::string_view peer) const {
  if (!absl::ConsumePrefix(&peer, "fd:")) return std::nullopt;
  int fd = -1;
  if (!absl::SimpleAtoi(peer, &fd)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second.creds;
}

size_t PeerRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return by_fd_.size();
}

}  // namespace polykv::daemon
