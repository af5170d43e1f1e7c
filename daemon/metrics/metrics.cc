#include "daemon/metrics/metrics.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace polykv::daemon {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

Metrics::Metrics(std::shared_ptr<prometheus::Registry> registry)
    : registry_(std::move(registry)),
      rpc_total_(BuildCounter()
                     .Name("polykv_rpc_total")
                     .Help("RPCs handled, by method and gRPC status code")
                     .Register(*registry_)),
      rpc_seconds_(BuildHistogram()
                       .Name("polykv_rpc_duration_seconds")
                       .Help("RPC handling time in the daemon, by method and status code")
                       .Register(*registry_)),
      peer_rejections_(BuildCounter()
                           .Name("polykv_peer_rejections_total")
                           .Help("Connections refused by the peer-credential check")
                           .Register(*registry_)),
      reclaimed_(BuildCounter()
                     .Name("polykv_sessions_reclaimed_total")
                     .Help("Sessions reclaimed by the daemon, by reason")
                     .Register(*registry_)),
      connections_refused_(BuildCounter()
                               .Name("polykv_connections_refused_total")
                               .Help("gRPC socket connections closed at once by the connection "
                                     "limits, by the limit reached")
                               .Register(*registry_)),
      grpc_connections_(BuildGauge()
                            .Name("polykv_grpc_connections")
                            .Help("Open connections on the gRPC socket")
                            .Register(*registry_)
                            .Add({})),
      accept_backoffs_(BuildCounter()
                           .Name("polykv_accept_backoffs_total")
                           .Help("Pauses of the gRPC socket's accept loop for lack of fds or "
                                 "memory (EMFILE, ENFILE, ENOBUFS, ENOMEM)")
                           .Register(*registry_)
                           .Add({})) {}

void Metrics::ObserveRpc(const std::string& rpc, const std::string& code, double seconds) {
  const std::string key = absl::StrCat(rpc, "/", code);
  std::pair<prometheus::Counter*, prometheus::Histogram*> m;
  {
    absl::MutexLock lock(&mu_);
    auto it = rpc_cache_.find(key);
    if (it == rpc_cache_.end()) {
      // 20 µs .. ~1.3 s, doubling: the echo floor on a Unix socket is ~100 µs.
      prometheus::Histogram::BucketBoundaries buckets;
      for (double b = 20e-6; b < 2.0; b *= 2) buckets.push_back(b);
      auto* c = &rpc_total_.Add({{"rpc", rpc}, {"code", code}});
      auto* h = &rpc_seconds_.Add({{"rpc", rpc}, {"code", code}}, buckets);
      it = rpc_cache_.emplace(key, std::make_pair(c, h)).first;
    }
    m = it->second;
  }
  m.first->Increment();
  m.second->Observe(seconds);
}

void Metrics::PeerRejected(const std::string& socket) {
  peer_rejections_.Add({{"socket", socket}}).Increment();
}

void Metrics::ConnectionRefused(const std::string& reason) {
  connections_refused_.Add({{"reason", reason}}).Increment();
}

void Metrics::SetGrpcConnections(size_t n) { grpc_connections_.Set(static_cast<double>(n)); }

void Metrics::AcceptBackoff() { accept_backoffs_.Increment(); }

void Metrics::SessionReclaimed(const std::string& reason) {
  reclaimed_.Add({{"reason", reason}}).Increment();
}

