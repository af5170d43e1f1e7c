// Fuzz target: the Session and Admin requests, as the services take them.
// Each command's payload is parsed as the request proto its op names, goes
// through rpc/convert (FromProto) and the pool's own checks, and reaches the
// real KvPool call on a fresh in-process pool; replies are converted back
// (ToProto) and must serialize and parse again. After every command the
// pool's invariants must hold, and no call may answer INTERNAL or UNKNOWN.
//
// Input: commands as in fuzz_input.h.
//   op % 24: 0 OpenSession  1 Reserve  2 Commit  3 Sync  4 Ack  5 Release
//            6 CloseSession  7 Heartbeat  8 Watch  9 ReportSlots
//            10 GetStats  11 ListSessions  12 GetQos  13 SetQos
//            14 EvictSession  15 Drain  16 clock += payload ms, reclaim
//            17 pressure ladder  18 DupArenaFd  19 validation.h directly
//            20 the session's worker process exits (then reclaim)
//            21 a peer's ImportSession (payload: MovedSession; completed
//               with flag 0x08, else aborted)  22 AttachSession
//            23 MoveSession's park, with no worker to park (times out)
//   flags:   0x01 session_id := a live session's   0x02 token := its token
//            0x04 call as the other uid             0x30 which session (of
//            those open: two opened in setup, later Opens append)
// Without the flags the ids and tokens are the fuzzer's, so forged and
// unknown sessions are exercised as much as valid ones. Every worker lives
// (the pool's quarantine applies) until op 20 ends its process.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "daemon/pool/validation.h"
#include "daemon/rpc/convert.h"
#include "daemon/rpc/move_convert.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/fuzz_support.h"

namespace polykv::fuzz {
namespace {

using daemon::KvPool;
using daemon::PeerCreds;

constexpr int kMaxCommands = 32;
constexpr size_t kMaxSessions = 8;
const PeerCreds kPeerA{100, 1000, 1000};
const PeerCreds kPeerB{200, 2000, 2000};

// A worker process as the pool's ProcessWatcher sees it; `alive` is the
// Run's to clear.
class FakeProcess : public daemon::ProcessRef {
 public:
  FakeProcess(pid_t pid, std::shared_ptr<const bool> alive) : pid_(pid), alive_(std::move(alive)) {}
  pid_t pid() const override { return pid_; }
  bool Alive() const override { return *alive_; }

 private:
  const pid_t pid_;
  const std::shared_ptr<const bool> alive_;
};

struct Known {
  uint64_t id = 0;
  std::string token;
  std::string agent;
  PeerCreds peer;
};

// One input's world: a fresh pool, a fake clock, the sessions it knows.
class Run {
 public:
  Run() : pool_(MakeFuzzPool([this] { return now_; }, [this](pid_t pid) { return ProcessOf(pid); })) {
    known_.reserve(kMaxSessions);  // target_ points into it across an Open
    Open(FuzzOpenRequest("a", "t1", kPeerA));
    Open(FuzzOpenRequest("b", "t2", kPeerB));
    if (known_.size() != 2) Fail("setup sessions did not open");
  }

  void Do(const Command& c) {
    flags_ = c.flags;
    const Known& k = known_[((c.flags >> 4) & 3) % known_.size()];
    target_ = &k;
    peer_ = (c.flags & 0x04) ? (k.peer.uid == kPeerA.uid ? kPeerB : kPeerA) : k.peer;
    switch (c.op % 21) {
      case 0: OpenSession(c.payload); break;
      case 1: Reserve(c.payload); break;
      case 2: Commit(c.payload); break;
      case 3: Sync(c.payload); break;
      case 4: Ack(c.payload); break;
      case 5: Release(c.payload); break;
      case 6: Close(c.payload); break;
      case 7: Heartbeat(c.payload); break;
      case 8: Watch(c.payload); break;
      case 9: ReportSlots(c.payload); break;
      case 10: Stats(); break;
      case 11: ListSessions(c.payload); break;
      case 12: GetQos(c.payload); break;
      case 13: SetQos(c.payload); break;
      case 14: Evict(c.payload); break;
      case 15: Drain(c.payload); break;
      case 16: Advance(c.payload); break;
      case 17: pool_->RunPressureLadder(); break;
      case 18: DupArenaFd(c.payload); break;
      case 19: Validate(c.payload); break;
      case 20: Exit(k.peer.pid); break;
      case 21: Import(c.payload); break;
      case 22: Attach(c.payload); break;
      case 23: Park(); break;
    }
    CheckOk(pool_->CheckInvariants(), "KvPool::CheckInvariants");
  }

