// KvPool's Admin side: stats, session lists, QoS records, evictions, drain,
// and the accounting invariants tests and the debug scrape check. kv_pool.h
// documents the members.
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/pool/validation.h"

namespace polykv::daemon {

absl::Status CheckLayerPresence(const Session& s) {
  const uint32_t L = s.profile.num_layers;
  const auto holes = LayerHoles(s.tables.blocks, L, s.block_tokens);
  for (uint32_t b = 0; b < s.tables.blocks.size(); ++b) {
    const Block& block = s.tables.blocks[b];
    if (block.pages.size() != 2 * size_t(L)) {
      return absl::InternalError(absl::StrCat("block ", b, " has ", block.pages.size(),
                                              " page entries for ", L, " layers"));
    }
    uint32_t present = 0;
    for (uint32_t l = 0; l < L; ++l) {
      const bool has = holes[l].holds(uint64_t(b) * s.block_tokens);
      if ((block.pages[2 * l] != kNoPage) != has || (block.pages[2 * l + 1] != kNoPage) != has ||
          block.shape.has_layer(l) != has) {
        return absl::InternalError(absl::StrCat("layer ", l, " has a second hole at block ", b));
      }
      present += has;
    }
    if (present != block.shape.layers) {
      return absl::InternalError(absl::StrCat("block ", b, " counts ", block.shape.layers,
                                              " layers and holds ", present));
    }
  }
  for (uint32_t l = 0; l < L; ++l) {
    if (!holes[l].empty() && holes[l].end() >= s.tables.committed_tokens) {
      return absl::InternalError(absl::StrCat("layer ", l, " holds no slot after its hole at [",
                                              holes[l].start, ", ", holes[l].end(), ") of ",
                                              s.tables.committed_tokens));
    }
  }
  const bool apart =
      std::any_of(holes.begin(), holes.end(), [](const LayerHole& h) { return !h.empty(); });
  if (apart && !s.policy.layers_apart()) {
    return absl::InternalError("layers have holes but share one slot record list");
  }
  return absl::OkStatus();
}

absl::Status KvPool::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  BlockPool::Holdings held;
  uint64_t pending_total = 0;
  for (const auto& [id, s] : sessions_) {
    const std::string who = absl::StrCat("session ", id);
    uint64_t b = 0, shared = 0;
    uint64_t pending = 0;
    static const std::vector<Block> kNone;
    const auto* out = s.offloaded ? &s.offloaded->blocks : &kNone;
    for (const auto* table : {&s.tables.blocks, &s.tables.pending, &s.tables.staged, out}) {
      auto tb = TableBytes(s.tenant(), *table, who, held, shared);
      if (!tb.ok()) return tb.status();
      b += *tb;
      if (table == &s.tables.pending) pending = *tb;
    }
    if (b != s.account.bytes || shared != s.account.shared_bytes) {
      return absl::InternalError(absl::StrCat(who, " byte count drifted"));
    }
    if (pending != s.tables.pending_bytes) {
      return absl::InternalError(absl::StrCat(who, " pending byte count drifted"));
    }
    const size_t lists = s.policy.records.size();
    if (lists != 1 && lists != s.profile.num_layers) {
      return absl::InternalError(absl::StrCat(who, ": ", lists, " slot record lists for ",
                                              s.profile.num_layers, " layers (1 or one each)"));
    }
    for (const auto& list : s.policy.records) {
      if (list.size() != s.tables.committed_tokens) {
        return absl::InternalError(absl::StrCat(who, ": ", list.size(), " slot records for ",
                                                s.tables.committed_tokens, " committed tokens"));
      }
    }
    if (s.offloaded && (!s.tables.blocks.empty() || b != 0)) {
      return absl::InternalError(absl::StrCat(who, " is offloaded but holds pages"));
    }
    if (auto st = CheckLayerPresence(s); !st.ok()) {
      return absl::InternalError(absl::StrCat(who, ": ", st.message()));
    }
    pending_total += pending;
    held.bytes += b;
    held.agent_bytes[s.agent_id()] += b;
    held.agent_shared[s.agent_id()] += shared;
  }
  for (const auto& [id, q] : quarantine_) {
    const std::string who = absl::StrCat("quarantined session ", id);
    uint64_t shared = 0;
    auto b = TableBytes(q.account.tenant, q.blocks, who, held, shared);
    if (!b.ok()) return b.status();
    if (*b != q.account.bytes || shared != q.account.shared_bytes) {
      return absl::InternalError(absl::StrCat(who, " byte count drifted"));
    }
    held.bytes += *b;
    held.agent_bytes[q.account.agent_id] += *b;
    held.agent_shared[q.account.agent_id] += shared;
  }
  if (auto st = blocks_.CheckInvariants(held); !st.ok()) return st;
  if (pending_total != pending_bytes_) {
    return absl::InternalError(absl::StrCat("pending bytes: pool ", pending_bytes_, ", sessions ",
                                            pending_total));
  }
  return absl::OkStatus();
}

