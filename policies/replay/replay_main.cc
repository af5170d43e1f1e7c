// polykv-replay: runs a policy over a recorded session trace without a model.
//
//   polykv-replay --trace session.jsonl --policy hybrid --budget-tokens 2048
//   polykv-replay --synthetic tokens=8192,layers=8,seed=3 --policy sinks+structural+intent
//                 --param mode=merge --budget-ratio 0.25 --once
//   polykv-replay --synthetic tokens=1000 --write-trace /tmp/t.jsonl
//   polykv-replay --list
//
// Online (default): tokens arrive in trace order; whenever the policy's
// NeedsCompaction fires (110% of budget by default) it decides and the plan is
// applied, as the daemon would. --once: one decision over the whole trace.
// Prints one JSON object (docs/policies.md, "polykv-replay").
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "policies/plan.h"
#include "policies/policy.h"
#include "policies/replay/trace.h"
#include "policies/synthetic.h"

namespace polykv::policies::replay {
namespace {

constexpr const char* kUsage =
    R"(usage: polykv-replay (--trace FILE | --synthetic k=v,...) [options]
  --trace FILE          JSONL trace (docs/policies.md)
  --synthetic SPEC      generate one: tokens=N,layers=L,seed=S,key_dim=D,pinned=F
  --write-trace FILE    write the (loaded or synthetic) trace and exit
  --retag               re-tag tokens from their text with the structure tagger
  --policy SPEC         preset or component list (default hybrid)
  --param K=V           policy parameter (repeatable; or K=V,K=V)
  --budget-tokens N     per-layer token budget
  --budget-total N      token budget summed over layers (layer allocator splits it)
  --budget-bytes N      per-layer byte budget
  --budget-ratio R      per-layer budget = R x the trace's tokens (default 0.25)
  --once                one decision over the whole trace instead of online replay
  --list                presets and their parameters
)";

struct Counts {
  int64_t total = 0, kept = 0, merged = 0, evicted = 0;
};

using Json = nlohmann::ordered_json;

Json CountsJson(const Counts& c) {
  return {{"total", c.total}, {"kept", c.kept}, {"merged", c.merged}, {"evicted", c.evicted}};
}

Json MapJson(const std::map<std::string, Counts>& m) {
  Json out = Json::object();
  for (const auto& [k, c] : m) out[k] = CountsJson(c);
  return out;
}

void Print(const Json& j) {
  std::printf("%s\n", j.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "polykv-replay: %s\n", msg.c_str());
  return 2;
}

int List() {
  Json presets = Json::object();
  for (const std::string& p : PresetNames()) {
    auto params = DescribeParams(p);
    auto policy = MakePolicy(p);
    Json docs = Json::object();
    for (const ParamDoc& d : *params) docs[d.key] = {{"default", d.default_value}, {"doc", d.doc}};
    presets[p] = {{"spec", policy.ok() ? (*policy)->spec() : ""}, {"params", std::move(docs)}};
  }
  Print({{"presets", std::move(presets)}});
  return 0;
}

int Main(int argc, char** argv) {
  std::string trace_path, synthetic, write_path, policy_spec = "hybrid";
  PolicyParams params;
  int64_t budget_tokens = -1, budget_total = -1, budget_bytes = -1;
  double ratio = 0.25;
  bool once = false, retag = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) return nullptr;
      return argv[++i];
    };
    const char* v = nullptr;
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else if (a == "--list") {
      return List();
    } else if (a == "--once") {
      once = true;
    } else if (a == "--retag") {
      retag = true;
    } else if ((a == "--trace" || a == "--synthetic" || a == "--write-trace" || a == "--policy" ||
                a == "--param" || a == "--budget-tokens" || a == "--budget-total" ||
                a == "--budget-bytes" || a == "--budget-ratio") &&
               (v = next()) != nullptr) {
      if (a == "--trace") trace_path = v;
      if (a == "--synthetic") synthetic = v;
      if (a == "--write-trace") write_path = v;
      if (a == "--policy") policy_spec = v;
      if (a == "--param") {
        auto p = ParseParams(v);
        if (!p.ok()) return Fail(std::string(p.status().message()));
        for (const auto& [k, val] : *p) params[k] = val;
      }
      if (a == "--budget-tokens") budget_tokens = std::atoll(v);
      if (a == "--budget-total") budget_total = std::atoll(v);
      if (a == "--budget-bytes") budget_bytes = std::atoll(v);
      if (a == "--budget-ratio") ratio = std::atof(v);
    } else {
      std::fprintf(stderr, "%s", kUsage);
      return Fail(absl::StrCat("bad argument '", a, "'"));
    }
  }
  Trace trace;
  if (!trace_path.empty()) {
    std::ifstream in(trace_path);
    if (!in) return Fail(absl::StrCat("cannot open ", trace_path));
    std::stringstream ss;
    ss << in.rdbuf();
    auto t = ParseTrace(ss.str());
    if (!t.ok()) return Fail(std::string(t.status().message()));
    trace = *std::move(t);
  } else if (!synthetic.empty()) {
    auto p = ParseParams(synthetic);
    if (!p.ok()) return Fail(std::string(p.status().message()));
    SyntheticOptions o;
    for (const auto& [k, val] : *p) {
      if (k == "tokens") {
        o.num_tokens = std::atoi(val.c_str());
      } else if (k == "layers") {
        o.num_layers = std::atoi(val.c_str());
      } else if (k == "seed") {
        o.seed = std::strtoull(val.c_str(), nullptr, 10);
      } else if (k == "key_dim") {
        o.key_dim = std::atoi(val.c_str());
      } else if (k == "pinned") {
        o.pinned_fraction = std::atof(val.c_str());
      } else {
        return Fail(absl::StrCat("unknown synthetic option '", k, "'"));
      }
    }
    if (o.num_tokens < 1 || o.num_layers < 1) return Fail("synthetic needs tokens, layers >= 1");
    trace.view = MakeSyntheticView(o);
    trace.texts.assign(trace.view.tokens.size(), "");
    trace.present.assign(o.num_layers, std::vector<bool>(trace.view.tokens.size(), true));
  } else {
    std::fprintf(stderr, "%s", kUsage);
    return Fail("need --trace or --synthetic");
  }
  if (retag) Retag(&trace);
  if (!write_path.empty()) {
    std::ofstream out(write_path);
    out << WriteTrace(trace.view, trace.texts);
    if (!out) return Fail(absl::StrCat("cannot write ", write_path));
    std::fprintf(stderr, "wrote %zu tokens to %s\n", trace.view.tokens.size(), write_path.c_str());
    return 0;
  }

  auto policy = MakePolicy(policy_spec, params);
  if (!policy.ok()) return Fail(std::string(policy.status().message()));
  const int L = trace.view.num_layers();
  const int64_t n = static_cast<int64_t>(trace.view.tokens.size());
  Budget budget;
  std::string unit = "tokens";
  if (budget_bytes >= 0) {
    budget = Budget::BytesPerLayer(L, budget_bytes);
    unit = "bytes";
  } else if (budget_total >= 0) {
    budget = Budget::TotalTokens(budget_total);
  } else {
    budget = Budget::TokensPerLayer(L, budget_tokens >= 0
                                           ? budget_tokens
                                           : static_cast<int64_t>(ratio * static_cast<double>(n)));
  }

  // fate[l][token]: 0 alive, 1 merged into another slot, 2 evicted, 3 absent from the trace.
  std::vector<std::vector<uint8_t>> fate(L, std::vector<uint8_t>(n, 0));
  for (int l = 0; l < L; ++l) {
    for (int64_t t = 0; t < n; ++t) fate[l][t] = trace.present[l][t] ? 0 : 3;
  }
  std::vector<double> decision_us;
  int64_t groups = 0, requants = 0;
  std::vector<int64_t> groups_per_layer(L, 0), requant_per_layer(L, 0);
  std::vector<std::map<uint32_t, std::vector<uint32_t>>> absorbed(L);
  SessionView cur;
  auto decide = [&](const SessionView& v) -> absl::StatusOr<SessionView> {
    const auto t0 = std::chrono::steady_clock::now();
    auto plan = (*policy)->Decide(v, budget);
    decision_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (!plan.ok()) return plan.status();
    for (int l = 0; l < L; ++l) {
      const LayerPlan& lp = plan->layers[l];
      const auto& slots = v.layers[l].slots;
      // Tokens merged earlier share the fate of the slot that absorbed them.
      for (uint32_t i : lp.evict) {
        fate[l][slots[i].token] = 2;
        for (uint32_t t : absorbed[l][slots[i].token]) fate[l][t] = 2;
        absorbed[l].erase(slots[i].token);
      }
      for (const MergeGroup& g : lp.merges) {
        std::vector<uint32_t>& into = absorbed[l][slots[g.representative].token];
        for (uint32_t m : g.members) {
          if (m == g.representative) continue;
          const uint32_t tok = slots[m].token;
          fate[l][tok] = 1;
          into.push_back(tok);
          auto it = absorbed[l].find(tok);
          if (it != absorbed[l].end()) {
            into.insert(into.end(), it->second.begin(), it->second.end());
            absorbed[l].erase(it);
          }
        }
      }
      groups_per_layer[l] += static_cast<int64_t>(lp.merges.size());
      requant_per_layer[l] += static_cast<int64_t>(lp.requant.size());
      groups += static_cast<int64_t>(lp.merges.size());
      requants += static_cast<int64_t>(lp.requant.size());
    }
    return ApplyPlan(v, *plan);
  };
  if (once) {
    auto next = decide(trace.view);
    if (!next.ok()) return Fail(std::string(next.status().message()));
    cur = *std::move(next);
  } else {
    // Tokens arrive one at a time; slots are appended per layer.
    cur.key_dim = trace.view.key_dim;
    cur.shape = trace.view.shape;
    cur.layers.resize(L);
    std::vector<size_t> next_slot(L, 0);
    const size_t d = static_cast<size_t>(cur.key_dim);
    for (int l = 0; l < L; ++l) cur.layers[l].score = trace.view.layers[l].score;
    for (int64_t t = 0; t < n; ++t) {
      cur.tokens.push_back(trace.view.tokens[t]);
      cur.current_turn = std::max(cur.current_turn, trace.view.tokens[t].turn);
      for (int l = 0; l < L; ++l) {
        const LayerView& src = trace.view.layers[l];
        size_t& s = next_slot[l];
        if (s < src.slots.size() && src.slots[s].token == static_cast<uint32_t>(t)) {
          cur.layers[l].slots.push_back(src.slots[s]);
          if (d > 0 && !src.keys.empty()) {
            cur.layers[l].keys.insert(cur.layers[l].keys.end(), src.keys.begin() + s * d,
                                      src.keys.begin() + (s + 1) * d);
          } else if (d > 0) {
            cur.layers[l].keys.insert(cur.layers[l].keys.end(), d, 0.f);
          }
          ++s;
        }
      }
      if ((*policy)->NeedsCompaction(cur, budget)) {
        auto next = decide(cur);
        if (!next.ok()) return Fail(absl::StrCat("at token ", t, ": ", next.status().message()));
        cur = *std::move(next);
      }
    }
  }

  // Report.
  auto layer_budgets = (*policy)->LayerBudgets(cur, budget);
  std::map<std::string, Counts> protected_classes, kinds, roles;
  int32_t first_user = -1;
  for (const TokenMeta& m : trace.view.tokens) {
    if (m.role == Role::kUser && (first_user < 0 || m.turn < first_user)) first_user = m.turn;
  }
  auto add = [](Counts* c, uint8_t f) {
    if (f == 3) return;
    ++c->total;
    if (f == 0) ++c->kept;
    if (f == 1) ++c->merged;
    if (f == 2) ++c->evicted;
  };
  for (int l = 0; l < L; ++l) {
    for (int64_t t = 0; t < n; ++t) {
      const TokenMeta& m = trace.view.tokens[t];
      const uint8_t f = fate[l][t];
      if (m.position < 4) add(&protected_classes["sink4"], f);
      if (m.pinned) add(&protected_classes["pinned"], f);
      if (m.role == Role::kSystem) add(&protected_classes["system"], f);
      if (m.role == Role::kUser && m.turn == first_user) add(&protected_classes["first_user"], f);
      add(&kinds[std::string(BlockKindName(m.tag.kind))], f);
      add(&roles[std::string(RoleName(m.role))], f);
    }
  }
  std::vector<double> sorted = decision_us;
  std::sort(sorted.begin(), sorted.end());
  double mean = 0;
  for (double x : sorted) mean += x;
  mean = sorted.empty() ? 0 : mean / sorted.size();
  Json per_layer_tokens = Json::array();
  for (int l = 0; l < L; ++l) per_layer_tokens.push_back(layer_budgets.ok() ? (*layer_budgets)[l] : -1);
  Json per_layer = Json::array();
  for (int l = 0; l < L; ++l) {
    Counts c;
    for (int64_t t = 0; t < n; ++t) add(&c, fate[l][t]);
    per_layer.push_back({{"layer", l},
                         {"slots", cur.layers[l].slots.size()},
                         {"tokens", CountsJson(c)},
                         {"merge_groups", groups_per_layer[l]},
                         {"requant_targets", requant_per_layer[l]}});
  }
  Print({{"tool", "polykv-replay"},
         {"policy", (*policy)->spec()},
         {"mode", once ? "once" : "online"},
         {"tokens", n},
         {"layers", L},
         {"budget", {{"unit", unit}, {"per_layer_tokens", std::move(per_layer_tokens)}}},
         {"compactions", decision_us.size()},
         {"merge_groups", groups},
         {"requant_targets", requants},
         {"decision_us",
          {{"mean", mean},
           {"p50", sorted.empty() ? 0 : sorted[sorted.size() / 2]},
           {"max", sorted.empty() ? 0 : sorted.back()}}},
         {"per_layer", std::move(per_layer)},
         {"protected", MapJson(protected_classes)},
         {"kinds", MapJson(kinds)},
         {"roles", MapJson(roles)}});
  return 0;
}

}  // namespace
}  // namespace polykv::policies::replay

int main(int argc, char** argv) { return polykv::policies::replay::Main(argc, argv); }
