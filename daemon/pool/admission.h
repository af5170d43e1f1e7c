// Admission: whether a reservation may have the memory it asks for. Holds
// the per-agent QoS records and applies, in order: the pressure ladder's
// refusal of low priority classes, the agent's max_bytes, other agents'
// unused guarantees, and the room compactions need (they write new pages
// before they free old ones). A reservation that keeps its agent within its
// own guarantee skips the ladder's refusal and the compactions' room. Every
// refusal is RESOURCE_EXHAUSTED with what to do about it, and is counted.
//
// Thread-safety: none; the owner (KvPool) serializes calls under its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/pool/block_pool.h"
#include "daemon/pool/types.h"

namespace polykv::daemon {

class Admission {
 public:
  // low_watermark_bytes 0 = pool_bytes / 10.
  Admission(QosRecord default_qos, uint64_t pool_bytes, uint64_t low_watermark_bytes);

  // The agent's record, or the default one (whose agent_id is not set).
  const QosRecord& For(const std::string& agent_id) const;
  bool HasRecord(const std::string& agent_id) const { return qos_.contains(agent_id); }
  // Stores `qos` (validated by the caller for names and policy).
  // RESOURCE_EXHAUSTED when this guarantee, or all together, would exceed
  // the pool.
  absl::Status Set(const QosRecord& qos);

  // OK when `need` more bytes may go to a session of `agent_id` with
  // `priority`; otherwise the refusal, counted.
  absl::Status AdmitReserve(const std::string& agent_id, Priority priority, uint64_t need,
                            const BlockPool& blocks);
  // Counts a refusal decided elsewhere (draining, a failed allocation).
  void CountRefusal() { ++refused_; }

  // Bytes admitted but not allocated yet (a large Reserve allocates in steps,
  // releasing the pool lock between them): every check counts them as the
  // agent's, so concurrent reservations cannot be admitted into them.
  void AddInFlight(const std::string& agent_id, uint64_t bytes);
  void RemoveInFlight(const std::string& agent_id, uint64_t bytes);

  // Bytes promised to agents other than `agent_id` and not used yet: what a
  // reservation of `agent_id` must leave, in pages and in arenas.
  uint64_t UnusedGuarantees(const std::string& agent_id, const BlockPool& blocks) const;

  uint64_t low_watermark() const { return low_watermark_; }
  // The pressure ladder's refusal: reservations of `up_to` and below wait.
  void Refuse(Priority up_to) { refuse_up_to_ = up_to; }
  void Resume() { refuse_up_to_.reset(); }
  bool refusing() const { return refuse_up_to_.has_value(); }
  uint64_t refused() const { return refused_; }

 private:
  // The agent's bytes, allocated or in flight.
  uint64_t AgentBytes(const std::string& agent_id, const BlockPool& blocks) const;

  const QosRecord default_qos_;
  const uint64_t pool_bytes_;
  const uint64_t low_watermark_;
  std::map<std::string, QosRecord> qos_;
  std::optional<Priority> refuse_up_to_;
  uint64_t refused_ = 0;
  std::map<std::string, uint64_t> in_flight_;
  uint64_t in_flight_total_ = 0;
};

// "1.5 GiB" and the like, for messages.
std::string HumanBytes(uint64_t bytes);

}  // namespace polykv::daemon
