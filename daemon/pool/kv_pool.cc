#include "daemon/pool/kv_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "daemon/pool/token.h"
#include "daemon/pool/validation.h"
#include "policies/policy.h"

namespace polykv::daemon {
namespace {

// Per call: keeps one Reserve response well under the 64 MiB message limit.
constexpr uint64_t kMaxReserveTokens = 1ull << 16;
constexpr uint32_t kMaxArenaId = (1u << 16) - 1;
constexpr size_t kMaxNameLen = 128;
constexpr size_t kMaxTenantLen = 64;

PageFormat FormatForDtype(DType d) {
  switch (d) {
    case DType::kF32: return PageFormat::kF32;
    case DType::kBF16: return PageFormat::kBF16;
    case DType::kF16: return PageFormat::kF16;
  }
  return PageFormat::kF16;
}

// Raises `f` to the floor when it has fewer bits: the QoS contract is that an
// agent's K/V are never stored coarser than its floor.
PageFormat ApplyFloor(PageFormat f, std::optional<PageFormat> floor) {
  if (floor && kernels::FormatBits(f) < kernels::FormatBits(*floor)) return *floor;
  return f;
}

std::string Human(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return absl::StrCat(bytes / double(1ull << 30), " GiB");
  if (bytes >= (1ull << 20)) return absl::StrCat(bytes / double(1ull << 20), " MiB");
  if (bytes >= (1ull << 10)) return absl::StrCat(bytes / double(1ull << 10), " KiB");
  return absl::StrCat(bytes, " B");
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
    : options_(options), start_time_(options.clock ? options.clock() : absl::Now()) {}

KvPool::~KvPool() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, s] : sessions_) s.events->Close();
}

absl::Status KvPool::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  uint64_t tenant_used = 0;
  for (const auto& [name, t] : tenants_) {
    if (auto s = t->allocator.CheckInvariants(); !s.ok()) return s;
    tenant_used += t->allocator.used_bytes();
  }
  uint64_t session_bytes = 0, pages = 0, pending_total = 0;
  std::map<std::string, uint64_t> by_agent;
  for (const auto& [id, s] : sessions_) {
    uint64_t b = 0;
    const Tenant& t = *tenants_.at(s.tenant);
    uint64_t pending = 0;
    for (const auto* table : {&s.blocks, &s.pending_blocks, &s.staged_blocks}) {
      for (const auto& block : *table) {
        for (size_t i = 0; i < block.size(); ++i) {
          auto loc = t.allocator.Locate(block[i]);
          if (!loc.ok()) return absl::InternalError(absl::StrCat("session ", id, ": ", loc.status().message()));
          b += loc->size_bytes;
          if (table == &s.pending_blocks) pending += loc->size_bytes;
          ++pages;
        }
      }
    }
    if (b != s.bytes) return absl::InternalError(absl::StrCat("session ", id, " byte count drifted"));
    if (pending != s.pending_bytes) {
      return absl::InternalError(absl::StrCat("session ", id, " pending byte count drifted"));
    }
    if (s.slots.size() != s.committed_tokens) {
      return absl::InternalError(absl::StrCat("session ", id, ": ", s.slots.size(),
                                              " slot records for ", s.committed_tokens,
                                              " committed tokens"));
    }
    pending_total += pending;
    session_bytes += b;
    by_agent[s.agent_id] += b;
  }
  if (session_bytes != used_bytes_ || tenant_used != used_bytes_) {
    return absl::InternalError(absl::StrCat("used bytes: pool ", used_bytes_, ", tenants ",
                                            tenant_used, ", sessions ", session_bytes));
  }
  for (const auto& [agent, b] : agent_bytes_) {
    if (by_agent[agent] != b) return absl::InternalError(absl::StrCat("agent ", agent, " bytes drifted"));
  }
  if (pending_total != pending_bytes_) {
    return absl::InternalError(absl::StrCat("pending bytes: pool ", pending_bytes_, ", sessions ",
                                            pending_total));
  }
  uint64_t format_pages = 0;
  for (const auto& [k, n] : pages_by_format_) format_pages += n;
  if (format_pages != pages) return absl::InternalError("pages-by-format count drifted");
  return absl::OkStatus();
}

const QosRecord& KvPool::QosFor(const std::string& agent_id) const {
  auto it = qos_.find(agent_id);
  return it != qos_.end() ? it->second : options_.default_qos;
}

absl::StatusOr<KvPool::Session*> KvPool::Authorize(uint64_t session_id, absl::string_view token,
                                                   const PeerCreds& peer) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no session ", session_id, " (closed, evicted, or its lease expired); open a new one"));
  }
  Session& s = it->second;
  if (!TokenEquals(token, s.token)) {
    return absl::PermissionDeniedError(
        absl::StrCat("wrong capability token for session ", session_id));
  }
  if (peer.uid != s.peer.uid) {
    return absl::PermissionDeniedError(absl::StrCat(
        "session ", session_id, " belongs to uid ", s.peer.uid, ", not uid ", peer.uid));
  }
  const absl::Time now = options_.clock ? options_.clock() : absl::Now();
  s.last_seen = now;
  s.deadline = now + absl::Milliseconds(s.lease_ms);
  return &s;
}

absl::StatusOr<KvPool::Session*> KvPool::AuthorizeMutation(uint64_t session_id,
                                                           absl::string_view token,
                                                           const PeerCreds& peer) {
  auto sp = Authorize(session_id, token, peer);
  if (!sp.ok()) return sp;
  if ((*sp)->compacting) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session_id, " is being compacted (a Sync is in progress); call again after it"));
  }
  return sp;
}

