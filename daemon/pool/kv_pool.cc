#include "daemon/pool/kv_pool.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/compaction/pressure_ladder.h"
#include "daemon/pool/token.h"
#include "daemon/pool/validation.h"
#include "policies/policy.h"

namespace polykv::daemon {
namespace {

// Per call: keeps one Reserve response well under the 64 MiB message limit.
constexpr uint64_t kMaxReserveTokens = 1ull << 16;

// Raises `f` to the floor when it has fewer bits: the QoS contract is that an
// agent's K/V are never stored coarser than its floor.
PageFormat ApplyFloor(PageFormat f, std::optional<PageFormat> floor) {
  if (floor && kernels::FormatBits(f) < kernels::FormatBits(*floor)) return *floor;
  return f;
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(const KvPoolOptions& options) {
  if (!options.arena_factory) return absl::InvalidArgumentError("arena_factory is required");
  if (options.superblock_bytes < kSizeClassAlignment ||
      options.superblock_bytes % kSizeClassAlignment != 0) {
    return absl::InvalidArgumentError("superblock_bytes must be a positive multiple of 256");
  }
  if (options.pool_bytes < options.superblock_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("pool_bytes (", options.pool_bytes,
                                                   ") is smaller than one superblock (",
                                                   options.superblock_bytes, ")"));
  }
  if (options.arena_bytes < options.superblock_bytes) {
    return absl::InvalidArgumentError("arena_bytes must hold at least one superblock");
  }
  if (auto s = ValidateBlockTokens(options.default_block_tokens); !s.ok()) return s;
  return std::unique_ptr<KvPool>(new KvPool(options));
}

KvPool::KvPool(const KvPoolOptions& options)
    : options_(options),
      start_time_(options.clock ? options.clock() : absl::Now()),
      blocks_(BlockPoolOptions{options.pool_bytes, options.arena_bytes, options.superblock_bytes,
                               options.arena_factory, options.first_arena_bytes,
                               options.process_watcher}),
      sessions_(options.max_sessions,
                options.max_sessions_per_uid ? options.max_sessions_per_uid
                                             : std::max<uint32_t>(1, options.max_sessions / 4),
                options.instance ? options.instance : DrawInstance()),
      admission_(options.default_qos, options.pool_bytes, options.low_watermark_bytes) {}

KvPool::~KvPool() { CloseEventStreams(); }

void KvPool::CloseEventStreams() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, s] : sessions_) s.events->Close();
}

absl::StatusOr<uint64_t> KvPool::TableBytes(const std::string& tenant,
                                             const std::vector<Block>& table,
                                             absl::string_view who, BlockPool::Holdings& held,
                                             uint64_t& shared) const {
  uint64_t b = 0;
  for (const Block& block : table) {
    if (block.prefix != 0) {  // the index's pages: counted there, once
      ++held.prefix_refs[tenant][block.prefix];
      shared += block.bytes();
      continue;
    }
    for (PageId page : block.pages) {
      if (page == kNoPage) continue;  // a layer without these slots
      auto loc = blocks_.Locate(tenant, page);
      if (!loc.ok()) return absl::InternalError(absl::StrCat(who, ": ", loc.status().message()));
      b += loc->size_bytes;
      ++held.pages;
    }
  }
  return b;
}

