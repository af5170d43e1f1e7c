// ConfigToYaml: the effective configuration, in the file format that
// LoadConfigFile reads (polykvd --print-config).
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "daemon/config/config.h"

namespace polykv::daemon {

namespace {

// "1GiB" where the size is a whole number of a binary unit, else bytes.
std::string ByteSizeText(uint64_t b) {
  static constexpr std::pair<uint64_t, const char*> kUnits[] = {
      {1ull << 30, "GiB"}, {1ull << 20, "MiB"}, {1ull << 10, "KiB"}};
  for (const auto& [unit, suffix] : kUnits) {
    if (b != 0 && b % unit == 0) return absl::StrCat(b / unit, suffix);
  }
  return absl::StrCat(b);
}

// The shortest text that reads back to the same double.
std::string DoubleText(double v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : absl::StrCat(v);
}

template <typename T>
void EmitIds(YAML::Emitter& out, const char* key, const T& ids) {
  out << YAML::Key << key << YAML::Value << YAML::Flow << YAML::BeginSeq;
  for (auto id : ids) out << id;
  out << YAML::EndSeq;
}

void EmitFormat(YAML::Emitter& out, const char* key, const std::optional<PageFormat>& f) {
  out << YAML::Key << key << YAML::Value;
  if (f) {
    out << std::string(kernels::FormatShortName(*f));
  } else {
    out << YAML::Null;
  }
}

void EmitQos(YAML::Emitter& out, const QosRecord& q, bool with_agent_id) {
  out << YAML::BeginMap;
  if (with_agent_id) {
    out << YAML::Key << "agent_id" << YAML::Value << q.agent_id;
    EmitIds(out, "uids", q.uids);
  }
  out << YAML::Key << "priority" << YAML::Value << std::string(PriorityName(q.priority));
  out << YAML::Key << "guaranteed_bytes" << YAML::Value << ByteSizeText(q.guaranteed_bytes);
  out << YAML::Key << "max_bytes" << YAML::Value << ByteSizeText(q.max_bytes);
  EmitFormat(out, "key_precision_floor", q.key_floor);
  EmitFormat(out, "value_precision_floor", q.value_floor);
  EmitFormat(out, "key_format", q.key_format);
  EmitFormat(out, "value_format", q.value_format);
  out << YAML::Key << "block_tokens" << YAML::Value << q.block_tokens;
  out << YAML::Key << "policy" << YAML::Value << q.policy;
  out << YAML::Key << "budget_tokens" << YAML::Value << q.budget_tokens;
  out << YAML::Key << "budget_fraction" << YAML::Value << DoubleText(q.budget_fraction);
  out << YAML::EndMap;
}

}  // namespace

std::string ConfigToYaml(const DaemonConfig& c) {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(c.socket_mode));
  out << YAML::BeginMap;
  out << YAML::Key << "socket" << YAML::Value << c.socket;
  out << YAML::Key << "socket_mode" << YAML::Value << YAML::DoubleQuoted << std::string(mode);
  out << YAML::Key << "metrics_address" << YAML::Value << c.metrics_address;
  out << YAML::Key << "tier" << YAML::Value << c.tier;
  out << YAML::Key << "cuda_device" << YAML::Value << c.cuda_device;
  out << YAML::Key << "cuda_export" << YAML::Value << c.cuda_export;
  out << YAML::Key << "pool_bytes" << YAML::Value << ByteSizeText(c.pool_bytes);
  out << YAML::Key << "arena_bytes" << YAML::Value << ByteSizeText(c.arena_bytes);
  out << YAML::Key << "superblock_bytes" << YAML::Value << ByteSizeText(c.superblock_bytes);
  out << YAML::Key << "block_tokens" << YAML::Value << c.block_tokens;
  out << YAML::Key << "lease_ms" << YAML::Value << c.lease_ms;
  out << YAML::Key << "max_sessions" << YAML::Value << c.max_sessions;
  out << YAML::Key << "max_sessions_per_uid" << YAML::Value << c.max_sessions_per_uid;
  out << YAML::Key << "max_tenants_per_uid" << YAML::Value << c.max_tenants_per_uid;
  out << YAML::Key << "max_watch_streams_per_uid" << YAML::Value << c.max_watch_streams_per_uid;
  out << YAML::Key << "max_connections" << YAML::Value << c.max_connections;
  out << YAML::Key << "max_connections_per_uid" << YAML::Value << c.max_connections_per_uid;
  out << YAML::Key << "connection_idle_ms" << YAML::Value << c.connection_idle_ms;
  out << YAML::Key << "drain_timeout_ms" << YAML::Value << c.drain_timeout_ms;
  out << YAML::Key << "low_watermark_bytes" << YAML::Value << ByteSizeText(c.low_watermark_bytes);
  out << YAML::Key << "ladder_evict_idle" << YAML::Value << c.ladder_evict_idle;
  out << YAML::Key << "offload" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "host_bytes" << YAML::Value << ByteSizeText(c.offload.host_bytes);
  out << YAML::Key << "dir" << YAML::Value << YAML::DoubleQuoted << c.offload.dir;
  out << YAML::Key << "disk_bytes" << YAML::Value << ByteSizeText(c.offload.disk_bytes);
  out << YAML::Key << "idle_ms" << YAML::Value << c.offload.idle_ms;
  out << YAML::EndMap;
  out << YAML::Key << "peer" << YAML::Value << YAML::BeginMap;
  for (auto [key, value] : {std::pair{"address", &c.peer.address}, std::pair{"cert", &c.peer.cert},
                            std::pair{"key", &c.peer.key}, std::pair{"ca", &c.peer.ca}}) {
    out << YAML::Key << key << YAML::Value << YAML::DoubleQuoted << *value;
  }
  out << YAML::EndMap;
  EmitIds(out, "allowed_uids", c.allowed_uids);
  EmitIds(out, "allowed_gids", c.allowed_gids);
  EmitIds(out, "admin_uids", c.admin_uids);
  out << YAML::Key << "tenants" << YAML::Value;
  if (c.tenants.empty()) out << YAML::Flow;
  out << YAML::BeginMap;
  for (const auto& [name, binding] : c.tenants) {
    out << YAML::Key << name << YAML::Value << YAML::BeginMap;
    EmitIds(out, "uids", binding.uids);
    EmitIds(out, "gids", binding.gids);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  out << YAML::Key << "log_level" << YAML::Value << c.log_level;
  out << YAML::Key << "check_invariants_on_scrape" << YAML::Value
      << c.check_invariants_on_scrape;
  out << YAML::Key << "metrics_agent_names" << YAML::Value << c.metrics_agent_names;
  out << YAML::Key << "default_qos" << YAML::Value;
  EmitQos(out, c.default_qos, /*with_agent_id=*/false);
  out << YAML::Key << "agents" << YAML::Value;
  if (c.agents.empty()) out << YAML::Flow;
  out << YAML::BeginSeq;
  for (const QosRecord& a : c.agents) EmitQos(out, a, /*with_agent_id=*/true);
  out << YAML::EndSeq;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace polykv::daemon