absl::StatusOr<OpenResult> KvPool::Open(const OpenRequest& r) {
  if (auto s = ValidateName("agent_id", r.agent_id, kMaxNameLen); !s.ok()) return s;
  if (auto s = ValidateName("tenant", r.tenant, kMaxTenantLen); !s.ok()) return s;
  if (auto s = ValidateProfile(r.profile); !s.ok()) return s;
  const uint32_t block_tokens = r.block_tokens ? r.block_tokens : options_.default_block_tokens;
  if (auto s = ValidateBlockTokens(block_tokens); !s.ok()) return s;
  if (r.lease_ms != 0 && (r.lease_ms < options_.min_lease_ms || r.lease_ms > options_.max_lease_ms)) {
    return absl::InvalidArgumentError(absl::StrCat("lease_ms must be in ", options_.min_lease_ms,
                                                   "..", options_.max_lease_ms, " (got ",
                                                   r.lease_ms, "); 0 takes the default"));
  }
  auto token = NewToken();
  if (!token.ok()) return token.status();

  absl::MutexLock lock(&mu_);
  if (draining_) return absl::UnavailableError("polykvd is draining; no new sessions");
  if (sessions_.size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("session limit reached (", options_.max_sessions, " sessions)"));
  }
  const QosRecord& qos = QosFor(r.agent_id);
  const PageFormat default_format = FormatForDtype(r.profile.dtype);
  const PageFormat kf = ApplyFloor(r.key_format.value_or(default_format), qos.key_floor);
  const PageFormat vf = ApplyFloor(r.value_format.value_or(default_format), qos.value_floor);
  const kernels::PageShape shape{static_cast<int>(block_tokens),
                                 static_cast<int>(r.profile.num_kv_heads),
                                 static_cast<int>(r.profile.head_dim)};
  const uint64_t kb = kernels::PageBytes(kf, kernels::KvKind::kKey, shape);
  const uint64_t vb = kernels::PageBytes(vf, kernels::KvKind::kValue, shape);
  if (kb == 0 || vb == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "formats ", std::string(kernels::FormatShortName(kf)), "/",
        std::string(kernels::FormatShortName(vf)),
        " cannot store heads of ", r.profile.head_dim, " channels (quantized values need head_dim "
        "divisible by the value group)"));
  }
  if (std::max(kb, vb) > options_.superblock_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a page would be ", std::max(kb, vb), " bytes, over the superblock size (",
        options_.superblock_bytes, "); use smaller block_tokens"));
  }

  Session s;
  s.id = next_session_id_++;
  s.token = *std::move(token);
  s.agent_id = r.agent_id;
  s.tenant = r.tenant;
  s.profile = r.profile;
  s.priority = qos_.contains(r.agent_id) ? qos.priority
                                         : r.priority_hint.value_or(options_.default_qos.priority);
  s.key_format = kf;
  s.value_format = vf;
  s.block_tokens = block_tokens;
  s.key_page_bytes = PageAllocator::SizeClass(kb);
  s.value_page_bytes = PageAllocator::SizeClass(vb);
  s.lease_ms = r.lease_ms ? r.lease_ms : options_.default_lease_ms;
  const absl::Time now = options_.clock ? options_.clock() : absl::Now();
  s.last_seen = now;
  s.deadline = now + absl::Milliseconds(s.lease_ms);
  s.peer = r.peer;
  s.events = std::make_shared<EventChannel>();

  auto& tenant = tenants_[r.tenant];
  if (!tenant) {
    tenant = std::make_unique<Tenant>(PageAllocatorOptions{options_.superblock_bytes});
  }
  ++tenant->num_sessions;

  OpenResult out;
  out.session_id = s.id;
  out.token = s.token;
  out.lease_ms = s.lease_ms;
  out.block_tokens = block_tokens;
  out.key_format = kf;
  out.value_format = vf;
  out.key_page_bytes = s.key_page_bytes;
  out.value_page_bytes = s.value_page_bytes;
  out.epoch = s.epoch;
  out.qos = qos;
  out.qos.agent_id = r.agent_id;
  out.arenas = NewArenasFor(s);
  agent_bytes_.try_emplace(s.agent_id, 0);
  sessions_.emplace(s.id, std::move(s));
  return out;
}

std::vector<ArenaExport> KvPool::NewArenasFor(Session& s) {
  std::vector<ArenaExport> out;
  const Tenant& t = *tenants_.at(s.tenant);
  for (const auto& [id, arena] : t.arenas) {
    if (!std::binary_search(s.known_arenas.begin(), s.known_arenas.end(), id)) {
      out.push_back(arena->Export());
      s.known_arenas.insert(std::upper_bound(s.known_arenas.begin(), s.known_arenas.end(), id), id);
    }
  }
  return out;
}

uint64_t KvPool::TotalArenaBytes() const {
  uint64_t n = 0;
  for (const auto& [name, t] : tenants_) n += t->allocator.arena_bytes();
  return n;
}

absl::StatusOr<uint32_t> KvPool::NextArenaId() {
  // Ids are 16 bits (they are part of page ids); reuse the lowest free one.
  for (uint32_t tries = 0; tries < kMaxArenaId; ++tries) {
    uint32_t id = next_arena_id_;
    next_arena_id_ = next_arena_id_ % kMaxArenaId + 1;
    bool used = false;
    for (const auto& [name, t] : tenants_) used |= t->arenas.contains(id);
    if (!used) return id;
  }
  return absl::ResourceExhaustedError("all 65535 arena ids are in use");
}

void KvPool::ReleaseEmptyArenas(Tenant& t) {
  for (uint32_t id : t.allocator.EmptyArenas()) {
    if (t.allocator.RemoveArena(id).ok()) t.arenas.erase(id);
  }
}

absl::StatusOr<uint32_t> KvPool::GrowTenant(Tenant& tenant) {
  const uint64_t sb = options_.superblock_bytes;
  uint64_t room = options_.pool_bytes - std::min(options_.pool_bytes, TotalArenaBytes());
  if (room < sb) {
    // Empty arenas of tenants with no sessions are budget nobody uses.
    for (auto& [name, t] : tenants_) {
      if (t.get() != &tenant && t->num_sessions == 0) ReleaseEmptyArenas(*t);
    }
    room = options_.pool_bytes - std::min(options_.pool_bytes, TotalArenaBytes());
  }
  const uint64_t size = std::min(options_.arena_bytes, room) / sb * sb;
  if (size < sb) return absl::ResourceExhaustedError("pool budget exhausted");
  auto id = NextArenaId();
  if (!id.ok()) return id.status();
  ArenaOptions ao;
  ao.id = *id;
  ao.size_bytes = size;
  auto arena = options_.arena_factory(ao);
  if (!arena.ok()) return arena.status();
  if (auto s = tenant.allocator.AddArena(*id, size); !s.ok()) return s;
  tenant.arenas.emplace(*id, *std::move(arena));
  return *id;
}