absl::Status KvPool::CheckRecordsWithinPages(const ModelProfile& profile,
                                             const kernels::PageShape& page,
                                             PageFormat key_format, PageFormat value_format,
                                             std::optional<PageFormat> value_floor) const {
  // The most the daemon keeps per committed token: a slot record per layer
  // (per-layer selection). Every token also costs its pages, so while
  // records never outweigh pages the daemon's heap for them stays under
  // pool_bytes, whatever profile a worker claims.
  const uint64_t record_bytes = uint64_t{profile.num_layers} * sizeof(SlotRecord);
  // The token's page bytes once the ladder has lowered its values as far as
  // the agent's floor allows (keys keep their format).
  const PageFormat ladder = LadderValueFormat(value_floor);
  PageFormat lowest_value_format =
      kernels::FormatBits(value_format) <= kernels::FormatBits(ladder) ? value_format : ladder;
  auto lowest = MakeBlockShape(profile.num_layers, page, key_format, lowest_value_format,
                               options_.superblock_bytes);
  if (!lowest.ok()) {
    // A shape the ladder cannot store either (it skips such blocks): the
    // session's own formats are its lowest.
    lowest = MakeBlockShape(profile.num_layers, page, key_format, value_format,
                            options_.superblock_bytes);
    lowest_value_format = value_format;
    if (!lowest.ok()) return lowest.status();
  }
  const uint64_t page_bytes = lowest->bytes() / uint64_t(page.block_tokens);
  if (record_bytes <= page_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "profile too small for polykvd's slot records: each token costs ", record_bytes,
      " bytes of records (", profile.num_layers, " layers x ", sizeof(SlotRecord),
      ") but as little as ", page_bytes, " bytes of pages (", profile.num_kv_heads,
      " KV heads x head_dim ", profile.head_dim, ", keys ",
      std::string(kernels::FormatShortName(key_format)),
      ", values down to ", std::string(kernels::FormatShortName(lowest_value_format)),
      "); polykvd refuses sessions whose records outweigh their pages, so that its memory stays "
      "within pool_bytes. Use wider keys or a value_precision_floor"));
}

std::string KvPool::QosIdentity(const std::string& agent_id, uid_t uid) const {
  const bool names_uids =
      admission_.HasRecord(agent_id) && !admission_.For(agent_id).uids.empty();
  const std::set<uid_t>& named =
      names_uids ? admission_.For(agent_id).uids : options_.operator_uids;
  if (named.empty() || named.contains(uid)) return agent_id;
  return absl::StrCat(agent_id, "@uid", uid);
}

absl::StatusOr<OpenResult> KvPool::Open(const OpenRequest& r) {
  if (auto s = ValidateName("agent_id", r.agent_id, kMaxNameLen); !s.ok()) return s;
  if (auto s = ValidateName("tenant", r.tenant, kMaxTenantLen); !s.ok()) return s;
  if (auto s = ValidateProfile(r.profile); !s.ok()) return s;
  if (r.block_tokens != 0) {
    if (auto s = ValidateBlockTokens(r.block_tokens); !s.ok()) return s;
  }
  if (r.lease_ms != 0 && (r.lease_ms < options_.min_lease_ms || r.lease_ms > options_.max_lease_ms)) {
    return absl::InvalidArgumentError(absl::StrCat("lease_ms must be in ", options_.min_lease_ms,
                                                   "..", options_.max_lease_ms, " (got ",
                                                   r.lease_ms, "); 0 takes the default"));
  }
  if (auto s = CheckCanMap(r.can_map, options_.arena_kind); !s.ok()) return s;
  auto token = NewToken();
  if (!token.ok()) return token.status();

  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("polykvd is draining; no new sessions");
  if (auto st = CheckRoom(r.peer.uid); !st.ok()) return st;
  // The session's QoS identity: the agent's name where its record applies to
  // this uid, else the name qualified by the uid (as unbound tenant names
  // are), which has no record: another uid naming a session like a
  // configured agent gets the default QoS and none of its caps or guarantee.
  const std::string agent = QosIdentity(r.agent_id, r.peer.uid);
  const QosRecord& qos = admission_.For(agent);
  // What the worker asks for, else the agent's QoS, else the defaults.
  const uint32_t block_tokens = r.block_tokens   ? r.block_tokens
                                : qos.block_tokens ? qos.block_tokens
                                                   : options_.default_block_tokens;
  const PageFormat default_format = FormatForDtype(r.profile.dtype);
  const PageFormat kf =
      ApplyFloor(r.key_format.value_or(qos.key_format.value_or(default_format)), qos.key_floor);
  const PageFormat vf = ApplyFloor(
      r.value_format.value_or(qos.value_format.value_or(default_format)), qos.value_floor);
  const kernels::PageShape page{static_cast<int>(block_tokens),
                                static_cast<int>(r.profile.num_kv_heads),
                                static_cast<int>(r.profile.head_dim)};
  auto shape = MakeBlockShape(r.profile.num_layers, page, kf, vf, options_.superblock_bytes);
  if (!shape.ok()) return shape.status();
  if (auto st = CheckRecordsWithinPages(r.profile, page, kf, vf, qos.value_floor); !st.ok()) {
    return st;
  }

  auto tenant_key = TenantKey(r.tenant, r.peer);
  if (!tenant_key.ok()) return tenant_key.status();

  Session s;
  s.token = *std::move(token);
  s.account = {*std::move(tenant_key), agent, 0};
  s.tenant_name = r.tenant;
  s.profile = r.profile;
  s.priority = admission_.HasRecord(agent)
                   ? qos.priority
                   : r.priority_hint.value_or(options_.default_qos.priority);
  s.block_tokens = block_tokens;
  s.shape = *shape;
  s.lease.peer = r.peer;
  if (options_.process_watcher) s.lease.process = options_.process_watcher(r.peer.pid);
  s.lease.lease_ms = r.lease_ms ? r.lease_ms : options_.default_lease_ms;
  s.lease.Renew(Now());
  s.events = std::make_shared<EventChannel>();
  blocks_.AttachSession(s.account);
  Session& in = sessions_.Insert(std::move(s));

  in.policy.wants = policies_.Streams(qos.policy);
  return Describe(in, qos);
}