PoolSummary KvPool::Stats() const {
  absl::MutexLock lock(&mu_);
  PoolSummary p;
  p.tier = options_.tier;
  blocks_.Summarize(p);
  p.num_sessions = static_cast<uint32_t>(sessions_.size());
  p.draining = draining_;
  p.lease_expiries = lease_expiries_;
  p.refused_reservations = admission_.refused();
  std::map<Priority, uint32_t> prio;
  for (const auto& [id, s] : sessions_) ++prio[s.priority];
  for (const auto& [k, n] : prio) p.sessions_by_priority.push_back({k, n});
  p.pending_bytes = pending_bytes_;
  p.quarantined_sessions = static_cast<uint32_t>(quarantine_.size());
  for (const auto& [id, q] : quarantine_) p.quarantined_bytes += q.account.bytes;
  p.compaction_shared_blocks = shared_blocks_;
  p.compaction_copied_blocks = copied_blocks_;
  p.relocated_blocks = relocated_blocks_;
  p.prefix_hit_blocks = prefix_hits_;
  p.prefix_miss_blocks = prefix_misses_;
  for (const auto& [id, s] : sessions_) {
    if (!s.offloaded) continue;
    ++p.offloaded_sessions;
    p.offloaded_bytes += s.offloaded->bytes;
  }
  if (options_.offload_store) p.offload_store = options_.offload_store->stats();
  p.offload = offload_counts_;
  p.compactions_by_policy.assign(compactions_.begin(), compactions_.end());
  p.evicted_tokens_by_policy.assign(evicted_tokens_.begin(), evicted_tokens_.end());
  p.merged_tokens_by_policy.assign(merged_tokens_.begin(), merged_tokens_.end());
  p.ladder_steps.assign(ladder_steps_.begin(), ladder_steps_.end());
  return p;
}

std::vector<SessionSummary> KvPool::ListSessions(absl::string_view tenant,
                                                 absl::string_view agent_id) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = Now();
  std::vector<SessionSummary> out;
  for (const auto& [id, s] : sessions_) {
    if (!tenant.empty() && s.tenant_name != tenant && s.tenant() != tenant) continue;
    if (!agent_id.empty() && s.agent_id() != agent_id) continue;
    out.push_back({s.id, s.agent_id(), s.tenant_name, s.priority, s.reserved_tokens(),
                   s.tables.committed_tokens, s.account.bytes, s.tables.epoch,
                   s.shape.key_format, s.shape.value_format, s.lease.peer,
                   absl::ToDoubleSeconds(now - s.lease.last_seen), s.profile, ""});
    if (s.offloaded) {
      SessionSummary& o = out.back();
      o.reserved_tokens = uint64_t(s.offloaded->blocks.size()) * s.block_tokens;
      const auto tier = options_.offload_store->Where(s.id);
      o.offloaded_to = tier ? OffloadTierName(*tier) : "lost";
    }
  }
  return out;
}

QosRecord KvPool::GetQos(absl::string_view agent_id) const {
  absl::MutexLock lock(&mu_);
  QosRecord q = admission_.For(std::string(agent_id));
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
  if (auto s = ValidateBudgetFraction(qos.budget_fraction); !s.ok()) return s;
  if (qos.block_tokens != 0) {
    if (auto s = ValidateBlockTokens(qos.block_tokens); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("qos.", s.message()));
    }
  }
  const policies::WantedStreams wants = policies_.Streams(qos.policy);
  absl::MutexLock lock(&mu_);
  if (auto st = admission_.Set(qos); !st.ok()) return st;
  for (auto& [id, s] : sessions_) {
    if (s.agent_id() != qos.agent_id) continue;
    s.priority = qos.priority;
    s.policy.wants = wants;
    s.events->Push({SessionEventMsg::Type::kQos, s.tables.epoch, "QoS changed"});
  }
  return qos;
}

absl::StatusOr<uint64_t> KvPool::Evict(uint64_t session_id, absl::string_view reason) {
  absl::MutexLock lock(&mu_);
  if (sessions_.Find(session_id) == nullptr) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id));
  }
  return DestroySession(session_id,
                        {SessionEventMsg::Type::kEvicted, 0, absl::StrCat("evicted: ", reason)},
                        /*consented=*/false);
}

uint32_t KvPool::Drain(absl::Duration evict_after) {
  absl::MutexLock lock(&mu_);
  draining_ = true;
  if (evict_after > absl::ZeroDuration()) {
    drain_evict_at_ = std::min(drain_evict_at_, Now() + evict_after);
  }
  for (auto& [id, s] : sessions_) {
    s.events->Push(
        {SessionEventMsg::Type::kDrain, s.tables.epoch, "polykvd is draining; close soon"});
  }
  return static_cast<uint32_t>(sessions_.size());
}

bool KvPool::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

uint64_t KvPool::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return blocks_.used_bytes();
}

uint64_t KvPool::pending_bytes() const {
  absl::MutexLock lock(&mu_);
  return pending_bytes_;
}

uint32_t KvPool::num_sessions() const {
  absl::MutexLock lock(&mu_);
  return static_cast<uint32_t>(sessions_.size());
}

}  // namespace polykv::daemon