absl::StatusOr<PageId> KvPool::AllocGrowing(Tenant& t, uint64_t bytes,
                                            std::vector<uint32_t>& grown) {
  auto page = t.allocator.Alloc(bytes);
  if (page.ok() || !absl::IsResourceExhausted(page.status())) return page;
  auto grew = GrowTenant(t);
  if (!grew.ok()) return grew.status();
  grown.push_back(*grew);
  return t.allocator.Alloc(bytes);
}

void KvPool::ChargeBlock(Session& s, const std::vector<PageId>& pages) {
  for (size_t i = 0; i < pages.size(); ++i) {
    const bool is_value = i % 2 == 1;
    const uint64_t b = is_value ? s.value_page_bytes : s.key_page_bytes;
    s.bytes += b;
    used_bytes_ += b;
    agent_bytes_[s.agent_id] += b;
    ++pages_by_format_[{is_value ? s.value_format : s.key_format, is_value}];
  }
}

void KvPool::FreeBlock(Session& s, std::vector<PageId>& pages) {
  Tenant& t = *tenants_.at(s.tenant);
  for (size_t i = 0; i < pages.size(); ++i) {
    const bool is_value = i % 2 == 1;
    const uint64_t b = is_value ? s.value_page_bytes : s.key_page_bytes;
    // A page in a block table is allocated by construction; failure here is a bug.
    if (t.allocator.Free(pages[i]).ok()) {
      s.bytes -= b;
      used_bytes_ -= b;
      agent_bytes_[s.agent_id] -= b;
      --pages_by_format_[{is_value ? s.value_format : s.key_format, is_value}];
    }
  }
  pages.clear();
}

BlockDesc KvPool::Describe(const Session& s, uint32_t block_index) const {
  const Tenant& t = *tenants_.at(s.tenant);
  BlockDesc b;
  b.block_index = block_index;
  const auto& pages = s.blocks[block_index];
  b.pages.reserve(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    auto loc = t.allocator.Locate(pages[i]);
    PageDesc d;
    d.page_id = pages[i];
    d.arena_id = loc->arena_id;
    d.offset = loc->offset;
    d.size_bytes = loc->size_bytes;
    d.layer = static_cast<uint32_t>(i / 2);
    d.is_value = i % 2 == 1;
    d.format = d.is_value ? s.value_format : s.key_format;
    d.block_index = block_index;
    b.pages.push_back(d);
  }
  return b;
}

absl::StatusOr<ReserveResult> KvPool::Reserve(uint64_t session_id, absl::string_view token,
                                              const PeerCreds& peer, uint64_t num_tokens) {
  absl::MutexLock lock(&mu_);
  auto sp = AuthorizeMutation(session_id, token, peer);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (num_tokens == 0 || num_tokens > kMaxReserveTokens) {
    return absl::InvalidArgumentError(absl::StrCat("num_tokens must be in 1..", kMaxReserveTokens,
                                                   " (got ", num_tokens, ")"));
  }
  if (draining_) {
    ++refused_reservations_;
    return absl::UnavailableError("polykvd is draining; no new reservations");
  }
  const uint64_t want_blocks = (s.reserved_tokens() + num_tokens + s.block_tokens - 1) / s.block_tokens;
  const uint64_t new_blocks = want_blocks - s.blocks.size();
  const uint64_t need = new_blocks * s.block_bytes();
  if (new_blocks > 0 && refuse_up_to_ && s.priority <= *refuse_up_to_) {
    ++refused_reservations_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool is under memory pressure (", Human(options_.pool_bytes - used_bytes_),
        " free of ", Human(options_.pool_bytes), "): reservations of priority '",
        std::string(PriorityName(s.priority)), "' and below are paused while sessions compact; "
        "Sync (to adopt compacted tables), then retry in about 200 ms"));
  }
  const QosRecord& qos = QosFor(s.agent_id);
  const uint64_t agent_used = agent_bytes_[s.agent_id];
  if (qos.max_bytes != 0 && agent_used + need > qos.max_bytes) {
    ++refused_reservations_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "agent '", s.agent_id, "' would hold ", Human(agent_used + need), " (", agent_used + need,
        " bytes), over its max_bytes of ", Human(qos.max_bytes), " (", qos.max_bytes,
        "); release tokens, or raise the limit with 'polykvctl qos set ", s.agent_id,
        " --max-bytes N'"));
  }
  // Guarantees: what other agents are promised and have not used yet is not ours.
  uint64_t promised = 0;
  for (const auto& [agent, q] : qos_) {
    if (agent == s.agent_id || q.guaranteed_bytes == 0) continue;
    auto it = agent_bytes_.find(agent);
    const uint64_t used = it == agent_bytes_.end() ? 0 : it->second;
    if (q.guaranteed_bytes > used) promised += q.guaranteed_bytes - used;
  }
  if (used_bytes_ + need + promised > options_.pool_bytes) {
    ++refused_reservations_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool cannot fit ", Human(need), " more for agent '", s.agent_id, "': ",
        Human(used_bytes_), " of ", Human(options_.pool_bytes), " used, ", Human(promised),
        " guaranteed to other agents; retry after sessions release memory"));
  }

  // Sessions that can be compacted leave the last half low watermark to
  // compactions, which need new pages before they free old ones.
  const uint64_t low =
      options_.low_watermark_bytes ? options_.low_watermark_bytes : options_.pool_bytes / 10;
  if (qos.policy != "full" && used_bytes_ + need + promised > options_.pool_bytes - low / 2) {
    ++refused_reservations_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool cannot fit ", Human(need), " more for agent '", s.agent_id, "' while keeping ",
        Human(low / 2), " free for compactions (", Human(used_bytes_), " of ",
        Human(options_.pool_bytes), " used); Sync (to adopt compacted tables), then retry in "
        "about 100 ms"));
  }
  Tenant& t = *tenants_.at(s.tenant);
  std::vector<std::vector<PageId>> added;
  std::vector<uint32_t> grown;
  absl::Status failure;
  for (uint64_t b = 0; b < new_blocks && failure.ok(); ++b) {
    std::vector<PageId> pages;
    pages.reserve(2 * s.profile.num_layers);
    for (uint32_t i = 0; i < 2 * s.profile.num_layers; ++i) {
      const uint64_t bytes = i % 2 ? s.value_page_bytes : s.key_page_bytes;
      auto page = AllocGrowing(t, bytes, grown);
      if (!page.ok()) {
        failure = page.status();
        break;
      }
      pages.push_back(*page);
    }
    added.push_back(std::move(pages));
  }
  if (!failure.ok()) {
    // Roll back: no error changes state.
    for (auto& pages : added) {
      for (PageId p : pages) (void)t.allocator.Free(p);
    }
    for (uint32_t id : grown) {
      if (t.allocator.RemoveArena(id).ok()) t.arenas.erase(id);
    }
    ++refused_reservations_;
    if (absl::IsResourceExhausted(failure)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "pool is full: cannot place ", Human(need), " for agent '", s.agent_id, "' (",
          Human(used_bytes_), " of ", Human(options_.pool_bytes),
          " in pages); retry after sessions release memory"));
    }
    return failure;
  }
  ReserveResult out;
  for (auto& pages : added) {
    ChargeBlock(s, pages);
    s.blocks.push_back(std::move(pages));
    out.blocks.push_back(Describe(s, static_cast<uint32_t>(s.blocks.size() - 1)));
  }
  out.reserved_tokens = s.reserved_tokens();
  out.session_bytes = s.bytes;
  out.new_arenas = NewArenasFor(s);
  return out;
}