absl::Status KvPool::CheckRoom(uid_t uid) const {
  // Quarantined sessions count against their uid's cap: letting leases run
  // out must not open more sessions than the cap allows.
  uint32_t quarantined = 0;
  for (const auto& [id, q] : quarantine_) quarantined += q.uid == uid;
  return sessions_.CheckRoom(uid, quarantined);
}

absl::StatusOr<std::string> KvPool::TenantKey(const std::string& tenant,
                                              const PeerCreds& peer) const {
  // A bound tenant is shared by its identities, any other name is the
  // opening uid's own ('@' cannot occur in names).
  if (auto b = options_.tenant_bindings.find(tenant); b != options_.tenant_bindings.end()) {
    if (!b->second.Allows(peer)) {
      return absl::PermissionDeniedError(absl::StrCat(
          "tenant '", tenant, "' is bound to other uids/gids in polykvd's config (tenants:); "
          "uid ", peer.uid, " may not open it"));
    }
    return tenant;
  }
  std::string key = absl::StrCat(tenant, "@uid", peer.uid);
  if (options_.max_tenants_per_uid > 0) {
    std::set<std::string> held = sessions_.TenantsOf(peer.uid);
    std::erase_if(held, [&](const std::string& t) { return options_.tenant_bindings.contains(t); });
    if (!held.contains(key) && held.size() >= options_.max_tenants_per_uid) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "uid ", peer.uid, " already has sessions in ", held.size(),
          " tenants of its own, the most one uid may hold (max_tenants_per_uid); open this "
          "session in one of them, close the others', or raise the limit in polykvd's config"));
    }
  }
  return key;
}

OpenResult KvPool::Describe(Session& s, const QosRecord& qos) {
  OpenResult out;
  out.session_id = s.id;
  out.token = s.token;
  out.lease_ms = s.lease.lease_ms;
  out.block_tokens = s.block_tokens;
  out.key_format = s.shape.key_format;
  out.value_format = s.shape.value_format;
  out.key_page_bytes = s.shape.key_page_bytes;
  out.value_page_bytes = s.shape.value_page_bytes;
  out.epoch = s.tables.epoch;
  out.qos = qos;
  out.qos.agent_id = s.agent_id();
  out.wants = s.policy.wants;
  out.arenas = blocks_.NewArenas(s.tenant(), s.known_arenas);
  out.arena_kind = options_.arena_kind;
  out.cuda_device = OnDevice(options_.arena_kind) ? options_.cuda_device : -1;
  return out;
}

