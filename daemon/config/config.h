// DaemonConfig: everything polykvd can be told, from a YAML file and flags
// (flags win). The defaults below are the shipped configuration (the default
// QoS is the measured one, ShippedDefaultQos); deploy/polykvd.yaml documents
// every key with these same values (config_test keeps them equal), and
// `polykvd --print-config` prints the effective configuration.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/pool/types.h"

namespace polykv::daemon {

// The QoS of agents with no record of their own, as shipped: kvzip eviction
// (query-agnostic importance from the worker's context-reconstruction probes)
// with per-layer budgets, half the context with a 1024-token floor, int8 keys
// and int4 values on 64-token pages. Chosen on dev and confirmed on the test
// split, live: 0.954 [0.908, 0.989] of the full cache's answers at 0.241 of
// its f16 bytes (docs/results/2026-12-04-qwen2.5-coder-0.5b/README.md).
// An exact cache: policy full and unset formats (the model's dtype).
QosRecord ShippedDefaultQos();

// The peer link (polykvd to polykvd, to move sessions): gRPC over TCP with
// mutual TLS. `address` is where this daemon listens for peers ("" = it
// takes no sessions); cert/key/ca (PEM files) are needed both to listen
// and to move sessions away. scripts/make-peer-certs.sh makes a set.
struct PeerConfig {
  std::string address;
  std::string cert;
  std::string key;
  std::string ca;
  bool tls() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// Offload tiers (docs/offload.md): where idle sessions' pages go out of the
// pool. host_bytes: the daemon's own memory; dir + disk_bytes: checksummed
// files (the directory is the daemon's: files of earlier runs are removed at
// start). idle_ms: a session idle this long is offloaded (0 = only when the
// ladder needs room or an operator asks).
struct OffloadConfig {
  uint64_t host_bytes = 0;
  std::string dir;
  uint64_t disk_bytes = 0;
  uint32_t idle_ms = 0;
  bool on() const { return host_bytes > 0 || !dir.empty(); }
};

struct DaemonConfig {
  std::string socket = "/run/polykv/polykvd.sock";  // gRPC Unix socket
  mode_t socket_mode = 0660;
  std::string metrics_address = "127.0.0.1:9464";   // "off" disables the metrics server
  std::string tier = "host";                        // "host" | "cuda"
  int cuda_device = 0;
  // How a cuda tier's arenas reach workers: "fd" (CUDA VMM memory exported as
  // a POSIX fd over the fd socket) or "ipc" (legacy cudaIpcMemHandle, for
  // drivers that cannot export VMM memory).
  std::string cuda_export = "fd";
  uint64_t pool_bytes = 1ull << 30;
  uint64_t arena_bytes = 64ull << 20;
  uint64_t superblock_bytes = 2ull << 20;
  uint32_t block_tokens = 16;
  uint32_t lease_ms = 5000;
  uint32_t max_sessions = 4096;
  uint32_t max_sessions_per_uid = 0;  // 0 = max_sessions / 4
  // Tenants of its own (not bound under `tenants:`) one uid may hold
  // sessions in at once; 0 = no limit.
  uint32_t max_tenants_per_uid = 16;
  // Watch streams (session event streams, a daemon thread each) one uid
  // may hold at once; 0 = no limit.
  uint32_t max_watch_streams_per_uid = 64;
  uint32_t drain_timeout_ms = 10000;
  // gRPC socket connection limits (finding 4 of issue 14): past them a new
  // connection is closed at once. Each connection costs polykvd one fd; the
  // daemon raises its RLIMIT_NOFILE to fit max_connections. 0 = no limit.
  uint32_t max_connections = 1024;
  uint32_t max_connections_per_uid = 64;
  // A connection with no RPC in flight for this long is closed (GOAWAY, then
  // close); a client library reconnects on its next call. 0 = never.
  uint32_t connection_idle_ms = 300000;
  // Pressure ladder: below this many free pool bytes the daemon compacts
  // and then refuses the lowest priority class. 0 = pool_bytes / 10.
  uint64_t low_watermark_bytes = 0;  // SIGTERM: evict what is left after this
  // Ladder step 4: idle sessions the offload tiers cannot take are evicted
  // (lowest class, longest idle first; never critical ones).
  bool ladder_evict_idle = false;
  OffloadConfig offload;
  // Empty lists mean: the daemon's own uid and root.
  std::vector<uid_t> allowed_uids;
  std::vector<gid_t> allowed_gids;
  std::vector<uid_t> admin_uids;
  QosRecord default_qos = ShippedDefaultQos();
  std::vector<QosRecord> agents;  // Initial per-agent QoS.
  // Tenants shared by the listed uids/gids; any other tenant name is private
  // to the uid that opens it. `tenants: {name: {uids: [..], gids: [..]}}`.
  std::map<std::string, TenantBinding> tenants;
  std::string log_level = "info";
  // Debug mode: run the pool's full invariant check at every /metrics scrape
  // (polykv_pool_invariants_ok). It holds the pool lock for O(pages).
  bool check_invariants_on_scrape = false;
  // /metrics answers any local process without credentials, so agent names
  // (which may say whose work it is) appear there only when the operator
  // allows; otherwise polykv_agent_bytes labels agents with pseudonyms.
  bool metrics_agent_names = false;
  PeerConfig peer;
};

// Reads `path` over `base`; unknown keys are an error (typos must not pass).
absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path, DaemonConfig base);
// Cross-field checks (sizes, tier, address) with messages naming the key.
absl::Status ValidateConfig(const DaemonConfig& config);
// `config` as YAML that LoadConfigFile reads back to the same values: every
// key, unset optional formats as null (polykvd --print-config).
std::string ConfigToYaml(const DaemonConfig& config);

}  // namespace polykv::daemon