absl::StatusOr<uint64_t> KvPool::Commit(uint64_t session_id, absl::string_view token,
                                        const PeerCreds& peer, uint64_t committed) {
  absl::MutexLock lock(&mu_);
  auto sp = AuthorizeMutation(session_id, token, peer);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (committed < s.committed_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "committed_tokens must not go back (now ", s.committed_tokens, ", got ", committed,
        "); use Release to drop tokens"));
  }
  if (committed > s.reserved_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot commit ", committed,
                                                   " tokens: only ", s.reserved_tokens(),
                                                   " are reserved; Reserve first"));
  }
  s.slots.reserve(committed);
  while (s.slots.size() < committed) {
    SlotRecord r;
    r.meta.position = s.next_position++;
    r.meta.turn = s.current_turn;
    r.meta.role = policies::Role::kAssistant;  // until the worker reports otherwise
    s.slots.push_back(r);
  }
  s.committed_tokens = committed;
  return committed;
}

absl::StatusOr<SyncResult> KvPool::Sync(uint64_t session_id, absl::string_view token,
                                        const PeerCreds& peer, uint64_t known_epoch) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (known_epoch > s.epoch) {
    return absl::InvalidArgumentError(
        absl::StrCat("known_epoch ", known_epoch, " is ahead of the session's epoch ", s.epoch));
  }
  // Sync is the worker's step boundary (it writes and reads nothing now), so
  // this is where a compaction publishes: only when the worker holds the
  // current tables and has acknowledged the previous ones.
  if (known_epoch == s.epoch && s.pending_blocks.empty() && !s.compacting) {
    if (const uint64_t target = CompactionTarget(s); target > 0) {
      auto st = Compact(s, target);  // unlocks mu_ while it copies
      if (absl::IsNotFound(st)) return st;  // closed or evicted meanwhile
      if (!st.ok()) {
        // The session keeps its tables; the ladder and budget retry later.
        ++ladder_steps_["compaction_failed"];
        s.want_tokens = 0;
      }
    }
  }
  SyncResult out;
  out.epoch = s.epoch;
  out.committed_tokens = s.committed_tokens;
  out.changed = known_epoch != s.epoch;
  if (out.changed) {
    for (uint32_t b = 0; b < s.blocks.size(); ++b) out.blocks.push_back(Describe(s, b));
    out.slot_positions.reserve(s.slots.size());
    out.slot_counts.reserve(s.slots.size());
    for (const SlotRecord& r : s.slots) {
      out.slot_positions.push_back(r.meta.position);
      out.slot_counts.push_back(r.count);
    }
  }
  out.new_arenas = NewArenasFor(s);
  return out;
}

absl::Status KvPool::Ack(uint64_t session_id, absl::string_view token, const PeerCreds& peer,
                         uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  auto sp = AuthorizeMutation(session_id, token, peer);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (epoch > s.epoch || epoch < s.acked_epoch) {
    return absl::InvalidArgumentError(absl::StrCat("cannot ack epoch ", epoch, ": session is at ",
                                                   s.epoch, ", acked ", s.acked_epoch));
  }
  s.acked_epoch = epoch;
  if (!s.pending_blocks.empty() && epoch >= s.pending_epoch) FreePending(s);
  return absl::OkStatus();
}

absl::StatusOr<ReleaseResult> KvPool::Release(uint64_t session_id, absl::string_view token,
                                              const PeerCreds& peer, uint64_t keep_tokens) {
  absl::MutexLock lock(&mu_);
  auto sp = AuthorizeMutation(session_id, token, peer);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (keep_tokens > s.reserved_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat("keep_tokens ", keep_tokens,
                                                   " exceeds the reserve of ",
                                                   s.reserved_tokens(), " tokens"));
  }
  const uint64_t keep_blocks = (keep_tokens + s.block_tokens - 1) / s.block_tokens;
  while (s.blocks.size() > keep_blocks) {
    FreeBlock(s, s.blocks.back());
    s.blocks.pop_back();
  }
  s.committed_tokens = std::min(s.committed_tokens, keep_tokens);
  s.slots.resize(s.committed_tokens);
  return ReleaseResult{s.reserved_tokens(), s.committed_tokens, s.bytes};
}

uint64_t KvPool::DestroySession(uint64_t session_id, SessionEventMsg last_event) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return 0;
  Session& s = it->second;
  const uint64_t before = s.bytes;
  if (s.compacting) {
    // Its compaction is copying pages without the lock; Compact finishes
    // the destruction when it gets the lock back.
    s.doomed = true;
    s.doom_event = std::move(last_event);
    return before;
  }
  for (auto& block : s.blocks) FreeBlock(s, block);
  for (auto& block : s.staged_blocks) FreeBlock(s, block);
  s.staged_blocks.clear();
  FreePending(s);
  s.events->Push(std::move(last_event));
  s.events->Close();
  Tenant& t = *tenants_.at(s.tenant);
  --t.num_sessions;
  if (t.num_sessions == 0) ReleaseEmptyArenas(t);
  if (agent_bytes_[s.agent_id] == 0) {
    bool other = false;
    for (const auto& [id, o] : sessions_) other |= (id != session_id && o.agent_id == s.agent_id);
    if (!other) agent_bytes_.erase(s.agent_id);
  }
  sessions_.erase(it);
  return before;
}