absl::StatusOr<ReserveResult> KvPool::Reserve(uint64_t session_id, absl::string_view token,
                                              const PeerCreds& peer, uint64_t num_tokens) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer, /*mutation=*/true);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (num_tokens == 0 || num_tokens > kMaxReserveTokens) {
    return absl::InvalidArgumentError(absl::StrCat("num_tokens must be in 1..", kMaxReserveTokens,
                                                   " (got ", num_tokens, ")"));
  }
  if (draining_) {
    admission_.CountRefusal();
    return absl::UnavailableError("polykvd is draining; no new reservations");
  }
  const uint64_t want_blocks = (s.reserved_tokens() + num_tokens + s.block_tokens - 1) / s.block_tokens;
  const uint64_t new_blocks = want_blocks - s.tables.blocks.size();
  const uint64_t need = new_blocks * s.shape.bytes();
  if (auto st = admission_.AdmitReserve(s.agent_id(), s.priority, need, blocks_); !st.ok()) {
    return st;
  }
  auto added = AllocateForReserve(s, new_blocks);
  if (!added.ok()) {
    if (absl::IsNotFound(added.status())) return added.status();  // closed meanwhile
    admission_.CountRefusal();
    if (absl::IsResourceExhausted(added.status())) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "pool is full: cannot place ", HumanBytes(need), " for agent '", s.agent_id(), "' (",
          HumanBytes(blocks_.used_bytes()), " of ", HumanBytes(options_.pool_bytes),
          " in pages); retry after sessions release memory"));
    }
    return added.status();
  }
  ReserveResult out;
  for (Block& block : *added) {
    s.tables.blocks.push_back(std::move(block));
    const auto index = static_cast<uint32_t>(s.tables.blocks.size() - 1);
    out.blocks.push_back(DescribeBlock(options_.superblock_bytes, s.tables.blocks.back(), index));
  }
  out.reserved_tokens = s.reserved_tokens();
  out.session_bytes = s.account.bytes + s.account.shared_bytes;
  out.new_arenas = blocks_.NewArenas(s.tenant(), s.known_arenas);
  return out;
}

absl::StatusOr<uint64_t> KvPool::Commit(uint64_t session_id, absl::string_view token,
                                        const PeerCreds& peer, uint64_t committed) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer, /*mutation=*/true);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (committed < s.tables.committed_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "committed_tokens must not go back (now ", s.tables.committed_tokens, ", got ", committed,
        "); use Release to drop tokens"));
  }
  if (committed > s.reserved_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot commit ", committed,
                                                   " tokens: only ", s.reserved_tokens(),
                                                   " are reserved; Reserve first"));
  }
  while (s.policy.records[0].size() < committed) {
    SlotRecord r;
    r.meta.position = s.policy.next_position++;
    r.meta.turn = s.policy.current_turn;
    r.meta.role = policies::Role::kAssistant;  // until the worker reports otherwise
    for (auto& list : s.policy.records) list.push_back(r);  // new tokens: alike in every layer
  }
  s.tables.committed_tokens = committed;
  return committed;
}

