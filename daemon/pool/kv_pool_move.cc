// KvPool's side of moving a session to another polykvd: parking it on the
// source, building it on the target (session_move.h says the sequence;
// kv_pool.h documents the members).
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/pool/token.h"
#include "daemon/pool/validation.h"

namespace polykv::daemon {
namespace {

// What the policy and the worker rely on, checked before anything is
// allocated: a peer daemon is trusted with the worker's identity, not with
// a session that breaks the pool's invariants.
absl::Status ValidateMoved(const MovedSession& m) {
  if (auto s = ValidateName("agent_id", m.agent_id, kMaxNameLen); !s.ok()) return s;
  if (auto s = ValidateName("tenant", m.tenant, kMaxTenantLen); !s.ok()) return s;
  if (auto s = ValidateProfile(m.profile); !s.ok()) return s;
  if (auto s = ValidateBlockTokens(m.block_tokens); !s.ok()) return s;
  const uint32_t L = m.profile.num_layers;
  const uint64_t slots = uint64_t(m.blocks.size()) * m.block_tokens;
  if (m.committed_tokens > slots) {
    return absl::InvalidArgumentError(absl::StrCat("moved session commits ", m.committed_tokens,
                                                   " tokens in ", slots, " slots"));
  }
  if (m.records.size() != 1 && m.records.size() != L) {
    return absl::InvalidArgumentError(absl::StrCat("moved session has ", m.records.size(),
                                                   " slot record lists for ", L, " layers"));
  }
  for (const auto& list : m.records) {
    if (list.size() != m.committed_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("moved session has ", list.size(),
                                                     " slot records for ", m.committed_tokens,
                                                     " committed tokens"));
    }
    for (const policies::SlotRecord& r : list) {
      if (r.count == 0) return absl::InvalidArgumentError("moved slot record with count 0");
      for (policies::ScoreStream st : policies::AllScoreStreams()) {
        if (policies::RuleOf(st).per_layer) continue;
        const float v = r.score[st];
        if (!std::isnan(v) && !policies::ValidScore(st, v)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "moved slot record with ", std::string(policies::ScoreStreamName(st)), " ", v));
        }
      }
    }
  }
  if (!m.layer_scores.empty() && m.layer_scores.size() != L) {
    return absl::InvalidArgumentError(absl::StrCat("moved session has ", m.layer_scores.size(),
                                                   " per-layer scores for ", L, " layers"));
  }
  for (const MovedBlock& b : m.blocks) {
    if (!b.present.empty() && b.present.size() != L) {
      return absl::InvalidArgumentError(
          absl::StrCat("moved block names ", b.present.size(), " layers of ", L));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MoveSource> KvPool::ParkForMove(uint64_t session_id, absl::Duration wait) {
  absl::MutexLock lock(&mu_);
  Session* sp = sessions_.Find(session_id);
  if (sp == nullptr || sp->move == Session::Move::kImporting) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id));
  }
  if (sp->move != Session::Move::kNone) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", session_id, " is being moved already"));
  }
  if (sp->offloaded || sp->offloading) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session_id, " is offloaded: it can move once its worker's next Sync has "
        "restored it"));
  }
  sp->move = Session::Move::kRequested;
  // An idle worker touches no page until its next Sync: parked now.
  if (sp->idle && !sp->busy) {
    sp->move = Session::Move::kParked;
    sp->busy = true;
  }
  // The worker parks at its next Sync. The session may end meanwhile (its
  // entry is then gone), so it is looked up afresh each time.
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Session* p = sessions_.Find(session_id);
    return p == nullptr || p->doomed || p->move != Session::Move::kRequested;
  };
  mu_.AwaitWithTimeout(absl::Condition(&settled), wait);
  sp = sessions_.Find(session_id);
  if (sp == nullptr) {
    return absl::NotFoundError(absl::StrCat("session ", session_id, " ended before it parked"));
  }
  Session& s = *sp;
  if (s.doomed) {  // closed or evicted meanwhile
    const bool parked = s.move == Session::Move::kParked;
    s.move = Session::Move::kNone;
    if (parked) return FinishDoomed(s);
    return absl::NotFoundError(absl::StrCat("session ", session_id, " ended before it parked"));
  }
  if (s.move != Session::Move::kParked) {
    s.move = Session::Move::kNone;
    return absl::DeadlineExceededError(absl::StrCat(
        "session ", session_id, "'s worker did not reach a step boundary (Sync) within ",
        absl::FormatDuration(wait), "; nothing moved (an idle worker parks at its next call)"));
  }
  MoveSource out;
  MovedSession& m = out.session;
  m.agent_id = s.agent_id().substr(0, s.agent_id().find('@'));  // the QoS identity's name
  m.tenant = s.tenant_name;
  m.peer = {0, s.lease.peer.uid, s.lease.peer.gid};
  m.profile = s.profile;
  m.block_tokens = s.block_tokens;
  m.key_format = s.shape.key_format;
  m.value_format = s.shape.value_format;
  m.priority = s.priority;
  m.lease_ms = s.lease.lease_ms;
  m.committed_tokens = s.tables.committed_tokens;
  m.records = s.policy.records;
  m.layer_scores = s.policy.layer_scores;
  m.log_count_bias = s.policy.log_count_bias;
  m.next_position = s.policy.next_position;
  m.attention_aged_at = s.policy.attention_aged_at;
  m.current_turn = s.policy.current_turn;
  m.importance_reported = s.policy.importance_reported;
  m.reports = s.policy.reports;
  m.epoch = s.tables.epoch;
  for (const Block& b : s.tables.blocks) {
    MovedBlock mb{b.shape.key_format, b.shape.value_format, b.shape.present};
    m.blocks.push_back(std::move(mb));
    for (size_t i = 0; i < b.pages.size(); ++i) {
      if (b.pages[i] == kNoPage) continue;
      const uint64_t addr = blocks_.HostAddress(s.tenant(), b.pages[i]);
      if (addr == 0) {
        s.move = Session::Move::kNone;
        s.busy = false;
        return absl::UnimplementedError(
            "the session's pages are not in host memory (moving CUDA pages is not built yet)");
      }
      const uint32_t size = b.shape.page_bytes(i);
      out.pages.emplace_back(reinterpret_cast<const std::byte*>(addr), size);
      out.bytes += size;
    }
  }
  return out;
}