absl::StatusOr<uint64_t> KvPool::Close(uint64_t session_id, absl::string_view token,
                                       const PeerCreds& peer) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer);
  if (!sp.ok()) return sp.status();
  return DestroySession(session_id, {SessionEventMsg::Type::kEvicted, 0, "session closed"});
}

absl::StatusOr<HeartbeatResult> KvPool::Heartbeat(uint64_t session_id, absl::string_view token,
                                                  const PeerCreds& peer) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer);
  if (!sp.ok()) return sp.status();
  return HeartbeatResult{(*sp)->lease_ms, (*sp)->epoch, draining_};
}

absl::StatusOr<std::shared_ptr<EventChannel>> KvPool::Watch(uint64_t session_id,
                                                            absl::string_view token,
                                                            const PeerCreds& peer) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer);
  if (!sp.ok()) return sp.status();
  return (*sp)->events;
}

absl::StatusOr<int> KvPool::DupArenaFd(uint64_t session_id, absl::string_view token,
                                       const PeerCreds& peer, uint32_t arena_id) {
  absl::MutexLock lock(&mu_);
  auto sp = Authorize(session_id, token, peer);
  if (!sp.ok()) return sp.status();
  Tenant& t = *tenants_.at((*sp)->tenant);
  auto it = t.arenas.find(arena_id);
  if (it == t.arenas.end()) {
    // Same answer whether the arena is another tenant's or does not exist.
    return absl::PermissionDeniedError(
        absl::StrCat("arena ", arena_id, " is not an arena of this session's tenant"));
  }
  if (it->second->fd() < 0) {
    return absl::FailedPreconditionError("arena is device memory; map it with its CUDA IPC handle");
  }
  int fd = dup(it->second->fd());
  if (fd < 0) return absl::InternalError("dup of arena fd failed");
  return fd;
}

PoolSummary KvPool::Stats() const {
  absl::MutexLock lock(&mu_);
  PoolSummary p;
  p.tier = options_.tier;
  p.pool_bytes = options_.pool_bytes;
  p.used_bytes = used_bytes_;
  p.superblock_bytes = options_.superblock_bytes;
  for (const auto& [name, t] : tenants_) {
    p.arena_bytes += t->allocator.arena_bytes();
    p.num_arenas += t->arenas.size();
    p.num_pages += t->allocator.num_pages();
    p.num_superblocks_used += t->allocator.num_superblocks() - t->allocator.num_free_superblocks();
    p.tenants.push_back({name, t->allocator.used_bytes(), t->allocator.arena_bytes(), t->num_sessions});
  }
  p.num_sessions = static_cast<uint32_t>(sessions_.size());
  p.draining = draining_;
  p.lease_expiries = lease_expiries_;
  p.refused_reservations = refused_reservations_;
  for (const auto& [k, n] : pages_by_format_) p.pages_by_format.push_back({k, n});
  std::map<Priority, uint32_t> prio;
  for (const auto& [id, s] : sessions_) ++prio[s.priority];
  for (const auto& [k, n] : prio) p.sessions_by_priority.push_back({k, n});
  for (const auto& [a, b] : agent_bytes_) p.bytes_by_agent.push_back({a, b});
  p.pending_bytes = pending_bytes_;
  p.compaction_shared_blocks = shared_blocks_;
  p.compaction_copied_blocks = copied_blocks_;
  p.compactions_by_policy.assign(compactions_.begin(), compactions_.end());
  p.evicted_tokens_by_policy.assign(evicted_tokens_.begin(), evicted_tokens_.end());
  p.merged_tokens_by_policy.assign(merged_tokens_.begin(), merged_tokens_.end());
  p.ladder_steps.assign(ladder_steps_.begin(), ladder_steps_.end());
  std::stable_sort(p.bytes_by_agent.begin(), p.bytes_by_agent.end(),
                   [](const auto& x, const auto& y) { return x.second > y.second; });
  return p;
}

std::vector<SessionSummary> KvPool::ListSessions(absl::string_view tenant,
                                                 absl::string_view agent_id) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock ? options_.clock() : absl::Now();
  std::vector<SessionSummary> out;
  for (const auto& [id, s] : sessions_) {
    if (!tenant.empty() && s.tenant != tenant) continue;
    if (!agent_id.empty() && s.agent_id != agent_id) continue;
    out.push_back({s.id, s.agent_id, s.tenant, s.priority, s.reserved_tokens(),
                   s.committed_tokens, s.bytes, s.epoch, s.key_format, s.value_format, s.peer,
                   absl::ToDoubleSeconds(now - s.last_seen), s.profile});
  }
  return out;
}

QosRecord KvPool::GetQos(absl::string_view agent_id) const {
  absl::MutexLock lock(&mu_);
  QosRecord q = QosFor(std::string(agent_id));
  q.agent_id = std::string(agent_id);
  return q;
}

absl::StatusOr<QosRecord> KvPool::SetQos(const QosRecord& qos) {
  if (auto s = ValidateName("agent_id", qos.agent_id, kMaxNameLen); !s.ok()) return s;
  if (qos.max_bytes != 0 && qos.guaranteed_bytes > qos.max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("guaranteed_bytes (", qos.guaranteed_bytes,
                                                   ") exceeds max_bytes (", qos.max_bytes, ")"));
  }
  if (qos.policy.empty() || qos.policy.size() > 256) {
    return absl::InvalidArgumentError("policy must be 1..256 characters (e.g. 'full')");
  }
  if (auto s = ValidatePolicyName(qos.policy); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  uint64_t promised = qos.guaranteed_bytes;
  for (const auto& [agent, q] : qos_) {
    if (agent != qos.agent_id) promised += q.guaranteed_bytes;
  }
  if (promised > options_.pool_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "guarantees would total ", Human(promised), ", more than the pool (",
        Human(options_.pool_bytes), ")"));
  }
  qos_[qos.agent_id] = qos;
  for (auto& [id, s] : sessions_) {
    if (s.agent_id != qos.agent_id) continue;
    s.priority = qos.priority;
    s.events->Push({SessionEventMsg::Type::kQos, s.epoch, "QoS changed"});
  }
  return qos;
}