absl::StatusOr<SyncResult> KvPool::Sync(uint64_t session_id, absl::string_view token,
                                        const PeerCreds& peer, uint64_t known_epoch,
                                        bool then_idle) {
  SyncResult out;
  std::vector<Block> tables;  // copied, to describe after the lock is released
  {
    absl::MutexLock lock(&mu_);
    auto sp = Authorize(session_id, token, peer, /*mutation=*/false);
    if (absl::IsNotFound(sp.status())) {
      if (auto to = TakeForward(session_id, token, peer)) {
        out.moved_to = *std::move(to);
        return out;
      }
    }
    if (!sp.ok()) return sp.status();
    Session* live = *sp;
    if (live->offloading) {  // its pages are on their way out: then back
      live = AwaitOffloaded(session_id);
      if (live == nullptr) return absl::NotFoundError(absl::StrCat("no session ", session_id));
    }
    Session& s = *live;
    if (known_epoch > s.tables.epoch) {
      return absl::InvalidArgumentError(absl::StrCat("known_epoch ", known_epoch,
                                                     " is ahead of the session's epoch ",
                                                     s.tables.epoch));
    }
    // The worker is back: its pages come back first (new pages, epoch + 1).
    if (s.offloaded && !then_idle) {
      if (auto st = Restore(s); !st.ok()) return st;
    }
    // A move asked for parks the worker here, at its step boundary, once it
    // holds the current tables (ParkForMove waits for this); a parked
    // worker calls Sync again and again until the move is over.
    if (s.move == Session::Move::kRequested && known_epoch == s.tables.epoch && !s.busy) {
      s.move = Session::Move::kParked;
      s.busy = true;
    }
    // Sync is the worker's step boundary (it writes and reads nothing now), so
    // this is where a compaction or a move out of vacated arenas publishes:
    // only when the worker holds the current tables and has acknowledged the
    // previous ones. A move first (it changes the epoch: no compaction then).
    if (known_epoch == s.tables.epoch && s.tables.pending.empty() && !s.busy && !then_idle) {
      if (auto st = Relocate(s); absl::IsNotFound(st)) return st;
      if (s.tables.epoch == known_epoch) {
        if (auto st = CompactAtStepBoundary(s); absl::IsNotFound(st)) return st;
      }
    }
    // A compaction may outlast the lease; the worker's call is live until
    // it returns, so the lease runs from now.
    s.lease.Renew(Now());
    out.parked = s.move == Session::Move::kParked;
    // Idle only over the tables the worker holds: a move copies the current
    // ones, and the worker takes them for its own.
    s.idle = then_idle && !out.parked && known_epoch == s.tables.epoch;
    if (s.idle) s.idle_since = Now();
    out.epoch = s.tables.epoch;
    out.committed_tokens = s.tables.committed_tokens;
    out.wants = s.policy.wants;
    out.changed = known_epoch != s.tables.epoch;
    out.same_slots = out.changed && s.tables.slots_epoch <= known_epoch;
    if (out.changed) {
      tables = s.tables.blocks;
      const std::vector<SlotRecord>& first = s.policy.records[0];
      out.slot_positions.reserve(first.size());
      out.slot_counts.reserve(first.size());
      for (const SlotRecord& r : first) {
        out.slot_positions.push_back(r.meta.position);
        out.slot_counts.push_back(s.policy.log_count_bias ? r.count : 1);
      }
      if (s.policy.layers_apart()) {
        out.layer_slot_positions.reserve(first.size() * s.profile.num_layers);
        for (const auto& list : s.policy.records) {
          for (const SlotRecord& r : list) out.layer_slot_positions.push_back(r.meta.position);
        }
      }
    }
    out.new_arenas = blocks_.NewArenas(s.tenant(), s.known_arenas);
  }
  // Describing is arithmetic on the page ids copied above, so it needs no
  // lock (and a session closed meanwhile only gets tables it will not use).
  out.blocks.reserve(tables.size());
  for (uint32_t b = 0; b < tables.size(); ++b) {
    out.blocks.push_back(DescribeBlock(options_.superblock_bytes, tables[b], b));
  }
  return out;
}

absl::Status KvPool::Ack(uint64_t session_id, absl::string_view token, const PeerCreds& peer,
                         uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer, /*mutation=*/true);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  BlockTables& t = s.tables;
  if (epoch > t.epoch || epoch < t.acked_epoch) {
    return absl::InvalidArgumentError(absl::StrCat("cannot ack epoch ", epoch, ": session is at ",
                                                   t.epoch, ", acked ", t.acked_epoch));
  }
  t.acked_epoch = epoch;
  if (t.pending.empty() || epoch < t.pending_epoch) return absl::OkStatus();
  // Old pages go back a few blocks per hold of the lock; the session is
  // marked busy meanwhile so nothing else changes its tables.
  s.busy = true;
  if (!FreeGradually(s, t.pending, /*pending=*/true)) {
    (void)FinishDoomed(s);
    return absl::OkStatus();  // the ack itself succeeded; the session is gone now
  }
  s.busy = false;
  return absl::OkStatus();
}