 private:
  std::shared_ptr<const daemon::ProcessRef> ProcessOf(pid_t pid) {
    auto& alive = alive_[pid];
    if (!alive) alive = std::make_shared<bool>(true);
    if (!*alive) return nullptr;  // the watcher's answer for a process already gone
    return std::make_shared<FakeProcess>(pid, alive);
  }

  void Exit(pid_t pid) {
    if (auto it = alive_.find(pid); it != alive_.end()) *it->second = false;
    pool_->ReclaimExpired();
  }

  // The session fields of a request, after the flags' substitutions.
  std::pair<uint64_t, std::string> Ref(const v1::SessionRef& r) const {
    return {(flags_ & 0x01) ? target_->id : r.session_id(),
            (flags_ & 0x02) ? target_->token : r.token()};
  }

  template <typename Req>
  static bool Parse(std::string_view payload, Req* r) {
    return r->ParseFromArray(payload.data(), static_cast<int>(payload.size()));
  }

  void Open(const daemon::OpenRequest& r) {
    auto out = pool_->Open(r);
    CheckRefusal(out.status(), "Open");
    if (!out.ok()) return;
    v1::OpenSessionResponse resp;
    daemon::ToProto(*out, &resp);
    CheckRoundTrip(resp, "OpenSessionResponse");
    if (known_.size() < kMaxSessions) {
      known_.push_back({out->session_id, out->token, r.agent_id, r.peer});
    }
  }

  void OpenSession(std::string_view p) {
    v1::OpenSessionRequest r;
    if (!Parse(p, &r)) return;
    auto o = daemon::FromProto(r, peer_);
    CheckRefusal(o.status(), "FromProto(OpenSessionRequest)");
    if (o.ok()) Open(*o);
  }

  void Reserve(std::string_view p) {
    v1::ReserveRequest r;
    if (!Parse(p, &r)) return;
    auto [id, token] = Ref(r.session());
    auto out = pool_->Reserve(id, token, peer_, r.num_tokens());
    CheckRefusal(out.status(), "Reserve");
    if (!out.ok()) return;
    v1::ReserveResponse resp;
    for (const auto& b : out->blocks) daemon::ToProto(b, resp.add_blocks());
    for (const auto& a : out->new_arenas) daemon::ToProto(a, resp.add_new_arenas());
    CheckRoundTrip(resp, "ReserveResponse");
  }

  void Commit(std::string_view p) {
    v1::CommitRequest r;
    if (!Parse(p, &r)) return;
    auto [id, token] = Ref(r.session());
    CheckRefusal(pool_->Commit(id, token, peer_, r.committed_tokens()).status(), "Commit");
  }

  void Sync(std::string_view p) {
    v1::SyncRequest r;
    if (!Parse(p, &r)) return;
    auto [id, token] = Ref(r.session());
    auto out = pool_->Sync(id, token, peer_, r.known_epoch());
    CheckRefusal(out.status(), "Sync");
    if (!out.ok()) return;
    if (out->changed && (out->slot_positions.size() != out->committed_tokens ||
                         out->slot_counts.size() != out->committed_tokens)) {
      Fail("Sync: slot positions/counts do not cover the committed tokens");
    }
    v1::SyncResponse resp;
    for (const auto& b : out->blocks) daemon::ToProto(b, resp.add_blocks());
    for (const auto& a : out->new_arenas) daemon::ToProto(a, resp.add_new_arenas());
    CheckRoundTrip(resp, "SyncResponse");
  }