absl::StatusOr<uint64_t> KvPool::Evict(uint64_t session_id, absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  if (!sessions_.contains(session_id)) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id));
  }
  return DestroySession(session_id,
                        {SessionEventMsg::Type::kEvicted, 0, absl::StrCat("evicted: ", reason)});
}

uint32_t KvPool::Drain(absl::Duration evict_after) {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  const absl::Time now = options_.clock ? options_.clock() : absl::Now();
  if (evict_after > absl::ZeroDuration()) {
    drain_evict_at_ = std::min(drain_evict_at_, now + evict_after);
  }
  for (auto& [id, s] : sessions_) {
    s.events->Push({SessionEventMsg::Type::kDrain, s.epoch, "polykvd is draining; close soon"});
  }
  return static_cast<uint32_t>(sessions_.size());
}

bool KvPool::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

std::vector<uint64_t> KvPool::ReclaimExpired() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = options_.clock ? options_.clock() : absl::Now();
  std::vector<uint64_t> expired;
  const bool drain_over = now >= drain_evict_at_;
  for (const auto& [id, s] : sessions_) {
    // A compacting session's worker is inside Sync (its lease was renewed
    // there); it is looked at again after the copy.
    if (s.compacting) continue;
    if (drain_over || now >= s.deadline) expired.push_back(id);
  }
  for (uint64_t id : expired) {
    const bool lease = now >= sessions_.at(id).deadline;
    if (lease) ++lease_expiries_;
    DestroySession(id, {SessionEventMsg::Type::kEvicted, 0,
                        lease ? "lease expired" : "evicted at the end of the drain"});
  }
  return expired;
}

uint64_t KvPool::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_bytes_;
}

uint64_t KvPool::pending_bytes() const {
  absl::MutexLock lock(&mu_);
  return pending_bytes_;
}

uint32_t KvPool::num_sessions() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(sessions_.size());
}

// --- Policy engine -------------------------------------------------------

namespace {

// "h2o" or "h2o{window.size=32,trigger=1.2}" -> (spec, params).
absl::StatusOr<std::pair<std::string, policies::PolicyParams>> SplitPolicy(
    const std::string& text) {
  const size_t brace = text.find('{');
  if (brace == std::string::npos) return std::make_pair(text, policies::PolicyParams{});
  if (text.back() != '}') {
    return absl::InvalidArgumentError(absl::StrCat("policy '", text, "': missing closing '}'"));
  }
  auto params = policies::ParseParams(text.substr(brace + 1, text.size() - brace - 2));
  if (!params.ok()) return params.status();
  return std::make_pair(text.substr(0, brace), *std::move(params));
}

}  // namespace

absl::Status ValidatePolicyName(const std::string& text) {
  auto split = SplitPolicy(text);
  if (!split.ok()) return split.status();
  auto p = policies::MakePolicy(split->first, split->second);
  if (!p.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy '", text, "': ", std::string(p.status().message())));
  }
  return absl::OkStatus();
}

absl::StatusOr<const policies::Policy*> KvPool::PolicyFor(const std::string& text) {
  auto it = policies_.find(text);
  if (it != policies_.end()) return it->second.get();
  auto split = SplitPolicy(text);
  if (!split.ok()) return split.status();
  auto p = policies::MakePolicy(split->first, split->second);
  if (!p.ok()) return p.status();
  return (policies_[text] = *std::move(p)).get();
}

uint64_t KvPool::CompactionTarget(const Session& s) const {
  const QosRecord& qos = QosFor(s.agent_id);
  if (qos.policy == "full" || s.committed_tokens == 0) return 0;
  uint64_t target = 0;
  if (qos.budget_tokens > 0 &&
      s.committed_tokens > qos.budget_tokens + std::max<uint64_t>(qos.budget_tokens / 10, 1)) {
    target = qos.budget_tokens;
  }
  if (s.want_tokens > 0 && s.committed_tokens > s.want_tokens) {
    target = target == 0 ? s.want_tokens : std::min(target, s.want_tokens);
  }
  // Evict whole blocks' worth: a policy that drops the oldest slots (window,
  // streaming) then leaves every later block where it was, and the new table
  // shares those pages instead of copying them (see Compact).
  if (target > 0) {
    const uint64_t drop = (s.committed_tokens - target + s.block_tokens - 1) / s.block_tokens *
                          s.block_tokens;
    if (drop < s.committed_tokens) target = s.committed_tokens - drop;
  }
  return target;
}