absl::StatusOr<ReleaseResult> KvPool::Release(uint64_t session_id, absl::string_view token,
                                              const PeerCreds& peer, uint64_t keep_tokens) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer, /*mutation=*/true);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (keep_tokens > s.reserved_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("keep_tokens ", keep_tokens,
                                                   " exceeds the reserve of ",
                                                   s.reserved_tokens(), " tokens"));
  }
  // A cut inside or before a layer's hole would leave that layer without the
  // block new tokens fill; a cut to nothing leaves every layer empty alike.
  uint64_t late = 0;  // the last hole's end
  for (const LayerHole& h : LayerHoles(s.tables.blocks, s.profile.num_layers, s.block_tokens)) {
    if (!h.empty()) late = std::max(late, h.end());
  }
  if (late > 0 && keep_tokens > 0 && keep_tokens <= late) {
    return absl::FailedPreconditionError(absl::StrCat(
        "keep_tokens ", keep_tokens, " would leave a layer without the slots new tokens fill: "
        "the layers keep budgets of their own and one holds no slot before ", late,
        " but its leading shared ones; keep more than ", late, " tokens, or 0 to start over"));
  }
  const uint64_t keep_blocks = (keep_tokens + s.block_tokens - 1) / s.block_tokens;
  // The worker writes on from keep_tokens: never into a shared block.
  if (keep_tokens % s.block_tokens != 0 && s.tables.blocks[keep_blocks - 1].prefix != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "keep_tokens ", keep_tokens, " ends inside block ", keep_blocks - 1,
        ", a shared prefix block other sessions read: keep a multiple of ", s.block_tokens,
        " tokens there (", (keep_blocks - 1) * s.block_tokens, " or ",
        keep_blocks * s.block_tokens, ")"));
  }
  while (s.tables.blocks.size() > keep_blocks) {
    blocks_.Free(s.account, s.tables.blocks.back());
    s.tables.blocks.pop_back();
  }
  s.tables.committed_tokens = std::min(s.tables.committed_tokens, keep_tokens);
  for (auto& list : s.policy.records) list.resize(s.tables.committed_tokens);
  return ReleaseResult{s.reserved_tokens(), s.tables.committed_tokens,
                       s.account.bytes + s.account.shared_bytes};
}

uint64_t KvPool::DestroySession(uint64_t session_id, SessionEventMsg last_event,
                                bool consented) {
  Session* sp = sessions_.Find(session_id);
  if (sp == nullptr) return 0;
  Session& s = *sp;
  if (s.busy) {
    // Its compaction works without the lock; it finishes the destruction
    // when it gets the lock back.
    s.doomed = true;
    s.doom_consented = consented;
    s.doom_event = std::move(last_event);
    return s.account.bytes;
  }
  if (s.offloaded) {  // its own pages are in the store; the shared blocks it held go below
    options_.offload_store->Drop(session_id);
    for (Block& b : s.offloaded->blocks) {
      if (b.prefix != 0) s.tables.blocks.push_back(std::move(b));
    }
    s.offloaded.reset();
  }
  const uint64_t before = s.account.bytes;
  if (!consented && s.lease.process && s.lease.process->Alive() && before > 0) {
    QuarantinedSession q{s.token, s.lease.peer.uid, s.lease.process, s.account, {}};
    for (auto* table : {&s.tables.blocks, &s.tables.staged, &s.tables.pending}) {
      for (Block& block : *table) q.blocks.push_back(std::move(block));
      table->clear();
    }
    pending_bytes_ -= s.tables.pending_bytes;
    s.tables.pending_bytes = 0;
    s.account.bytes = 0;  // the quarantine's account holds them now
    s.account.shared_bytes = 0;
    quarantine_.emplace(session_id, std::move(q));
  } else {
    for (auto* table : {&s.tables.blocks, &s.tables.staged}) {
      for (Block& block : *table) blocks_.Free(s.account, block);
      table->clear();
    }
    FreePending(s);
  }
  s.events->Push(std::move(last_event));
  s.events->Close();
  blocks_.DetachSession(s.account);
  const std::string agent = s.agent_id();
  const bool other = sessions_.HasOtherOf(agent, session_id);
  sessions_.Erase(session_id);
  if (!other) blocks_.ForgetAgent(agent);
  return before;
}

void KvPool::ReleaseQuarantined(uint64_t id) {
  auto it = quarantine_.find(id);
  if (it == quarantine_.end()) return;
  QuarantinedSession& q = it->second;
  for (Block& block : q.blocks) blocks_.Free(q.account, block);
  const std::string agent = q.account.agent_id;
  quarantine_.erase(it);
  if (!sessions_.HasOtherOf(agent, 0)) blocks_.ForgetAgent(agent);
}

