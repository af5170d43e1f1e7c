#include "daemon/pool/session_table.h"

#include "absl/strings/str_cat.h"
#include "daemon/pool/token.h"

namespace polykv::daemon {

absl::Status SessionTable::CheckRoom(uid_t uid, uint32_t also_held) const {
  if (sessions_.size() >= max_sessions_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session limit reached (", max_sessions_, " sessions)"));
  }
  auto it = per_uid_.find(uid);
  const uint32_t held = (it == per_uid_.end() ? 0 : it->second) + also_held;
  if (held >= max_per_uid_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "uid ", uid, " holds ", held, " sessions, the most one uid may hold "
        "(max_sessions_per_uid); close some, or raise the limit in polykvd's config"));
  }
  return absl::OkStatus();
}

std::set<std::string> SessionTable::TenantsOf(uid_t uid) const {
  std::set<std::string> out;
  for (const auto& [id, s] : sessions_) {
    if (s.lease.peer.uid == uid) out.insert(s.tenant());
  }
  return out;
}

Session& SessionTable::Insert(Session s) {
  ++per_uid_[s.lease.peer.uid];
  s.id = next_id_++;
  const uint64_t id = s.id;
  return sessions_.emplace(id, std::move(s)).first->second;
}

absl::StatusOr<Session*> SessionTable::Authorize(uint64_t id, absl::string_view token,
                                                 const PeerCreds& peer, absl::Time now) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    if (id >> 32 != instance_) {
      return absl::NotFoundError(absl::StrCat(
          "no session ", id, ": it was opened with an earlier polykvd (the daemon restarted "
          "and its pool is new); open a new session"));
    }
    return absl::NotFoundError(absl::StrCat(
        "no session ", id, " (closed, evicted, or its lease expired); open a new one"));
  }
  Session& s = it->second;
  if (!TokenEquals(token, s.token)) {
    return absl::PermissionDeniedError(absl::StrCat("wrong capability token for session ", id));
  }
  if (peer.uid != s.lease.peer.uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "session ", id, " belongs to uid ", s.lease.peer.uid, ", not uid ", peer.uid));
  }
  s.lease.Renew(now);
  return &s;
}

absl::StatusOr<Session*> SessionTable::AuthorizeMutation(uint64_t id, absl::string_view token,
                                                         const PeerCreds& peer, absl::Time now) {
  auto sp = Authorize(id, token, peer, now);
  if (!sp.ok()) return sp;
  if ((*sp)->busy) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", id, " is busy: its Sync (a compaction), Ack or Reserve is still in "
        "progress; call again after it"));
  }
  return sp;
}

void SessionTable::Erase(uint64_t id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  auto u = per_uid_.find(it->second.lease.peer.uid);
  if (u != per_uid_.end() && --u->second == 0) per_uid_.erase(u);
  sessions_.erase(it);
}

Session* SessionTable::Find(uint64_t id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

bool SessionTable::HasOtherOf(const std::string& agent_id, uint64_t except_id) const {
  for (const auto& [id, s] : sessions_) {
    if (id != except_id && s.agent_id() == agent_id) return true;
  }
  return false;
}

std::vector<uint64_t> SessionTable::Expired(absl::Time now, bool all) const {
  std::vector<uint64_t> out;
  for (const auto& [id, s] : sessions_) {
    if (s.busy) continue;
    if (all || now >= s.lease.deadline) out.push_back(id);
  }
  return out;
}

}  // namespace polykv::daemon
