#include "daemon/config/config.h"

#include <yaml-cpp/yaml.h>

#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/pool/validation.h"
#include "policies/byte_size.h"

namespace polykv::daemon {

namespace {

absl::Status KeyError(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("config key '", key, "': ", what));
}

absl::StatusOr<QosRecord> ParseQos(const YAML::Node& n, QosRecord base, const std::string& where) {
  static const std::set<std::string> kKeys = {"agent_id", "priority", "guaranteed_bytes",
                                              "max_bytes", "key_precision_floor",
                                              "value_precision_floor", "key_format",
                                              "value_format", "block_tokens", "policy",
                                              "budget_tokens", "budget_fraction", "uids"};
  for (const auto& kv : n) {
    const std::string k = kv.first.as<std::string>();
    if (!kKeys.contains(k)) return KeyError(absl::StrCat(where, ".", k), "unknown key");
  }
  if (n["agent_id"]) base.agent_id = n["agent_id"].as<std::string>();
  if (n["priority"]) {
    auto p = ParsePriority(n["priority"].as<std::string>());
    if (!p) return KeyError(where + ".priority", "one of best_effort, low, normal, high, critical");
    base.priority = *p;
  }
  for (const char* key : {"guaranteed_bytes", "max_bytes"}) {
    if (!n[key]) continue;
    auto b = policies::ParseByteSize(n[key].as<std::string>());
    if (!b.ok()) return KeyError(absl::StrCat(where, ".", key), std::string(b.status().message()));
    (absl::string_view(key) == "max_bytes" ? base.max_bytes : base.guaranteed_bytes) = *b;
  }
  for (auto [key, field] : {std::pair{"key_precision_floor", &base.key_floor},
                            std::pair{"value_precision_floor", &base.value_floor},
                            std::pair{"key_format", &base.key_format},
                            std::pair{"value_format", &base.value_format}}) {
    if (!n[key]) continue;
    if (n[key].IsNull()) {  // null: no floor / the model's dtype
      field->reset();
      continue;
    }
    auto f = kernels::ParseFormat(n[key].as<std::string>());
    if (!f) {
      return KeyError(absl::StrCat(where, ".", key),
                      absl::StrCat("one of ", kernels::FormatShortNames()));
    }
    *field = *f;
  }
  if (n["block_tokens"]) {
    base.block_tokens = n["block_tokens"].as<uint32_t>();  // 0: the daemon's
    if (base.block_tokens != 0) {
      if (auto s = ValidateBlockTokens(base.block_tokens); !s.ok()) {
        return KeyError(where + ".block_tokens", std::string(s.message()));
      }
    }
  }
  if (n["policy"]) base.policy = n["policy"].as<std::string>();
  if (n["uids"]) {
    if (where == "default_qos") {
      return KeyError("default_qos.uids", "only an agent's record names uids");
    }
    const auto uids = n["uids"].as<std::vector<uid_t>>();
    base.uids = {uids.begin(), uids.end()};
  }
  if (n["budget_tokens"]) base.budget_tokens = n["budget_tokens"].as<uint64_t>();
  if (n["budget_fraction"]) {
    base.budget_fraction = n["budget_fraction"].as<double>();
    if (auto s = ValidateBudgetFraction(base.budget_fraction); !s.ok()) {
      return KeyError(where + ".budget_fraction", std::string(s.message()));
    }
  }
  return base;
}

}  // namespace

QosRecord ShippedDefaultQos() {
  QosRecord q;
  q.priority = Priority::kNormal;
  q.key_format = PageFormat::kInt8;
  q.value_format = PageFormat::kInt4;
  q.block_tokens = 64;
  q.policy = "kvzip{select=layer,layers=importance,trigger=1}";
  q.budget_tokens = 1024;
  q.budget_fraction = 0.5;
  return q;
}

absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path, DaemonConfig c) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read config ", path, ": ", e.what()));
  }
  if (root.IsNull()) return c;
  if (!root.IsMap()) return absl::InvalidArgumentError(absl::StrCat(path, ": expected a mapping"));
  static const std::set<std::string> kKeys = {
      "socket", "socket_mode", "metrics_address", "tier", "cuda_device", "cuda_export",
      "pool_bytes", "arena_bytes", "superblock_bytes", "block_tokens", "lease_ms", "max_sessions",
      "max_sessions_per_uid", "max_tenants_per_uid", "max_watch_streams_per_uid",
      "low_watermark_bytes", "max_connections",
      "max_connections_per_uid", "connection_idle_ms",
      "drain_timeout_ms", "allowed_uids", "allowed_gids", "admin_uids", "default_qos", "agents", "tenants",
      "log_level", "check_invariants_on_scrape", "metrics_agent_names", "peer",
      "ladder_evict_idle", "offload"};
  try {
    for (const auto& kv : root) {
      const std::string k = kv.first.as<std::string>();
      if (!kKeys.contains(k)) {
        return KeyError(k, absl::StrCat("unknown key; known keys: ", absl::StrJoin(kKeys, ", ")));
      }
    }
    if (root["socket"]) c.socket = root["socket"].as<std::string>();
    if (root["socket_mode"]) {
      c.socket_mode = static_cast<mode_t>(std::stoul(root["socket_mode"].as<std::string>(), nullptr, 8));
    }
    if (root["metrics_address"]) c.metrics_address = root["metrics_address"].as<std::string>();
    if (root["tier"]) c.tier = root["tier"].as<std::string>();
    if (root["cuda_device"]) c.cuda_device = root["cuda_device"].as<int>();
    if (root["cuda_export"]) c.cuda_export = root["cuda_export"].as<std::string>();
    for (auto [key, field] : {std::pair{"low_watermark_bytes", &c.low_watermark_bytes},
                              std::pair{"pool_bytes", &c.pool_bytes},
                              std::pair{"arena_bytes", &c.arena_bytes},
                              std::pair{"superblock_bytes", &c.superblock_bytes}}) {
      if (!root[key]) continue;
      auto b = policies::ParseByteSize(root[key].as<std::string>());
      if (!b.ok()) return KeyError(key, std::string(b.status().message()));
      *field = *b;
    }
    if (root["block_tokens"]) c.block_tokens = root["block_tokens"].as<uint32_t>();
    if (root["lease_ms"]) c.lease_ms = root["lease_ms"].as<uint32_t>();
    if (root["max_sessions"]) c.max_sessions = root["max_sessions"].as<uint32_t>();
    if (root["max_sessions_per_uid"]) {
      c.max_sessions_per_uid = root["max_sessions_per_uid"].as<uint32_t>();
    }
    if (root["drain_timeout_ms"]) c.drain_timeout_ms = root["drain_timeout_ms"].as<uint32_t>();
    for (auto [key, field] : {std::pair{"max_tenants_per_uid", &c.max_tenants_per_uid},
                              std::pair{"max_watch_streams_per_uid", &c.max_watch_streams_per_uid},
                              std::pair{"max_connections", &c.max_connections},
                              std::pair{"max_connections_per_uid", &c.max_connections_per_uid},
                              std::pair{"connection_idle_ms", &c.connection_idle_ms}}) {
      if (root[key]) *field = root[key].as<uint32_t>();
    }
    if (root["allowed_uids"]) c.allowed_uids = root["allowed_uids"].as<std::vector<uid_t>>();
    if (root["allowed_gids"]) c.allowed_gids = root["allowed_gids"].as<std::vector<gid_t>>();
    if (root["admin_uids"]) c.admin_uids = root["admin_uids"].as<std::vector<uid_t>>();
    if (root["log_level"]) c.log_level = root["log_level"].as<std::string>();
    if (root["check_invariants_on_scrape"]) {
      c.check_invariants_on_scrape = root["check_invariants_on_scrape"].as<bool>();
    }
    if (root["metrics_agent_names"]) {
      c.metrics_agent_names = root["metrics_agent_names"].as<bool>();
    }
    if (root["ladder_evict_idle"]) c.ladder_evict_idle = root["ladder_evict_idle"].as<bool>();
    if (root["offload"]) {
      if (!root["offload"].IsMap()) {
        return KeyError("offload", "expected a mapping (host_bytes, dir, disk_bytes, idle_ms)");
      }
      for (const auto& kv : root["offload"]) {
        const std::string k = kv.first.as<std::string>();
        if (k == "dir") {
          c.offload.dir = kv.second.IsNull() ? "" : kv.second.as<std::string>();
        } else if (k == "idle_ms") {
          c.offload.idle_ms = kv.second.as<uint32_t>();
        } else if (k == "host_bytes" || k == "disk_bytes") {
          auto b = policies::ParseByteSize(kv.second.as<std::string>());
          if (!b.ok()) return KeyError("offload." + k, std::string(b.status().message()));
          (k == "host_bytes" ? c.offload.host_bytes : c.offload.disk_bytes) = *b;
        } else {
          return KeyError("offload." + k, "unknown key (host_bytes, dir, disk_bytes, idle_ms)");
        }
      }
    }
    if (root["peer"]) {
      if (!root["peer"].IsMap()) return KeyError("peer", "expected a mapping (address, cert, key, ca)");
      for (const auto& kv : root["peer"]) {
        const std::string k = kv.first.as<std::string>();
        std::string* field = k == "address" ? &c.peer.address
                             : k == "cert"  ? &c.peer.cert
                             : k == "key"   ? &c.peer.key
                             : k == "ca"    ? &c.peer.ca
                                            : nullptr;
        if (field == nullptr) return KeyError("peer." + k, "unknown key (address, cert, key, ca)");
        *field = kv.second.IsNull() ? "" : kv.second.as<std::string>();
      }
    }
    if (root["default_qos"]) {
      auto q = ParseQos(root["default_qos"], c.default_qos, "default_qos");
      if (!q.ok()) return q.status();
      c.default_qos = *q;
    }
    if (root["agents"]) {
      int i = 0;
      for (const auto& n : root["agents"]) {
        auto q = ParseQos(n, c.default_qos, absl::StrCat("agents[", i++, "]"));
        if (!q.ok()) return q.status();
        if (q->agent_id.empty()) return KeyError(absl::StrCat("agents[", i - 1, "]"), "agent_id is required");
        if (auto s = ValidateName("agent_id", q->agent_id, kMaxNameLen); !s.ok()) {
          return KeyError(absl::StrCat("agents[", i - 1, "].agent_id"), std::string(s.message()));
        }
        c.agents.push_back(*q);
      }
    }
    if (root["tenants"]) {
      if (!root["tenants"].IsMap()) return KeyError("tenants", "expected a mapping of names");
      for (const auto& kv : root["tenants"]) {
        const std::string name = kv.first.as<std::string>();
        const std::string where = absl::StrCat("tenants.", name);
        if (auto s = ValidateName("tenant", name, kMaxTenantLen); !s.ok()) {
          return KeyError(where, std::string(s.message()));
        }
        TenantBinding b;
        for (const auto& field : kv.second) {
          const std::string k = field.first.as<std::string>();
          if (k == "uids") {
            for (uid_t u : field.second.as<std::vector<uid_t>>()) b.uids.insert(u);
          } else if (k == "gids") {
            for (gid_t g : field.second.as<std::vector<gid_t>>()) b.gids.insert(g);
          } else {
            return KeyError(absl::StrCat(where, ".", k), "unknown key (uids, gids)");
          }
        }
        if (b.uids.empty() && b.gids.empty()) {
          return KeyError(where, "names no uids or gids: nobody could open it");
        }
        c.tenants[name] = std::move(b);
      }
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  return c;
}

absl::Status ValidateConfig(const DaemonConfig& c) {
  if (c.tier != "host" && c.tier != "cuda") return KeyError("tier", "must be 'host' or 'cuda'");
  if (c.cuda_export != "fd" && c.cuda_export != "ipc") {
    return KeyError("cuda_export", "must be 'fd' (CUDA VMM, the default) or 'ipc' (legacy)");
  }
  if (c.superblock_bytes == 0 || c.superblock_bytes % 256 != 0) {
    return KeyError("superblock_bytes", "must be a positive multiple of 256");
  }
  if (c.pool_bytes < c.superblock_bytes) {
    return KeyError("pool_bytes", absl::StrCat("must be at least one superblock (",
                                               c.superblock_bytes, " bytes)"));
  }
  if (c.arena_bytes < c.superblock_bytes) {
    return KeyError("arena_bytes", "must be at least one superblock");
  }
  if (c.lease_ms < 200 || c.lease_ms > 600000) return KeyError("lease_ms", "must be in 200..600000");
  if (auto s = ValidateBlockTokens(c.block_tokens); !s.ok()) {
    return KeyError("block_tokens", std::string(s.message()));
  }
  if (c.max_connections > 0 && c.max_connections_per_uid > c.max_connections) {
    return KeyError("max_connections_per_uid",
                    absl::StrCat("is ", c.max_connections_per_uid, ", above max_connections (",
                                 c.max_connections, ")"));
  }
  if (c.connection_idle_ms > 0 && c.connection_idle_ms < 100) {
    return KeyError("connection_idle_ms", "must be 0 (never) or at least 100");
  }
  if (c.offload.dir.empty() != (c.offload.disk_bytes == 0)) {
    return KeyError("offload", "set both dir and disk_bytes for a disk tier, or neither");
  }
  if (c.offload.idle_ms > 0 && !c.offload.on()) {
    return KeyError("offload.idle_ms", "needs a tier to offload to (host_bytes, or dir and "
                                       "disk_bytes)");
  }
  if (!c.peer.address.empty() && (c.peer.cert.empty() || c.peer.key.empty() || c.peer.ca.empty())) {
    return KeyError("peer.address", "needs peer.cert, peer.key and peer.ca: the peer link is "
                                    "mutual TLS only (scripts/make-peer-certs.sh)");
  }
  if (c.peer.tls() && (c.peer.cert.empty() || c.peer.key.empty() || c.peer.ca.empty())) {
    return KeyError("peer", "set all of cert, key and ca, or none");
  }
  if ((c.socket_mode & 0007) != 0) {
    return KeyError("socket_mode", "must not grant access to others (use 0600 or 0660)");
  }
  return absl::OkStatus();
}

}  // namespace polykv::daemon