  void Ack(std::string_view p) {
    v1::AckRequest r;
    if (!Parse(p, &r)) return;
    auto [id, token] = Ref(r.session());
    CheckRefusal(pool_->Ack(id, token, peer_, r.epoch()), "Ack");
  }

  void Release(std::string_view p) {
    v1::ReleaseRequest r;
    if (!Parse(p, &r)) return;
    auto [id, token] = Ref(r.session());
    CheckRefusal(pool_->Release(id, token, peer_, r.keep_tokens()).status(), "Release");
  }

  void Close(std::string_view p) {
    v1::CloseSessionRequest r;
    if (!Parse(p, &r)) return;
    auto [id, token] = Ref(r.session());
    CheckRefusal(pool_->Close(id, token, peer_).status(), "Close");
  }

  void Heartbeat(std::string_view p) {
    v1::HeartbeatRequest r;
    if (!Parse(p, &r)) return;
    auto [id, token] = Ref(r.session());
    CheckRefusal(pool_->Heartbeat(id, token, peer_).status(), "Heartbeat");
  }

  void Watch(std::string_view p) {
    v1::WatchRequest r;
    if (!Parse(p, &r)) return;
    auto [id, token] = Ref(r.session());
    auto ch = pool_->Watch(id, token, peer_);
    CheckRefusal(ch.status(), "Watch");
    if (!ch.ok()) return;
    // What a Watch stream would send now, without waiting.
    while (auto e = (*ch)->Next(absl::ZeroDuration())) {
      v1::SessionEvent ev;
      ev.set_type(static_cast<v1::SessionEvent::Type>(e->type));
      ev.set_message(e->message);
      CheckRoundTrip(ev, "SessionEvent");
    }
  }

  void ReportSlots(std::string_view p) {
    v1::ReportSlotsRequest r;
    if (!Parse(p, &r)) return;
    auto [id, token] = Ref(r.session());
    auto req = daemon::FromProto(r);
    CheckRefusal(req.status(), "FromProto(ReportSlotsRequest)");
    if (req.ok()) CheckRefusal(pool_->ReportSlots(id, token, peer_, *req), "ReportSlots");
  }

  void Stats() {
    v1::Stats resp;
    daemon::ToProto(pool_->Stats(), &resp);
    CheckRoundTrip(resp, "Stats");
  }

  void ListSessions(std::string_view p) {
    v1::ListSessionsRequest r;
    if (!Parse(p, &r)) return;
    v1::ListSessionsResponse resp;
    for (const auto& s : pool_->ListSessions(r.tenant(), r.agent_id())) {
      daemon::ToProto(s, resp.add_sessions());
    }
    CheckRoundTrip(resp, "ListSessionsResponse");
  }

  void GetQos(std::string_view p) {
    v1::GetQosRequest r;
    if (!Parse(p, &r) || r.agent_id().empty()) return;  // the service refuses an empty id
    v1::QosRecord resp;
    daemon::ToProto(pool_->GetQos(r.agent_id()), &resp);
    CheckRoundTrip(resp, "GetQos");
  }

  void SetQos(std::string_view p) {
    v1::SetQosRequest r;
    if (!Parse(p, &r)) return;
    if (flags_ & 0x01) r.mutable_qos()->set_agent_id(target_->agent);
    auto q = daemon::FromProto(r.qos());
    CheckRefusal(q.status(), "FromProto(QosRecord)");
    if (!q.ok()) return;
    auto out = pool_->SetQos(*q);
    CheckRefusal(out.status(), "SetQos");
    if (!out.ok()) return;
    v1::QosRecord resp;
    daemon::ToProto(*out, &resp);
    CheckRoundTrip(resp, "SetQos");
  }

  void Evict(std::string_view p) {
    v1::EvictSessionRequest r;
    if (!Parse(p, &r)) return;
    const uint64_t id = (flags_ & 0x01) ? target_->id : r.session_id();
    CheckRefusal(pool_->Evict(id, "by fuzzer").status(), "Evict");
  }

