#include "daemon/pool/admission.h"

#include "absl/strings/str_cat.h"

namespace polykv::daemon {

std::string HumanBytes(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return absl::StrCat(bytes / double(1ull << 30), " GiB");
  if (bytes >= (1ull << 20)) return absl::StrCat(bytes / double(1ull << 20), " MiB");
  if (bytes >= (1ull << 10)) return absl::StrCat(bytes / double(1ull << 10), " KiB");
  return absl::StrCat(bytes, " B");
}

Admission::Admission(QosRecord default_qos, uint64_t pool_bytes, uint64_t low_watermark_bytes)
    : default_qos_(std::move(default_qos)),
      pool_bytes_(pool_bytes),
      low_watermark_(low_watermark_bytes ? low_watermark_bytes : pool_bytes / 10) {}

const QosRecord& Admission::For(const std::string& agent_id) const {
  auto it = qos_.find(agent_id);
  return it != qos_.end() ? it->second : default_qos_;
}

absl::Status Admission::Set(const QosRecord& qos) {
  // Each guarantee is at most the pool and so is their sum, so no sum of
  // guarantees here or in UnusedGuarantees can wrap around.
  uint64_t promised = qos.guaranteed_bytes;
  for (const auto& [agent, q] : qos_) {
    if (agent != qos.agent_id) promised += q.guaranteed_bytes;
  }
  if (qos.guaranteed_bytes > pool_bytes_ || promised > pool_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat("guarantees would total ",
                                                     HumanBytes(promised), ", more than the pool (",
                                                     HumanBytes(pool_bytes_), ")"));
  }
  qos_[qos.agent_id] = qos;
  return absl::OkStatus();
}

void Admission::AddInFlight(const std::string& agent_id, uint64_t bytes) {
  in_flight_[agent_id] += bytes;
  in_flight_total_ += bytes;
}

void Admission::RemoveInFlight(const std::string& agent_id, uint64_t bytes) {
  auto it = in_flight_.find(agent_id);
  if (it == in_flight_.end()) return;
  const uint64_t b = std::min(bytes, it->second);
  it->second -= b;
  in_flight_total_ -= b;
  if (it->second == 0) in_flight_.erase(it);
}

uint64_t Admission::AgentBytes(const std::string& agent_id, const BlockPool& blocks) const {
  auto it = in_flight_.find(agent_id);
  return blocks.agent_bytes(agent_id) + (it == in_flight_.end() ? 0 : it->second);
}

uint64_t Admission::UnusedGuarantees(const std::string& agent_id, const BlockPool& blocks) const {
  uint64_t promised = 0;
  for (const auto& [agent, q] : qos_) {
    if (agent == agent_id || q.guaranteed_bytes == 0) continue;
    const uint64_t used = AgentBytes(agent, blocks);
    if (q.guaranteed_bytes > used) promised += q.guaranteed_bytes - used;
  }
  return promised;
}

absl::Status Admission::AdmitReserve(const std::string& agent_id, Priority priority,
                                     uint64_t need, const BlockPool& blocks) {
  // Cached prefix blocks are room: allocations drop them (BlockPool).
  const uint64_t used = blocks.used_bytes() - blocks.cached_bytes() + in_flight_total_;
  const QosRecord& qos = For(agent_id);
  const uint64_t agent_used = AgentBytes(agent_id, blocks);
  // Memory within the agent's own guarantee is promised: pressure neither
  // pauses it nor keeps it for compactions.
  const bool guaranteed = agent_used + need <= qos.guaranteed_bytes;
  if (need > 0 && !guaranteed && refuse_up_to_ && priority <= *refuse_up_to_) {
    ++refused_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool is under memory pressure (", HumanBytes(blocks.free_bytes()), " free of ",
        HumanBytes(pool_bytes_), "): reservations of priority '",
        std::string(PriorityName(priority)), "' and below are paused while sessions compact; "
        "Sync (to adopt compacted tables), then retry in about 200 ms"));
  }
  if (qos.max_bytes != 0 && agent_used + need > qos.max_bytes) {
    ++refused_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "agent '", agent_id, "' would hold ", HumanBytes(agent_used + need), " (",
        agent_used + need, " bytes), over its max_bytes of ", HumanBytes(qos.max_bytes), " (",
        qos.max_bytes, "); release tokens, or raise the limit with 'polykvctl qos set ", agent_id,
        " --max-bytes N'"));
  }
  // Guarantees: what other agents are promised and have not used yet is not ours.
  const uint64_t promised = UnusedGuarantees(agent_id, blocks);
  if (used + need + promised > pool_bytes_) {
    ++refused_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool cannot fit ", HumanBytes(need), " more for agent '", agent_id, "': ",
        HumanBytes(used), " of ", HumanBytes(pool_bytes_), " used, ", HumanBytes(promised),
        " guaranteed to other agents; retry after sessions release memory"));
  }
  // Sessions that can be compacted leave the last half low watermark to
  // compactions, which need new pages before they free old ones.
  if (!guaranteed && qos.policy != "full" &&
      used + need + promised > pool_bytes_ - low_watermark_ / 2) {
    ++refused_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool cannot fit ", HumanBytes(need), " more for agent '", agent_id, "' while keeping ",
        HumanBytes(low_watermark_ / 2), " free for compactions (", HumanBytes(used), " of ",
        HumanBytes(pool_bytes_), " used); Sync (to adopt compacted tables), then retry in "
        "about 100 ms"));
  }
  return absl::OkStatus();
}

}  // namespace polykv::daemon