absl::Status KvPool::FinishMove(uint64_t session_id, MovedTo to) {
  absl::MutexLock lock(&mu_);
  Session* sp = sessions_.Find(session_id);
  if (sp == nullptr) return absl::NotFoundError(absl::StrCat("no session ", session_id));
  Session& s = *sp;
  s.move = Session::Move::kNone;
  if (s.doomed) return FinishDoomed(s);
  s.busy = false;
  forwards_[session_id] =
      Forward{s.token, s.lease.peer.uid, s.lease.process, std::move(to), Now() + kForwardTtl};
  // Not consented: the worker still maps the pages; they stay quarantined
  // until it hears of the move (TakeForward) or is gone.
  DestroySession(session_id,
                 {SessionEventMsg::Type::kMoved, 0, "the session moved to another polykvd"},
                 /*consented=*/false);
  return absl::OkStatus();
}

void KvPool::AbortMove(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  Session* sp = sessions_.Find(session_id);
  if (sp == nullptr) return;
  const bool parked = sp->move == Session::Move::kParked;
  sp->move = Session::Move::kNone;
  if (!parked) return;
  if (sp->doomed) {
    (void)FinishDoomed(*sp);
    return;
  }
  sp->busy = false;
}

std::optional<MovedTo> KvPool::TakeForward(uint64_t id, absl::string_view token,
                                           const PeerCreds& peer) {
  auto f = forwards_.find(id);
  if (f == forwards_.end() || !TokenEquals(token, f->second.token) || peer.uid != f->second.uid) {
    return std::nullopt;
  }
  MovedTo to = std::move(f->second.to);
  forwards_.erase(f);
  ReleaseQuarantined(id);
  return to;
}

