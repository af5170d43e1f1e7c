// polykvctl: operate a running polykvd — pool status, sessions, per-agent QoS,
// eviction, drain. Human tables by default, --json for machines.
#include <google/protobuf/util/json_util.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <tuple>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "kernels/page_format.h"
#include "policies/byte_size.h"
#include "polykv/admin.h"

namespace {

std::string Human(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

using Json = nlohmann::ordered_json;

// A reply as JSON: protobuf's mapping (proto field names, every field, 64-bit
// integers as strings), as a value so that replies can be combined.
Json ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return Json::parse(out);
}

void PrintJson(const Json& j) { std::cout << j.dump(1, ' ', false, Json::error_handler_t::replace) << "\n"; }

// "--max-bytes 256MiB": a byte size, or a message for the person who typed it.
bool ParseBytesFlag(const std::string& flag, const std::string& text, uint64_t* out, std::string* error) {
  auto b = polykv::policies::ParseByteSize(text);
  if (!b.ok()) {
    *error = absl::StrCat(flag, ": ", b.status().message());
    return false;
  }
  *out = *b;
  return true;
}

std::string FormatName(int f) {
  if (f == 0) return "-";
  return polykv::kernels::IsValidFormat(f)
             ? std::string(polykv::kernels::FormatShortName(static_cast<polykv::kernels::PageFormat>(f)))
             : "?";
}

const char* PriorityName(int p) {
  static const char* kNames[] = {"-", "best_effort", "low", "normal", "high", "critical"};
  return p >= 0 && p <= 5 ? kNames[p] : "?";
}

int ParseFormat(const std::string& s) {
  auto f = polykv::kernels::ParseFormat(s);
  return f ? static_cast<int>(*f) : -1;
}

int ParsePriority(const std::string& s) {
  for (int p = 1; p <= 5; ++p) {
    if (s == PriorityName(p)) return p;
  }
  return -1;
}

int Fail(const absl::Status& s) {
  std::cerr << "polykvctl: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
  return s.code() == absl::StatusCode::kUnavailable ? 3 : 1;
}

void PrintQos(const polykv::v1::QosRecord& q) {
  std::printf("agent               %s\n", q.agent_id().c_str());
  std::printf("priority            %s\n", PriorityName(q.priority()));
  std::printf("guaranteed_bytes    %s\n", q.guaranteed_bytes() ? Human(q.guaranteed_bytes()).c_str() : "0");
  std::printf("max_bytes           %s\n", q.max_bytes() ? Human(q.max_bytes()).c_str() : "unlimited");
  std::printf("key_floor           %s\n", FormatName(q.key_precision_floor()).c_str());
  std::printf("value_floor         %s\n", FormatName(q.value_precision_floor()).c_str());
  std::printf("key_format          %s\n", FormatName(q.key_format()).c_str());
  std::printf("value_format        %s\n", FormatName(q.value_format()).c_str());
  std::printf("block_tokens        %s\n",
              q.block_tokens() ? std::to_string(q.block_tokens()).c_str() : "daemon default");
  std::printf("policy              %s\n", q.policy().c_str());
  std::printf("budget_tokens       %s\n",
              q.budget_tokens() ? std::to_string(q.budget_tokens()).c_str() : "none");
  if (q.budget_fraction() > 0) {
    std::printf("budget_fraction     %g of each session's context (budget_tokens: its floor)\n",
                q.budget_fraction());
  } else {
    std::printf("budget_fraction     none\n");
  }
  std::string uid_list;
  for (uint32_t u : q.uids()) uid_list += (uid_list.empty() ? "" : ",") + std::to_string(u);
  std::printf("uids                %s\n", uid_list.empty() ? "operator" : uid_list.c_str());
  if (!q.policy_note().empty()) std::printf("note                %s\n", q.policy_note().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"polykvctl — operate a running polykvd"};
  app.require_subcommand(1);
  std::string socket = "/run/polykv/polykvd.sock";
  bool json = false;
  app.add_option("--socket", socket, "polykvd's Unix socket")->capture_default_str();
  app.add_flag("--json", json, "Print JSON instead of a table");

  auto* status = app.add_subcommand("status", "Pool usage, tenants and daemon state");
  status->add_flag("--json", json, "Print JSON");
  auto* sessions = app.add_subcommand("sessions", "List open sessions");
  sessions->add_flag("--json", json, "Print JSON");
  std::string tenant, agent_filter;
  sessions->add_option("--tenant", tenant, "Only this tenant");
  sessions->add_option("--agent", agent_filter, "Only this agent");

  auto* qos = app.add_subcommand("qos", "Show or change an agent's QoS");
  qos->require_subcommand(1);
  auto* qos_get = qos->add_subcommand("get", "Show an agent's QoS");
  auto* qos_set = qos->add_subcommand("set", "Change an agent's QoS (unset fields keep their value)");
  std::string agent;
  qos_get->add_option("agent", agent, "Agent id")->required();
  qos_get->add_flag("--json", json, "Print JSON");
  qos_set->add_option("agent", agent, "Agent id")->required();
  qos_set->add_flag("--json", json, "Print JSON");
  std::string priority, max_bytes, guaranteed_bytes, key_floor, value_floor, policy;
  qos_set->add_option("--priority", priority, "best_effort|low|normal|high|critical");
  qos_set->add_option("--max-bytes", max_bytes, "Cap on the agent's page bytes (0 = none), e.g. 256MiB");
  qos_set->add_option("--guaranteed-bytes", guaranteed_bytes, "Bytes kept available for the agent");
  const std::string formats = polykv::kernels::FormatShortNames();
  qos_set->add_option("--key-floor", key_floor, "Lowest key precision: " + formats);
  qos_set->add_option("--value-floor", value_floor, "Lowest value precision");
  std::string key_format, value_format, block_tokens;
  qos_set->add_option("--key-format", key_format,
                      "Key format of new sessions whose worker asks for none: " + formats +
                          ", or 'default' (the model's dtype)");
  qos_set->add_option("--value-format", value_format, "Value format, likewise");
  qos_set->add_option("--block-tokens", block_tokens,
                      "Tokens per page of new sessions whose worker asks for none: a power of two "
                      "up to 256, or 0 (the daemon's block_tokens)");
  qos_set->add_option("--policy", policy, "Compression policy name, e.g. full, h2o");
  std::string budget_tokens;
  qos_set->add_option("--budget-tokens", budget_tokens,
                      "Tokens per session the policy compacts down to (0 = no budget); with "
                      "--budget-fraction, the budget's floor");
  std::string budget_fraction, uids;
  qos_set->add_option("--uids", uids,
                      "Comma-separated uids whose sessions of the agent follow this record, or "
                      "'operator' (polykvd's own uid, root and admin_uids; the default): other "
                      "uids using the name get the default QoS");
  qos_set->add_option("--budget-fraction", budget_fraction,
                      "The budget as a share of each session's context so far, in (0, 1] "
                      "(0 = none): the session keeps max(budget-tokens, fraction x context)");

  auto* evict = app.add_subcommand("evict", "Evict a session and free its pages");
  uint64_t session_id = 0;
  evict->add_option("session_id", session_id, "Session id (see 'sessions')")->required();
  evict->add_flag("--json", json, "Print JSON");
  auto* offload = app.add_subcommand(
      "offload", "Move an idle session's pages to the offload tiers; its worker's next Sync "
                 "brings them back");
  offload->add_option("session_id", session_id, "Session id (see 'sessions')")->required();
  offload->add_flag("--json", json, "Print JSON");
  auto* drain = app.add_subcommand("drain", "Stop admitting sessions; optionally evict the rest later");
  uint32_t evict_after_ms = 0;
  drain->add_option("--evict-after-ms", evict_after_ms, "Evict sessions still open after this (0 = never)");
  drain->add_flag("--json", json, "Print JSON");

  auto* move = app.add_subcommand(
      "move", "Move a session to another polykvd (its worker continues there)");
  std::string move_to;
  uint32_t move_wait_ms = 30000;
  move->add_option("session_id", session_id, "Session id (see 'sessions')")->required();
  move->add_option("--to", move_to,
                   "HOST:PORT of the target polykvd's peer listener (its peer.address)")
      ->required();
  move->add_option("--wait-ms", move_wait_ms,
                   "How long the worker may take to reach a step boundary and park [30000]");
  move->add_flag("--json", json, "Print JSON");

  CLI11_PARSE(app, argc, argv);

  auto client = polykv::AdminClient::Connect(socket);
  if (!client.ok()) return Fail(client.status());
  auto& c = **client;

  if (status->parsed()) {
    auto s = c.GetStats();
    if (!s.ok()) return Fail(s.status());
    if (json) {
      // One object: the stats plus the session list, so a script needs one call.
      auto l = c.ListSessions();
      if (!l.ok()) return Fail(l.status());
      Json out = ToJson(*s);
      out.update(ToJson(*l));  // {"pool": ..., ...} plus {"sessions": [...]}.
      PrintJson(out);
      return 0;
    }
    const auto& p = s->pool();
    std::printf("polykvd %s, up %.0f s%s\n", s->version().c_str(), s->uptime_seconds(),
                s->draining() ? ", DRAINING" : "");
    std::printf("pool     %s tier: %s used of %s (%.1f%%), %s mapped in %llu arenas\n",
                p.tier().c_str(), Human(p.used_bytes()).c_str(), Human(p.pool_bytes()).c_str(),
                p.pool_bytes() ? 100.0 * double(p.used_bytes()) / double(p.pool_bytes()) : 0.0,
                Human(p.arena_bytes()).c_str(), (unsigned long long)p.num_arenas());
    std::printf("pages    %llu in %llu superblocks of %s\n", (unsigned long long)p.num_pages(),
                (unsigned long long)p.num_superblocks_used(), Human(p.superblock_bytes()).c_str());
    std::printf("sessions %u, lease expiries %llu, refused reservations %llu\n", s->num_sessions(),
                (unsigned long long)s->lease_expiries(), (unsigned long long)s->refused_reservations());
    const auto& x = s->prefix();
    std::printf("prefixes %s shared, %s cached; blocks attached %llu, not found %llu, "
                "dropped for room %llu\n",
                Human(x.shared_bytes()).c_str(), Human(x.cached_bytes()).c_str(),
                (unsigned long long)x.hit_blocks(), (unsigned long long)x.miss_blocks(),
                (unsigned long long)x.dropped_blocks());
    const auto& o = s->offload();
    if (o.enabled()) {
      std::printf("offload  %u sessions, %s; host %s of %s, disk %s of %s; offloaded %llu, "
                  "restored %llu (%.3f s each on average), refused %llu, lost %llu, idle "
                  "evicted %llu\n",
                  o.session_count(), Human(o.bytes()).c_str(), Human(o.host_bytes()).c_str(),
                  Human(o.host_capacity()).c_str(), Human(o.disk_bytes()).c_str(),
                  Human(o.disk_capacity()).c_str(), (unsigned long long)o.offloaded(),
                  (unsigned long long)o.restored(),
                  o.restored() ? o.restore_seconds_sum() / double(o.restored()) : 0.0,
                  (unsigned long long)o.refused(), (unsigned long long)o.lost(),
                  (unsigned long long)o.evicted_idle());
    } else {
      std::printf("offload  off (no tier configured); idle evicted %llu\n",
                  (unsigned long long)o.evicted_idle());
    }
    std::printf("metrics  %s\n\n", s->metrics_address().empty() ? "off" : s->metrics_address().c_str());
    std::printf("%-20s %12s %12s %9s\n", "TENANT", "USED", "MAPPED", "SESSIONS");
    for (const auto& t : s->tenants()) {
      std::printf("%-20s %12s %12s %9u\n", t.tenant().c_str(), Human(t.used_bytes()).c_str(),
                  Human(t.arena_bytes()).c_str(), t.num_sessions());
    }
    return 0;
  }
  if (sessions->parsed()) {
    auto l = c.ListSessions(tenant, agent_filter);
    if (!l.ok()) return Fail(l.status());
    if (json) {
      PrintJson(ToJson(*l));
      return 0;
    }
    std::printf("%-8s %-20s %-12s %-11s %9s %9s %11s %5s %-9s %7s %-5s\n", "ID", "AGENT",
                "TENANT", "PRIORITY", "RESERVED", "COMMITTED", "BYTES", "EPOCH", "K/V", "PID",
                "PAGES");
    for (const auto& x : l->sessions()) {
      std::printf("%-8llu %-20s %-12s %-11s %9llu %9llu %11s %5llu %4s/%-4s %7u %-5s\n",
                  (unsigned long long)x.session_id(), x.agent_id().c_str(), x.tenant().c_str(),
                  PriorityName(x.priority()), (unsigned long long)x.reserved_tokens(),
                  (unsigned long long)x.committed_tokens(), Human(x.bytes()).c_str(),
                  (unsigned long long)x.epoch(), FormatName(x.key_format()).c_str(),
                  FormatName(x.value_format()).c_str(), x.peer_pid(),
                  x.offloaded_to().empty() ? "pool" : x.offloaded_to().c_str());
    }
    return 0;
  }
  if (qos_get->parsed()) {
    auto q = c.GetQos(agent);
    if (!q.ok()) return Fail(q.status());
    if (json) PrintJson(ToJson(*q));
    else PrintQos(*q);
    return 0;
  }
  if (qos_set->parsed()) {
    auto cur = c.GetQos(agent);
    if (!cur.ok()) return Fail(cur.status());
    polykv::v1::QosRecord q = *cur;
    q.set_agent_id(agent);
    auto bad = [](const std::string& what) {
      std::cerr << "polykvctl: " << what << "\n";
      return 2;
    };
    if (!priority.empty()) {
      int p = ParsePriority(priority);
      if (p < 0) return bad("--priority must be one of best_effort, low, normal, high, critical");
      q.set_priority(static_cast<polykv::v1::PriorityClass>(p));
    }
    uint64_t b = 0;
    std::string error;
    if (!max_bytes.empty()) {
      if (!ParseBytesFlag("--max-bytes", max_bytes, &b, &error)) return bad(error);
      q.set_max_bytes(b);
    }
    if (!guaranteed_bytes.empty()) {
      if (!ParseBytesFlag("--guaranteed-bytes", guaranteed_bytes, &b, &error)) return bad(error);
      q.set_guaranteed_bytes(b);
    }
    if (!key_floor.empty()) {
      int f = ParseFormat(key_floor);
      if (f < 0) return bad("--key-floor must be one of " + polykv::kernels::FormatShortNames());
      q.set_key_precision_floor(static_cast<polykv::v1::PageFormat>(f));
    }
    if (!value_floor.empty()) {
      int f = ParseFormat(value_floor);
      if (f < 0) return bad("--value-floor must be one of " + polykv::kernels::FormatShortNames());
      q.set_value_precision_floor(static_cast<polykv::v1::PageFormat>(f));
    }
    for (auto [flag, text, set] :
         {std::tuple{"--key-format", &key_format, &polykv::v1::QosRecord::set_key_format},
          std::tuple{"--value-format", &value_format, &polykv::v1::QosRecord::set_value_format}}) {
      if (text->empty()) continue;
      const int f = *text == "default" ? 0 : ParseFormat(*text);
      if (f < 0) {
        return bad(std::string(flag) + " must be one of " + polykv::kernels::FormatShortNames() +
                   " default");
      }
      (q.*set)(static_cast<polykv::v1::PageFormat>(f));
    }
    if (!block_tokens.empty()) {
      if (block_tokens.size() > 3 || block_tokens.find_first_not_of("0123456789") != std::string::npos) {
        return bad("--block-tokens: a power of two up to 256, or 0");
      }
      q.set_block_tokens(static_cast<uint32_t>(std::stoul(block_tokens)));
    }
    if (!policy.empty()) q.set_policy(policy);
    if (!budget_tokens.empty()) {
      if (budget_tokens.find_first_not_of("0123456789") != std::string::npos) {
        return bad("--budget-tokens: not a token count");
      }
      q.set_budget_tokens(std::stoull(budget_tokens));
    }
    if (!budget_fraction.empty()) {
      // The daemon checks the range; here only that it is a number at all.
      double f = 0;
      if (!absl::SimpleAtod(budget_fraction, &f)) {
        return bad("--budget-fraction: a number in (0, 1], or 0 for none");
      }
      q.set_budget_fraction(f);
    }
    if (!uids.empty()) {
      q.clear_uids();
      if (uids != "operator") {
        for (absl::string_view part : absl::StrSplit(uids, ',')) {
          uint32_t u = 0;
          if (!absl::SimpleAtoi(part, &u)) return bad("--uids: comma-separated uids, or 'operator'");
          q.add_uids(u);
        }
      }
    }
    auto out = c.SetQos(q);
    if (!out.ok()) return Fail(out.status());
    if (json) PrintJson(ToJson(*out));
    else PrintQos(*out);
    return 0;
  }
  if (evict->parsed()) {
    auto freed = c.EvictSession(session_id);
    if (!freed.ok()) return Fail(freed.status());
    if (json) PrintJson({{"session_id", session_id}, {"freed_bytes", *freed}});
    else std::printf("evicted session %llu, freed %s\n", (unsigned long long)session_id, Human(*freed).c_str());
    return 0;
  }
  if (offload->parsed()) {
    auto o = c.OffloadSession(session_id);
    if (!o.ok()) return Fail(o.status());
    if (json) {
      PrintJson({{"session_id", session_id}, {"bytes", o->bytes()}, {"tier", o->tier()}});
    } else {
      std::printf("offloaded session %llu: %s to %s\n", (unsigned long long)session_id,
                  Human(o->bytes()).c_str(), o->tier().c_str());
    }
    return 0;
  }
  if (move->parsed()) {
    auto m = c.MoveSession(session_id, move_to, move_wait_ms);
    if (!m.ok()) return Fail(m.status());
    if (json) {
      PrintJson({{"session_id", session_id},
                 {"target", move_to},
                 {"target_session_id", m->target_session_id()},
                 {"bytes", m->bytes()},
                 {"tokens", m->tokens()},
                 {"park_seconds", m->park_seconds()},
                 {"copy_seconds", m->copy_seconds()},
                 {"pause_seconds", m->pause_seconds()}});
    } else {
      std::printf("moved session %llu to %s (session %llu there): %llu tokens, %s, worker "
                  "paused %.1f ms (copy %.1f ms)\n",
                  (unsigned long long)session_id, move_to.c_str(),
                  (unsigned long long)m->target_session_id(), (unsigned long long)m->tokens(),
                  Human(m->bytes()).c_str(), m->pause_seconds() * 1e3, m->copy_seconds() * 1e3);
    }
    return 0;
  }
  if (drain->parsed()) {
    auto n = c.Drain(evict_after_ms);
    if (!n.ok()) return Fail(n.status());
    if (json) PrintJson({{"draining", true}, {"num_sessions", *n}});
    else std::printf("draining; %u sessions open\n", *n);
    return 0;
  }
  return 0;
}
