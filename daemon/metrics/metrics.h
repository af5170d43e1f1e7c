// Metrics: every polykv_* metric family, in one place, on an injected registry.
//
// Event metrics (RPCs, rejections) are counters and histograms updated as
// things happen. State metrics (pool bytes, pages, sessions, bytes per agent)
// are read from the pool when Prometheus scrapes (PoolCollector), so they can
// never drift from the pool's own accounting.
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "daemon/pool/kv_pool.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace polykv::daemon {

// Agents shown by name in polykv_agent_bytes; the rest are summed as "_other",
// keeping label cardinality bounded however many agents connect.
inline constexpr size_t kMaxAgentLabels = 32;

class Metrics {
 public:
  explicit Metrics(std::shared_ptr<prometheus::Registry> registry);
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // rpc: method name ("Reserve"); code: gRPC code name ("OK", "NOT_FOUND").
  void ObserveRpc(const std::string& rpc, const std::string& code, double seconds);
  void PeerRejected(const std::string& socket);  // socket: "grpc" | "fd"
  void SessionReclaimed(const std::string& reason);
  // The gRPC socket's connection limits (finding 4 of issue 14). reason:
  // "max_connections" | "max_connections_per_uid".
  void ConnectionRefused(const std::string& reason);
  void SetGrpcConnections(size_t n);
  // accept() found no fd (EMFILE/ENFILE) or memory and the listener paused.
  void AcceptBackoff();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& rpc_total_;
  prometheus::Family<prometheus::Histogram>& rpc_seconds_;
  prometheus::Family<prometheus::Counter>& peer_rejections_;
  prometheus::Family<prometheus::Counter>& reclaimed_;
  prometheus::Family<prometheus::Counter>& connections_refused_;
  prometheus::Gauge& grpc_connections_;
  prometheus::Counter& accept_backoffs_;

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::pair<prometheus::Counter*, prometheus::Histogram*>>
      rpc_cache_ ABSL_GUARDED_BY(mu_);
};

// Produces the state metrics from KvPool::Stats() at scrape time.
class PoolCollector : public prometheus::Collectable {
 public:
  // check_invariants: also run KvPool::CheckInvariants at each scrape and
  // export polykv_pool_invariants_ok. A debug mode (tests use it): the check
  // walks every page under the pool lock, so on a pool of millions of small
  // pages each scrape would stall every worker's RPCs.
  // agent_names: label polykv_agent_bytes with agent names; otherwise with
  // pseudonyms handed out in order of first appearance (any local uid can
  // read /metrics: names are the operator's to publish).
  PoolCollector(const KvPool* pool, bool check_invariants, bool agent_names)
      : pool_(pool), check_invariants_(check_invariants), agent_names_(agent_names) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  std::string AgentLabel(const std::string& agent) const;

  const KvPool* const pool_;  // Not owned; outlives the collector's registration.
  const bool check_invariants_;
  const bool agent_names_;
  mutable absl::Mutex mu_;
  // Agent -> pseudonym number. Bounded: past kMaxPseudonyms distinct agents
  // the numbering starts over (a label may then name another agent).
  mutable absl::flat_hash_map<std::string, uint64_t> pseudonyms_ ABSL_GUARDED_BY(mu_);
  mutable uint64_t next_pseudonym_ ABSL_GUARDED_BY(mu_) = 1;
  static constexpr size_t kMaxPseudonyms = 4096;
};

// gRPC status code name, e.g. "RESOURCE_EXHAUSTED".
std::string GrpcCodeName(int code);

}  // namespace polykv::daemon
