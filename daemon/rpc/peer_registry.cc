#include "daemon/rpc/peer_registry.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"

namespace polykv::daemon {

void PeerRegistry::Set(int fd, const PeerCreds& creds) {
  absl::MutexLock lock(&mu_);
  by_fd_[fd] = creds;
}

std::optional<PeerCreds> PeerRegistry::Lookup(absl::string_view peer) const {
  if (!absl::ConsumePrefix(&peer, "fd:")) return std::nullopt;
  int fd = -1;
  if (!absl::SimpleAtoi(peer, &fd)) return std::nullopt;
  absl::MutexLock lock(&mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return std::nullopt;
  return it->second;
}

}  // namespace polykv::daemon