absl::StatusOr<ImportTarget> KvPool::BeginImport(const MovedSession& m) {
  if (auto st = ValidateMoved(m); !st.ok()) return st;
  auto token = NewToken();
  if (!token.ok()) return token.status();
  const kernels::PageShape page{static_cast<int>(m.block_tokens),
                                static_cast<int>(m.profile.num_kv_heads),
                                static_cast<int>(m.profile.head_dim)};
  auto fill = MakeBlockShape(m.profile.num_layers, page, m.key_format, m.value_format,
                             options_.superblock_bytes);
  if (!fill.ok()) return fill.status();
  std::vector<BlockShape> shapes;
  uint64_t need = 0;
  for (const MovedBlock& b : m.blocks) {
    const uint32_t layers =
        b.present.empty() ? m.profile.num_layers
                          : static_cast<uint32_t>(std::count(b.present.begin(), b.present.end(), true));
    auto shape = MakeBlockShape(layers, page, b.key_format, b.value_format,
                                options_.superblock_bytes);
    if (!shape.ok()) return shape.status();
    if (layers != m.profile.num_layers) shape->present = b.present;
    need += shape->bytes();
    shapes.push_back(*std::move(shape));
  }

  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("polykvd is draining; no new sessions");
  if (auto st = CheckRoom(m.peer.uid); !st.ok()) return st;
  auto tenant_key = TenantKey(m.tenant, m.peer);
  if (!tenant_key.ok()) return tenant_key.status();
  const std::string agent = QosIdentity(m.agent_id, m.peer.uid);
  const QosRecord& qos = admission_.For(agent);
  Session s;
  s.token = *std::move(token);
  s.account = {*std::move(tenant_key), agent, 0};
  s.tenant_name = m.tenant;
  s.profile = m.profile;
  s.priority = admission_.HasRecord(agent) ? qos.priority : m.priority;
  s.block_tokens = m.block_tokens;
  s.shape = *fill;
  s.lease.peer = m.peer;
  s.lease.lease_ms = std::clamp(m.lease_ms ? m.lease_ms : options_.default_lease_ms,
                                options_.min_lease_ms, options_.max_lease_ms);
  s.lease.Renew(Now());
  s.events = std::make_shared<EventChannel>();
  s.tables.committed_tokens = m.committed_tokens;
  // The worker's epoch: it attaches with these tables (Attach), and its next
  // Sync here is the step boundary it would have had at the source.
  s.tables.epoch = s.tables.acked_epoch = m.epoch;
  s.policy.records = m.records;
  s.policy.layer_scores = m.layer_scores;
  s.policy.log_count_bias = m.log_count_bias;
  s.policy.next_position = m.next_position;
  s.policy.attention_aged_at = m.attention_aged_at;
  s.policy.current_turn = m.current_turn;
  s.policy.importance_reported = m.importance_reported;
  s.policy.reports = m.reports;
  s.policy.wants = policies_.Streams(qos.policy);
  // Known to no one (nobody has its token) and busy until CompleteImport.
  s.move = Session::Move::kImporting;
  s.busy = true;
  if (auto st = admission_.AdmitReserve(agent, s.priority, need, blocks_); !st.ok()) return st;
  blocks_.AttachSession(s.account);
  Session& in = sessions_.Insert(std::move(s));
  const uint64_t id = in.id;
  // Zeroed like a reservation's pages, though the stream writes them whole.
  admission_.AddInFlight(agent, need);
  absl::Status failure = StageBlocks(in, shapes, /*in_flight=*/true);
  uint64_t staged = 0;
  for (const Block& b : in.tables.staged) staged += b.bytes();
  admission_.RemoveInFlight(agent, need - staged);
  if (in.doomed) return FinishDoomed(in);
  in.tables.blocks = std::move(in.tables.staged);
  in.tables.staged.clear();
  if (failure.ok()) failure = CheckLayerPresence(in);
  if (!failure.ok()) {
    in.busy = false;
    DestroySession(id, {SessionEventMsg::Type::kEvicted, 0, "import failed"}, /*consented=*/true);
    if (absl::IsInternal(failure)) return absl::InvalidArgumentError(failure.message());
    return failure;
  }
  ImportTarget out;
  out.session_id = id;
  for (const Block& b : in.tables.blocks) {
    for (size_t i = 0; i < b.pages.size(); ++i) {
      if (b.pages[i] == kNoPage) continue;
      const uint64_t addr = blocks_.HostAddress(in.tenant(), b.pages[i]);
      if (addr == 0) {
        in.busy = false;
        DestroySession(id, {SessionEventMsg::Type::kEvicted, 0, "import failed"}, true);
        return absl::UnimplementedError(
            "this polykvd's pages are not in host memory (importing into CUDA pages is not "
            "built yet)");
      }
      const uint32_t size = b.shape.page_bytes(i);
      out.pages.emplace_back(reinterpret_cast<std::byte*>(addr), size);
      out.bytes += size;
    }
  }
  return out;
}

absl::StatusOr<MovedTo> KvPool::CompleteImport(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  Session* sp = sessions_.Find(session_id);
  if (sp == nullptr || sp->move != Session::Move::kImporting) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id, " being imported"));
  }
  Session& s = *sp;
  s.move = Session::Move::kNone;
  if (s.doomed) return FinishDoomed(s);
  s.busy = false;
  // Its worker has a lease from now to attach.
  s.lease.Renew(Now());
  return MovedTo{"", s.id, s.token};
}

void KvPool::AbortImport(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  Session* sp = sessions_.Find(session_id);
  if (sp == nullptr || sp->move != Session::Move::kImporting) return;
  sp->move = Session::Move::kNone;
  if (sp->doomed) {
    (void)FinishDoomed(*sp);
    return;
  }
  sp->busy = false;
  DestroySession(session_id, {SessionEventMsg::Type::kEvicted, 0, "import failed"},
                 /*consented=*/true);
}

absl::StatusOr<OpenResult> KvPool::Attach(uint64_t session_id, absl::string_view token,
                                          const PeerCreds& peer) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer, /*mutation=*/true);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  // The worker here is a new process: watched from now on, and told of
  // every arena (it maps them afresh).
  s.lease.peer = peer;
  s.lease.process = options_.process_watcher ? options_.process_watcher(peer.pid) : nullptr;
  s.known_arenas.clear();
  OpenResult out = Describe(s, admission_.For(s.agent_id()));
  for (uint32_t b = 0; b < s.tables.blocks.size(); ++b) {
    out.blocks.push_back(DescribeBlock(options_.superblock_bytes, s.tables.blocks[b], b));
  }
  return out;
}

}  // namespace polykv::daemon