namespace {

prometheus::MetricFamily Family(std::string name, std::string help, prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void AddGauge(prometheus::MetricFamily& f, std::vector<prometheus::ClientMetric::Label> labels,
              double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = value;
  f.metric.push_back(std::move(m));
}

void AddCounter(prometheus::MetricFamily& f, double value) {
  prometheus::ClientMetric m;
  m.counter.value = value;
  f.metric.push_back(std::move(m));
}

void AddCounter(prometheus::MetricFamily& f, std::vector<prometheus::ClientMetric::Label> labels,
                double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.counter.value = value;
  f.metric.push_back(std::move(m));
}

}  // namespace

std::string PoolCollector::AgentLabel(const std::string& agent) const {
  if (agent_names_) return agent;
  absl::MutexLock lock(&mu_);
  auto it = pseudonyms_.find(agent);
  if (it == pseudonyms_.end()) {
    if (pseudonyms_.size() >= kMaxPseudonyms) pseudonyms_.clear();
    it = pseudonyms_.emplace(agent, next_pseudonym_++).first;
  }
  return absl::StrCat("agent-", it->second);
}

std::vector<prometheus::MetricFamily> PoolCollector::Collect() const {
  using prometheus::MetricType;
  const PoolSummary s = pool_->Stats();
  std::vector<prometheus::MetricFamily> out;

  auto pool = Family("polykv_pool_bytes", "Pool bytes by tier and state", MetricType::Gauge);
  const std::string tier = s.tier;
  AddGauge(pool, {{"tier", tier}, {"state", "capacity"}}, double(s.pool_bytes));
  AddGauge(pool, {{"tier", tier}, {"state", "used"}}, double(s.used_bytes));
  AddGauge(pool, {{"tier", tier}, {"state", "free"}},
           double(s.pool_bytes - std::min(s.pool_bytes, s.used_bytes)));
  AddGauge(pool, {{"tier", tier}, {"state", "mapped"}}, double(s.arena_bytes));
  out.push_back(std::move(pool));

  auto pages = Family("polykv_pages", "Allocated KV pages by format and kind (k|v)",
                      MetricType::Gauge);
  for (const auto& [key, n] : s.pages_by_format) {
    AddGauge(pages,
             {{"format", std::string(kernels::FormatShortName(key.first))},
              {"kind", key.second ? "v" : "k"}},
             double(n));
  }
  out.push_back(std::move(pages));

  auto sessions = Family("polykv_sessions", "Open sessions by priority class", MetricType::Gauge);
  for (const auto& [prio, n] : s.sessions_by_priority) {
    AddGauge(sessions, {{"priority", std::string(PriorityName(prio))}}, double(n));
  }
  out.push_back(std::move(sessions));

  auto agents = Family("polykv_agent_bytes",
                       "Page bytes held per agent (largest agents by name, the rest as _other)",
                       MetricType::Gauge);
  double other = 0;
  for (size_t i = 0; i < s.bytes_by_agent.size(); ++i) {
    if (i < kMaxAgentLabels) {
      AddGauge(agents, {{"agent", AgentLabel(s.bytes_by_agent[i].first)}},
               double(s.bytes_by_agent[i].second));
    } else {
      other += double(s.bytes_by_agent[i].second);
    }
  }
  if (s.bytes_by_agent.size() > kMaxAgentLabels) AddGauge(agents, {{"agent", "_other"}}, other);
  out.push_back(std::move(agents));

  auto arenas = Family("polykv_arenas", "Arenas mapped", MetricType::Gauge);
  AddGauge(arenas, {{"tier", tier}}, double(s.num_arenas));
  out.push_back(std::move(arenas));

  auto expiries = Family("polykv_lease_expiries_total",
                         "Sessions reclaimed because their lease expired", MetricType::Counter);
  AddCounter(expiries, double(s.lease_expiries));
  out.push_back(std::move(expiries));

  auto refused = Family("polykv_reservations_refused_total",
                        "Reservations refused (quota, guarantees, pool full, draining)",
                        MetricType::Counter);
  AddCounter(refused, double(s.refused_reservations));
  out.push_back(std::move(refused));

  // Policy engine. Policy labels are QoS policy names (operator-set, few).
  auto by_label = [&](const char* name, const char* help, const char* label,
                      const std::vector<std::pair<std::string, uint64_t>>& values) {
    auto f = Family(name, help, MetricType::Counter);
    for (const auto& [k, n] : values) AddCounter(f, {{label, k}}, double(n));
    out.push_back(std::move(f));
  };
  by_label("polykv_compactions_total", "Compactions published (new epoch), by QoS policy",
           "policy", s.compactions_by_policy);
  by_label("polykv_evicted_tokens_total", "Tokens evicted by compactions, by QoS policy",
           "policy", s.evicted_tokens_by_policy);
  by_label("polykv_merged_tokens_total",
           "Tokens folded into another slot by compactions, by QoS policy", "policy",
           s.merged_tokens_by_policy);
  by_label("polykv_ladder_steps_total",
           "Pressure-ladder steps (requant, compact, offload, offload_refused, evict_idle, "
           "refuse, resume, compaction_failed)",
           "step",
           s.ladder_steps);
  auto blocks = Family("polykv_compaction_blocks_total",
                        "Output blocks of compactions: shared (old pages reused, no copy) or "
                        "copied (written into new pages)",
                        MetricType::Counter);
  AddCounter(blocks, {{"kind", "shared"}}, double(s.compaction_shared_blocks));
  AddCounter(blocks, {{"kind", "copied"}}, double(s.compaction_copied_blocks));
  out.push_back(std::move(blocks));
  auto gauge = [&](const char* name, const char* help, double value) {
    auto f = Family(name, help, MetricType::Gauge);
    AddGauge(f, {}, value);
    out.push_back(std::move(f));
  };
  gauge("polykv_pending_bytes", "Bytes of old pages kept until workers acknowledge a newer epoch",
        double(s.pending_bytes));
  gauge("polykv_quarantined_bytes",
        "Bytes of sessions taken from a live worker without its consent, kept from reuse until "
        "it learns or exits",
        double(s.quarantined_bytes));
  auto retired = Family("polykv_retired_arenas",
                        "Arenas taken back whose old mappers still live (their memory is "
                        "returned; resident: what they made it hold again)",
                        MetricType::Gauge);
  AddGauge(retired, {{"kind", "arenas"}}, double(s.retired_arenas));
  AddGauge(retired, {{"kind", "resident_bytes"}}, double(s.retired_resident_bytes));
  out.push_back(std::move(retired));
  gauge("polykv_draining", "1 while the daemon drains", s.draining ? 1 : 0);
  gauge("polykv_vacating_arenas",
        "Sparsely used arenas being emptied: their blocks move out at their sessions' next Sync",
        double(s.vacating_arenas));
  auto relocated = Family("polykv_relocated_blocks_total",
                          "Blocks moved out of vacated arenas (so that they can be retired)",
                          MetricType::Counter);
  AddCounter(relocated, {}, double(s.relocated_blocks));
  out.push_back(std::move(relocated));
  auto prefix_bytes = Family("polykv_prefix_bytes",
                             "Shared prefix blocks: held by session tables (charged once), or "
                             "cached (held by none, dropped when memory is needed)",
                             MetricType::Gauge);
  AddGauge(prefix_bytes, {{"kind", "shared"}}, double(s.prefix_shared_bytes));
  AddGauge(prefix_bytes, {{"kind", "cached"}}, double(s.prefix_cached_bytes));
  out.push_back(std::move(prefix_bytes));
  auto prefix_blocks = Family("polykv_prefix_blocks_total",
                              "Shared prefix lookups and drops: full blocks attached (hit), "
                              "asked for and not found (miss), cached ones dropped for room",
                              MetricType::Counter);
  AddCounter(prefix_blocks, {{"result", "hit"}}, double(s.prefix_hit_blocks));
  AddCounter(prefix_blocks, {{"result", "miss"}}, double(s.prefix_miss_blocks));
  AddCounter(prefix_blocks, {{"result", "dropped"}}, double(s.prefix_dropped_blocks));
  out.push_back(std::move(prefix_blocks));

  // Offload tiers (docs/offload.md): what they hold, the pool's offload
  // steps, and how long restores took.
  auto offload_bytes = Family("polykv_offload_bytes",
                              "Bytes the offload tiers hold now (host memory, disk files)",
                              MetricType::Gauge);
  if (s.offload_store) {
    AddGauge(offload_bytes, {{"tier", "host"}}, double(s.offload_store->host_bytes));
    AddGauge(offload_bytes, {{"tier", "disk"}}, double(s.offload_store->disk_bytes));
  }
  out.push_back(std::move(offload_bytes));
  gauge("polykv_offloaded_sessions", "Sessions whose pages are in the offload tiers now",
        double(s.offloaded_sessions));
  auto offload_steps = Family("polykv_offload_total",
                              "Offload events: sessions offloaded, restored, refused by full "
                              "tiers, lost (pages failed their checks), idle sessions evicted by "
                              "the ladder, entries spilled from host memory to disk",
                              MetricType::Counter);
  const uint64_t spilled = s.offload_store ? s.offload_store->spilled : 0;
  for (auto [name, value] : {std::pair{"offloaded", s.offload.offloaded},
                             std::pair{"restored", s.offload.restored},
                             std::pair{"refused", s.offload.refused},
                             std::pair{"lost", s.offload.lost},
                             std::pair{"evicted_idle", s.offload.evicted_idle},
                             std::pair{"spilled", spilled}}) {
    AddCounter(offload_steps, {{"result", name}}, double(value));
  }
  out.push_back(std::move(offload_steps));
  auto restore = Family("polykv_restore_seconds",
                        "How long an offloaded session's Sync waited for its pages",
                        MetricType::Histogram);
  prometheus::ClientMetric h;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kRestoreSecondsBounds.size(); ++i) {
    cumulative += s.offload.restore_buckets[i];
    h.histogram.bucket.push_back({cumulative, kRestoreSecondsBounds[i]});
  }
  cumulative += s.offload.restore_buckets.back();
  h.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
  h.histogram.sample_count = cumulative;
  h.histogram.sample_sum = s.offload.restore_seconds_sum;
  restore.metric.push_back(std::move(h));
  out.push_back(std::move(restore));

  // The pool's full invariant check (bytes, pages and slot records of every
  // session against the allocators), only in the debug mode: fault and soak
  // tests read drifted accounting from outside the process this way.
  if (check_invariants_) {
    gauge("polykv_pool_invariants_ok",
          "1 when the pool's accounting invariants (KvPool::CheckInvariants) hold at this "
          "scrape; 0 is a bug in polykvd (debug mode: check_invariants_on_scrape)",
          pool_->CheckInvariants().ok() ? 1 : 0);
  }
  return out;
}

std::string GrpcCodeName(int code) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  if (code >= 0 && code < 17) return kNames[code];
  return absl::StrCat("CODE_", code);
}

}  // namespace polykv::daemon