absl::StatusOr<Session*> KvPool::Authorize(uint64_t id, absl::string_view token,
                                           const PeerCreds& peer, bool mutation) {
  auto sp = mutation ? sessions_.AuthorizeMutation(id, token, peer, Now())
                     : sessions_.Authorize(id, token, peer, Now());
  if (sp.ok()) {
    Session& s = **sp;
    if (mutation && (s.offloaded || s.offloading)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "session ", id, " is offloaded (its worker went idle): its next Sync restores it"));
    }
    s.idle = false;  // the worker is at work again
  }
  if (!absl::IsNotFound(sp.status())) return sp;
  auto q = quarantine_.find(id);
  if (q != quarantine_.end() && TokenEquals(token, q->second.token) && peer.uid == q->second.uid) {
    // The worker hears now that the session is gone, and stops using its
    // pages (the client library fails every later call on it).
    ReleaseQuarantined(id);
  }
  return sp;
}

absl::StatusOr<uint64_t> KvPool::Close(uint64_t session_id, absl::string_view token,
                                       const PeerCreds& peer) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer, /*mutation=*/false);
  if (!sp.ok()) return sp.status();
  return DestroySession(session_id, {SessionEventMsg::Type::kEvicted, 0, "session closed"},
                        /*consented=*/true);
}

absl::StatusOr<HeartbeatResult> KvPool::Heartbeat(uint64_t session_id, absl::string_view token,
                                                  const PeerCreds& peer) {
  absl::MutexLock lock(&mu_);
  // Not Authorize: a heartbeat (or Watch, or an fd fetch) comes from a
  // thread other than the one writing the session's pages, so its NOT_FOUND
  // does not mean the writer has stopped; quarantined pages stay.
  auto sp = sessions_.Authorize(session_id, token, peer, Now());
  if (!sp.ok()) return sp.status();
  return HeartbeatResult{(*sp)->lease.lease_ms, (*sp)->tables.epoch, draining_};
}

absl::StatusOr<std::shared_ptr<EventChannel>> KvPool::Watch(uint64_t session_id,
                                                            absl::string_view token,
                                                            const PeerCreds& peer) {
  absl::MutexLock lock(&mu_);
  auto sp = sessions_.Authorize(session_id, token, peer, Now());
  if (!sp.ok()) return sp.status();
  return (*sp)->events;
}

absl::StatusOr<ArenaFd> KvPool::DupArenaFd(uint64_t session_id, absl::string_view token,
                                           const PeerCreds& peer, uint32_t arena_id) {
  absl::MutexLock lock(&mu_);
  auto sp = sessions_.Authorize(session_id, token, peer, Now());
  if (!sp.ok()) return sp.status();
  return blocks_.DupArenaFd((*sp)->tenant(), arena_id, peer.pid);
}

std::vector<KvPool::Reclaimed> KvPool::ReclaimExpired() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  std::vector<Reclaimed> out;
  for (uint64_t id : sessions_.Expired(now, now >= drain_evict_at_)) {
    const bool lease = now >= sessions_.Find(id)->lease.deadline;
    if (lease) ++lease_expiries_;
    out.push_back({id, lease ? "lease" : "drain"});
    DestroySession(id,
                   {SessionEventMsg::Type::kEvicted, 0,
                    lease ? "lease expired" : "evicted at the end of the drain"},
                   /*consented=*/false);
  }
  // Quarantined pages of workers that are gone, and retired arenas nobody
  // can map any more, go back.
  std::vector<uint64_t> gone;
  for (const auto& [id, q] : quarantine_) {
    if (!q.process->Alive()) gone.push_back(id);
  }
  for (uint64_t id : gone) ReleaseQuarantined(id);
  // Forwards of moved sessions whose worker is gone or never asked.
  std::erase_if(forwards_, [&](const auto& f) {
    return now >= f.second.deadline || (f.second.process && !f.second.process->Alive());
  });
  blocks_.SweepRetired();
  return out;
}

}  // namespace polykv::daemon