absl::Status KvPool::Compact(Session& s, uint64_t target) {
  const QosRecord& qos = QosFor(s.agent_id);
  const std::string policy_name = qos.policy;
  auto policy = PolicyFor(policy_name);
  if (!policy.ok()) return policy.status();
  const kernels::PageShape shape{static_cast<int>(s.block_tokens),
                                 static_cast<int>(s.profile.num_kv_heads),
                                 static_cast<int>(s.profile.head_dim)};
  const policies::SessionView view =
      BuildView(s.slots, shape, s.key_format, s.value_format, s.current_turn);
  auto plan = (*policy)->Decide(
      view, policies::Budget::TokensPerLayer(1, static_cast<int64_t>(target)));
  if (!plan.ok()) return plan.status();
  if (!plan->changes()) return absl::OkStatus();
  auto groups = LowerPlan(s.slots, *plan);
  if (!groups.ok()) return groups.status();

  // An output block whose every slot is a plain copy of the same row of one
  // source block IS that block: the new table shares its pages instead of
  // copying them (the worker only appends to them after adopting the new
  // table, and nobody reads the old one after that). Window-like policies
  // that evict whole blocks therefore compact without copying or new memory.
  const int bt = static_cast<int>(s.block_tokens);
  const uint32_t layers = s.profile.num_layers;
  const int num_out = groups->num_out();
  const size_t out_blocks = (static_cast<size_t>(num_out) + bt - 1) / bt;
  const size_t src_blocks = (s.committed_tokens + bt - 1) / bt;
  std::vector<int64_t> shared(out_blocks, -1);  // source block index or -1
  CompactionGroups copy;  // the groups of the output blocks that are not shared
  copy.group_offsets.push_back(0);
  for (size_t j = 0; j < out_blocks; ++j) {
    const int first = static_cast<int>(j) * bt;
    const int last = std::min(num_out, first + bt);
    const int32_t m0 = groups->members[groups->group_offsets[first]];
    bool same = m0 % bt == 0;
    for (int o = first; o < last && same; ++o) {
      same = groups->group_offsets[o + 1] - groups->group_offsets[o] == 1 &&
             groups->members[groups->group_offsets[o]] == m0 + (o - first);
    }
    if (same) {
      shared[j] = m0 / bt;
      continue;
    }
    for (int o = first; o < last; ++o) {
      for (int k = groups->group_offsets[o]; k < groups->group_offsets[o + 1]; ++k) {
        copy.members.push_back(groups->members[k]);
        copy.weights.push_back(groups->weights[k]);
      }
      copy.group_offsets.push_back(static_cast<int32_t>(copy.members.size()));
      copy.slots.push_back(groups->slots[o]);
    }
  }

  // New pages for the rest: compaction is not a reservation (it shrinks the
  // session), so quotas do not apply, but the pool budget does.
  Tenant& t = *tenants_.at(s.tenant);
  std::vector<std::vector<PageId>> added;  // [out block] empty when shared
  std::vector<uint32_t> grown;
  absl::Status failure;
  for (size_t j = 0; j < out_blocks && failure.ok(); ++j) {
    std::vector<PageId> pages;
    for (uint32_t i = 0; i < 2 * layers && shared[j] < 0; ++i) {
      const uint64_t bytes = i % 2 ? s.value_page_bytes : s.key_page_bytes;
      auto page = AllocGrowing(t, bytes, grown);
      if (!page.ok()) {
        failure = page.status();
        break;
      }
      pages.push_back(*page);
    }
    added.push_back(std::move(pages));
  }
  auto address = [&](PageId id) -> uint64_t {
    auto loc = t.allocator.Locate(id);
    if (!loc.ok()) return 0;
    auto* base = static_cast<uint8_t*>(t.arenas.at(loc->arena_id)->host_base());
    return base == nullptr ? 0 : reinterpret_cast<uintptr_t>(base + loc->offset);
  };
  std::vector<LayerTables> tables(layers);
  if (failure.ok() && copy.num_out() > 0) {
    for (uint32_t l = 0; l < layers && failure.ok(); ++l) {
      for (size_t b = 0; b < src_blocks; ++b) {
        kernels::BlockEntry e;
        e.k_offset = address(s.blocks[b][2 * l]);
        e.v_offset = address(s.blocks[b][2 * l + 1]);
        e.k_format = s.key_format;
        e.v_format = s.value_format;
        tables[l].src.push_back(e);
      }
      for (size_t j = 0; j < out_blocks; ++j) {
        if (shared[j] >= 0) continue;
        kernels::BlockEntry e;
        e.k_offset = address(added[j][2 * l]);
        e.v_offset = address(added[j][2 * l + 1]);
        e.k_format = s.key_format;
        e.v_format = s.value_format;
        tables[l].dst.push_back(e);
      }
      for (const auto* list : {&tables[l].src, &tables[l].dst}) {
        for (const auto& e : *list) {
          if (e.k_offset == 0 || e.v_offset == 0) {
            failure = absl::UnimplementedError(
                "compaction of device (CUDA) arenas is not implemented yet");
          }
        }
      }
    }
  }
  if (!failure.ok()) {
    for (auto& pages : added) {
      for (PageId p : pages) (void)t.allocator.Free(p);
    }
    for (uint32_t id : grown) {
      if (t.allocator.RemoveArena(id).ok()) t.arenas.erase(id);
    }
    return failure;
  }
  // The new pages belong to the session from now on (staged), so every
  // count stays exact while the copy runs without the lock.
  for (const auto& pages : added) ChargeBlock(s, pages);
  s.staged_blocks = added;
  if (copy.num_out() > 0) {
    // Copy without the pool lock: other sessions' calls go on. This session
    // cannot change meanwhile: its worker is in this Sync, its other
    // mutating calls are refused while `compacting`, and Close / evict /
    // lease reclaim are deferred to below. Its pages, old and new, are
    // allocated, so their arenas stay mapped.
    s.compacting = true;
    const uint64_t id = s.id;
    const int num_src = static_cast<int>(s.committed_tokens);
    mu_.Unlock();
    failure = ExecuteCompaction(shape, num_src, tables, copy);
    mu_.Lock();
    Session& again = sessions_.at(id);  // erasure is deferred while compacting
    again.compacting = false;
    if (again.doomed) {
      DestroySession(id, std::move(again.doom_event));
      return absl::NotFoundError(absl::StrCat(
          "session ", id, " was closed or evicted while it was being compacted"));
    }
  }
  if (!failure.ok()) {
    for (auto& block : s.staged_blocks) FreeBlock(s, block);
    s.staged_blocks.clear();
    return failure;
  }
  s.staged_blocks.clear();

  // Publish at epoch + 1. Old blocks the new table does not share stay
  // allocated until the worker acks it.
  std::vector<std::vector<PageId>> old = std::move(s.blocks);
  s.blocks.clear();
  for (size_t j = 0; j < out_blocks; ++j) {
    if (shared[j] >= 0) {
      s.blocks.push_back(std::move(old[shared[j]]));
      old[shared[j]].clear();
      continue;
    }
    s.blocks.push_back(std::move(added[j]));
  }
  s.pending_blocks.clear();
  for (auto& pages : old) {
    if (!pages.empty()) s.pending_blocks.push_back(std::move(pages));
  }
  s.pending_bytes = static_cast<uint64_t>(s.pending_blocks.size()) * s.block_bytes();
  pending_bytes_ += s.pending_bytes;
  shared_blocks_ += static_cast<uint64_t>(
      std::count_if(shared.begin(), shared.end(), [](int64_t i) { return i >= 0; }));
  copied_blocks_ += out_blocks - static_cast<uint64_t>(std::count_if(
                                     shared.begin(), shared.end(), [](int64_t i) { return i >= 0; }));
  ++s.epoch;
  s.pending_epoch = s.epoch;
  s.committed_tokens = static_cast<uint64_t>(groups->num_out());
  s.slots = std::move(groups->slots);
  s.want_tokens = 0;
  ++compactions_[policy_name];
  evicted_tokens_[policy_name] += groups->evicted_tokens;
  merged_tokens_[policy_name] += groups->merged_tokens;
  s.events->Push({SessionEventMsg::Type::kEpoch, s.epoch,
                  absl::StrCat("compacted by policy '", policy_name, "' to ", s.committed_tokens,
                               " slots; Sync then Ack")});
  return absl::OkStatus();
}