  void Drain(std::string_view p) {
    v1::DrainRequest r;
    if (!Parse(p, &r)) return;
    pool_->Drain(absl::Milliseconds(r.evict_after_ms()));
  }

  // A session a peer daemon moves here, in the fuzzer's uid; its pages are
  // written whole (as the stream would) before it completes.
  void Import(std::string_view p) {
    v1::MovedSession m;
    if (!Parse(p, &m)) return;
    auto moved = daemon::FromProto(m);
    CheckRefusal(moved.status(), "FromProto(MovedSession)");
    if (!moved.ok()) return;
    moved->peer = peer_;
    auto t = pool_->BeginImport(*moved);
    CheckRefusal(t.status(), "BeginImport");
    if (!t.ok()) return;
    for (const auto& page : t->pages) std::memset(page.data(), 0x5a, page.size());
    if (!(flags_ & 0x08)) {
      pool_->AbortImport(t->session_id);
      return;
    }
    auto done = pool_->CompleteImport(t->session_id);
    CheckRefusal(done.status(), "CompleteImport");
    if (done.ok() && known_.size() < kMaxSessions) {
      known_.push_back({done->session_id, done->token, moved->agent_id, peer_});
    }
  }

  void Attach(std::string_view p) {
    v1::AttachSessionRequest r;
    if (!Parse(p, &r)) return;
    auto [id, token] = Ref(r.session());
    auto out = pool_->Attach(id, token, peer_);
    CheckRefusal(out.status(), "Attach");
    if (!out.ok()) return;
    v1::OpenSessionResponse resp;
    daemon::ToProto(*out, &resp);
    CheckRoundTrip(resp, "OpenSessionResponse (attach)");
  }

  // Nobody Syncs meanwhile: the park times out and must leave the session
  // as it was (the invariants, and the calls after it).
  void Park() {
    auto out = pool_->ParkForMove(target_->id, absl::ZeroDuration());
    if (out.ok()) Fail("ParkForMove: parked with no worker at a step boundary");
    CheckRefusal(out.status(), "ParkForMove");
  }

  static uint32_t U32(std::string_view p) {
    uint32_t v = 0;
    std::memcpy(&v, p.data(), std::min(p.size(), sizeof(v)));
    return v;
  }

  void Advance(std::string_view p) {
    now_ += absl::Milliseconds(U32(p));
    pool_->ReclaimExpired();
  }

  void DupArenaFd(std::string_view p) {
    auto fd = pool_->DupArenaFd(target_->id, target_->token, peer_, U32(p));
    CheckRefusal(fd.status(), "DupArenaFd");
    if (fd.ok()) close(fd->fd);
  }

  void Validate(std::string_view p) {
    const absl::string_view name(p.data(), p.size());
    CheckRefusal(daemon::ValidateName("name", name, 128), "ValidateName");
    CheckRefusal(daemon::ValidateBlockTokens(U32(p)), "ValidateBlockTokens");
    v1::ModelProfile m;
    if (!Parse(p, &m)) return;
    const daemon::ModelProfile profile{m.num_layers(), m.num_kv_heads(), m.head_dim(),
                                       daemon::DType::kF16, m.model_id()};
    CheckRefusal(daemon::ValidateProfile(profile), "ValidateProfile");
  }

  absl::Time now_ = absl::FromUnixSeconds(1000000);
  std::map<pid_t, std::shared_ptr<bool>> alive_;  // by pid, for the pool's watcher
  std::unique_ptr<KvPool> pool_;
  std::vector<Known> known_;
  // Of the command being run.
  uint8_t flags_ = 0;
  const Known* target_ = nullptr;
  PeerCreds peer_;
};

}  // namespace
}  // namespace polykv::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  polykv::fuzz::Run run;
  polykv::fuzz::FuzzInput in(data, size);
  for (int i = 0; i < polykv::fuzz::kMaxCommands; ++i) {
    auto c = in.Next();
    if (!c) break;
    run.Do(*c);
  }
  return 0;
}