void KvPool::FreePending(Session& s) {
  for (auto& block : s.pending_blocks) FreeBlock(s, block);
  s.pending_blocks.clear();
  pending_bytes_ -= s.pending_bytes;
  s.pending_bytes = 0;
}

absl::Status KvPool::ReportSlots(uint64_t session_id, absl::string_view token,
                                 const PeerCreds& peer, const ReportSlotsRequest& r) {
  absl::MutexLock lock(&mu_);
  auto sp = AuthorizeMutation(session_id, token, peer);
  if (!sp.ok()) return sp.status();
  Session& s = **sp;
  if (r.epoch != s.epoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        "slots were reported for epoch ", r.epoch, " but the session's tables are at epoch ",
        s.epoch, "; Sync, then report slots of the new tables"));
  }
  const uint64_t n = std::max(r.slots.size(), r.attention.size());
  if (r.first_slot > s.committed_tokens || n > s.committed_tokens - r.first_slot) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slots [", r.first_slot, ", ", r.first_slot + n, ") are not all committed (",
        s.committed_tokens, " committed); commit before reporting"));
  }
  for (size_t i = 0; i < r.slots.size(); ++i) {
    const policies::SlotMeta& m = r.slots[i];
    const int role = static_cast<int>(m.role), kind = static_cast<int>(m.tag.kind);
    if (role >= policies::kNumRoles || kind >= policies::kNumBlockKinds || m.turn < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slot ", r.first_slot + i, ": role ", role, " (0..", policies::kNumRoles - 1,
          "), tag_kind ", kind, " (0..", policies::kNumBlockKinds - 1, ") or turn ",
          m.turn, " out of range"));
    }
  }
  for (size_t i = 0; i < r.attention.size(); ++i) {
    if (!std::isfinite(r.attention[i]) || r.attention[i] < 0.f) {
      return absl::InvalidArgumentError(absl::StrCat("attention[", i, "] = ", r.attention[i],
                                                     " is not a finite value >= 0"));
    }
  }
  if (r.current_turn > static_cast<uint32_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("current_turn out of range");
  }
  for (size_t i = 0; i < r.slots.size(); ++i) {
    // Assigns the SlotMeta part only: the position stays the daemon's.
    static_cast<policies::SlotMeta&>(s.slots[r.first_slot + i].meta) = r.slots[i];
  }
  for (size_t i = 0; i < r.attention.size(); ++i) s.slots[r.first_slot + i].attn += r.attention[i];
  if (r.current_turn > 0) s.current_turn = static_cast<int32_t>(r.current_turn);
  return absl::OkStatus();
}

std::vector<std::string> KvPool::RunPressureLadder() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> steps;
  const uint64_t low =
      options_.low_watermark_bytes ? options_.low_watermark_bytes : options_.pool_bytes / 10;
  const uint64_t free = options_.pool_bytes - std::min(options_.pool_bytes, used_bytes_);
  if (free >= 2 * low) {
    if (refuse_up_to_) {
      refuse_up_to_.reset();
      ++ladder_steps_["resume"];
      steps.push_back("resume");
    }
    return steps;
  }
  if (free >= low) return steps;
  // Step 1 (requantize cold pages) is not implemented yet: see docs/compaction.md.
  // Step 2: compact, lowest priority first, largest first, never below the
  // session's share of its agent's guarantee.
  std::vector<Session*> candidates;
  for (auto& [id, s] : sessions_) {
    const QosRecord& q = QosFor(s.agent_id);
    if (q.policy == "full" || s.want_tokens != 0 || !s.pending_blocks.empty()) continue;
    const double per_token = double(s.block_bytes()) / s.block_tokens;
    const uint64_t floor_tokens = std::max<uint64_t>(
        s.block_tokens, per_token > 0 ? uint64_t(double(q.guaranteed_bytes) / per_token) : 0);
    if (s.committed_tokens <= floor_tokens) continue;
    candidates.push_back(&s);
  }
  std::stable_sort(candidates.begin(), candidates.end(), [](const Session* a, const Session* b) {
    if (a->priority != b->priority) return a->priority < b->priority;
    return a->bytes > b->bytes;
  });
  // A compaction writes its output into NEW pages before the old ones go, so
  // each target must also fit in what is still free (90%, for fragmentation).
  uint64_t expect = 0;
  uint64_t room = free;
  for (Session* s : candidates) {
    if (free + expect >= 2 * low) break;
    const QosRecord& q = QosFor(s->agent_id);
    const double per_token = double(s->block_bytes()) / s->block_tokens;
    const uint64_t floor_tokens = std::max<uint64_t>(
        s->block_tokens, per_token > 0 ? uint64_t(double(q.guaranteed_bytes) / per_token) : 0);
    const uint64_t fits = uint64_t(double(room) * 0.9 / per_token) / s->block_tokens * s->block_tokens;
    const uint64_t want = std::max(floor_tokens, std::min(s->committed_tokens / 2, fits));
    if (want >= s->committed_tokens) continue;
    s->want_tokens = want;
    const uint64_t out_bytes = (want + s->block_tokens - 1) / s->block_tokens * s->block_bytes();
    room -= std::min(room, out_bytes);
    expect += uint64_t(double(s->committed_tokens - want) * per_token);
    ++ladder_steps_["compact"];
    steps.push_back("compact");
  }
  // Step 4: nothing (more) to compact: refuse the lowest class present.
  if (candidates.empty() && !refuse_up_to_ && !sessions_.empty()) {
    Priority lowest = Priority::kCritical;
    for (const auto& [id, s] : sessions_) lowest = std::min(lowest, s.priority);
    refuse_up_to_ = lowest;
    ++ladder_steps_["refuse"];
    steps.push_back("refuse");
  }
  return steps;
}

}  // namespace polykv::daemon
