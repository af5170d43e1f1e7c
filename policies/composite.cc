// The one policy implementation: a composite of components (see policy.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "policies/layer_budget.h"
#include "policies/lowering.h"
#include "policies/merge.h"
#include "policies/policy.h"
#include "policies/ranking.h"

namespace polykv::policies {
namespace {

constexpr uint8_t kTierHard = 3, kTierWindow = 2, kTierAnchor = 1;

// ---------------------------------------------------------------- parameters

struct ParamDef {
  const char* key;
  const char* def;
  const char* component;  // nullptr = composite-level
  const char* doc;
};

// Every parameter. Defaults marked "seed" come from the source designs and are
// not yet tuned by measurement (docs/policies.md).
constexpr ParamDef kParams[] = {
    {"mode", "selective", nullptr,
     "selective (evict lowest) | merge (merge before evicting) | hybrid (keep the top "
     "(1-merge.share) of the score-ranked budget, merge within blocks below it)"},
    {"layers", "uniform", nullptr,
     "layer allocator for a total budget: uniform | pyramid | entropy | importance (one "
     "threshold over every layer's kvzip importance; with select=layer the daemon gives "
     "layers as many slots as it says)"},
    {"select", "session", nullptr,
     "for a caller with one slot list for all layers (the daemon): session (one selection "
     "for every layer, by the most over layers) | layer (each layer its own slots, by its "
     "own importance: kvzip-scored, mode=selective, no other scoring component)"},
    {"layers.skew", "0.5", nullptr, "pyramid: low layers get (1+skew)x, top (1-skew)x"},
    {"trigger", "1.10", nullptr,
     "NeedsCompaction when a layer exceeds trigger x budget (seed 001)"},
    {"pool", "0", nullptr,
     "G: slots reserved for the score-ranked pool before the window takes its share"},
    {"fill", "1", nullptr, "1: the score-ranked pool may use all budget left; 0: at most `pool`"},
    {"merge.threshold", "0.7", nullptr, "min key cosine to merge into a group (seed 000)"},
    {"merge.probe", "16", nullptr, "groups of the same block compared per candidate"},
    {"merge.share", "0.3", nullptr, "hybrid mode: share of the score-ranked budget for groups"},
    {"merge.span", "4", nullptr,
     "only the lowest-ranked span x excess candidates are clustered (low-score slots merge)"},
    {"merge.bias", "1", nullptr, "1: merged slots carry log(count) into the softmax"},
    {"cold.format", "none", nullptr,
     "requantize the coldest whole output blocks (pages) to this format "
     "(none|int8|int4|int2|fp8)"},
    {"cold.fraction", "0", nullptr,
     "fraction of output slots requantized, in whole blocks (rounded down), coldest first"},
    {"cold.kind", "v", nullptr, "which half to requantize: k | v | kv"},
    {"sinks.count", "4", "sinks", "first positions hard-protected (StreamingLLM)"},
    {"window.size", "auto", "window",
     "recent slots protected (tier 2); auto = window.ratio x layer budget; 0 = none"},
    {"window.ratio", "1.0", "window", "window as a fraction of the layer budget (size=auto)"},
    {"anchors.system", "1", "anchors", "protect the system prompt (tier above unprotected)"},
    {"anchors.first_user", "1", "anchors", "protect the first user instruction"},
    {"h2o.weight", "1", "h2o", "weight of the decayed attention score"},
    {"h2o.decay", "1", "h2o",
     "per committed token, held attention mass x this (0 < decay <= 1; the study's 0.99); "
     "1 = summed, undecayed"},
    {"snapkv.weight", "1", "snapkv", "weight of the observation-window score"},
    {"snapkv.kernel", "7", "snapkv", "max-pool width over neighbouring slots (SnapKV)"},
    {"structural.weight", "1", "structural", "weight of the CodeComp score"},
    {"structural.alpha", "0.4", "structural", "structural term (seed 000)"},
    {"structural.beta", "0.4", "structural", "attention term (seed 000)"},
    {"structural.gamma", "0.2", "structural", "recency term (seed 000)"},
    {"structural.tau", "1024", "structural", "recency = exp(-(newest - pos) / tau)"},
    {"structural.boundary", "0.1", "structural", "bonus for block boundary tokens"},
    {"intent.weight", "1", "intent", "weight of the intent relevance"},
    {"intent.min_turns", "5", "intent",
     "below this many turns AND min_tokens tokens, rank by attention instead (seed 003)"},
    {"intent.min_tokens", "3000", "intent", "see intent.min_turns (seed 003)"},
    {"kvzip.weight", "1", "kvzip",
     "weight of the query-agnostic importance from context reconstruction (KVzip)"},
};

const char* const kComponents[] = {"sinks",  "window",     "anchors", "h2o",
                                   "snapkv", "structural", "intent",  "kvzip"};

bool IsScoring(std::string_view c) {
  return c == "h2o" || c == "snapkv" || c == "structural" || c == "intent" || c == "kvzip";
}

struct Preset {
  const char* name;
  const char* components;  // '+'-joined; empty = full
  const char* overrides;   // "k=v,..."
};

constexpr Preset kPresets[] = {
    {"full", "", ""},
    {"window", "window", ""},
    {"streaming", "sinks+window", ""},
    {"h2o", "window+h2o", "window.ratio=0.5"},
    {"snapkv", "window+snapkv", "window.size=32"},
    {"hybrid", "sinks+window+anchors+h2o", "window.size=1024,pool=256"},
    {"merge", "sinks+window+h2o", "mode=merge,window.size=256"},
    {"structural", "sinks+structural", "mode=hybrid"},
    {"intent", "sinks+intent", "layers=entropy"},
    {"kvzip", "sinks+window+kvzip", "window.size=64"},
};

enum class Mode { kSelective, kMerge, kHybrid };

// Resolved configuration of one composite.
struct Config {
  std::string spec;
  bool full = false;
  std::vector<std::string> components;
  PolicyParams values;  // every applicable key, defaults filled in

  Mode mode = Mode::kSelective;
  LayerAllocator layers = LayerAllocator::kUniform;
  double skew = 0.5, trigger = 1.1, merge_share = 0.3, merge_span = 4;
  double attention_decay = 1.0;  // h2o.decay; 1 without an h2o component
  int64_t pool = 0;
  bool fill = true, merge_bias = true;
  bool per_layer = false;  // select=layer
  MergeOptions merge;
  std::optional<ColdStep> cold;  // cold.*: unset when cold.format is none

  // What the decision path reads, parsed once by Resolve: never a parameter
  // looked up by name while deciding.
  enum class Scorer : uint8_t { kH2o, kSnapkv, kStructural, kIntent, kKvzip };
  struct Scoring {
    Scorer kind;
    double weight;  // <component>.weight
  };
  std::vector<Scoring> scorers;  // in component order
  int64_t sinks = -1;            // sinks.count; -1: no sinks component
  bool anchor_system = false, anchor_first_user = false;
  bool window = false, window_auto = true;
  double window_ratio = 0;
  int64_t window_size = 0;
  int snapkv_half = 0;  // snapkv.kernel / 2
  bool structural = false;
  float structural_alpha = 0, structural_beta = 0, structural_gamma = 0, structural_boundary = 0;
  double structural_tau = 1;
  double intent_min_turns = 0, intent_min_tokens = 0;

  bool has(std::string_view c) const {
    return std::find(components.begin(), components.end(), c) != components.end();
  }
  double num(std::string_view key) const {
    auto it = values.find(key);
    double d = 0;
    if (it != values.end()) (void)absl::SimpleAtod(it->second, &d);
    return d;
  }
  bool scoring() const {
    return std::any_of(components.begin(), components.end(),
                       [](const std::string& c) { return IsScoring(c); });
  }
};

// Config's typed fields from its components and values (validated already).
void ResolveTyped(Config& cfg) {
  for (const std::string& c : cfg.components) {
    const double weight = cfg.num(c + ".weight");
    using S = Config::Scorer;
    if (c == "h2o") cfg.scorers.push_back({S::kH2o, weight});
    if (c == "snapkv") cfg.scorers.push_back({S::kSnapkv, weight});
    if (c == "structural") cfg.scorers.push_back({S::kStructural, weight});
    if (c == "intent") cfg.scorers.push_back({S::kIntent, weight});
    if (c == "kvzip") cfg.scorers.push_back({S::kKvzip, weight});
  }
  if (cfg.has("sinks")) cfg.sinks = static_cast<int64_t>(cfg.num("sinks.count"));
  cfg.anchor_system = cfg.has("anchors") && cfg.num("anchors.system") != 0;
  cfg.anchor_first_user = cfg.has("anchors") && cfg.num("anchors.first_user") != 0;
  cfg.window = cfg.has("window");
  if (cfg.window) {
    cfg.window_auto = cfg.values.at("window.size") == "auto";
    cfg.window_ratio = cfg.num("window.ratio");
    if (!cfg.window_auto) cfg.window_size = static_cast<int64_t>(cfg.num("window.size"));
  }
  cfg.snapkv_half = std::max(0, static_cast<int>(cfg.num("snapkv.kernel")) / 2);
  cfg.structural = cfg.has("structural");
  cfg.structural_alpha = static_cast<float>(cfg.num("structural.alpha"));
  cfg.structural_beta = static_cast<float>(cfg.num("structural.beta"));
  cfg.structural_gamma = static_cast<float>(cfg.num("structural.gamma"));
  cfg.structural_boundary = static_cast<float>(cfg.num("structural.boundary"));
  cfg.structural_tau = std::max(1.0, cfg.num("structural.tau"));
  cfg.intent_min_turns = cfg.num("intent.min_turns");
  cfg.intent_min_tokens = cfg.num("intent.min_tokens");
}

absl::StatusOr<Config> Resolve(std::string_view spec, const PolicyParams& overrides) {
  Config cfg;
  PolicyParams preset_over;
  std::string comps(spec);
  for (const Preset& p : kPresets) {
    if (spec == p.name) {
      comps = p.components;
      auto parsed = ParseParams(p.overrides);
      if (!parsed.ok()) return parsed.status();
      preset_over = *parsed;
      cfg.full = comps.empty();
    }
  }
  if (!cfg.full) {
    for (absl::string_view piece : absl::StrSplit(comps, '+')) {
      const std::string c(absl::StripAsciiWhitespace(piece));
      if (std::find(std::begin(kComponents), std::end(kComponents), c) == std::end(kComponents)) {
        return absl::InvalidArgumentError(
            absl::StrCat("unknown policy component '", c, "' in '", std::string(spec),
                         "'; presets: ", absl::StrJoin(PresetNames(), ", "),
                         "; components: ", absl::StrJoin(kComponents, ", ")));
      }
      if (cfg.has(c)) {
        return absl::InvalidArgumentError(absl::StrCat("component '", c, "' named twice"));
      }
      cfg.components.push_back(c);
    }
  }
  for (const ParamDef& d : kParams) {
    if (cfg.full && d.component == nullptr && std::string_view(d.key) != "trigger") continue;
    if (d.component != nullptr && !cfg.has(d.component)) continue;
    cfg.values[d.key] = d.def;
  }
  for (const auto& [k, v] : preset_over) cfg.values[k] = v;
  for (const auto& [k, v] : overrides) {
    if (!cfg.values.count(k)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", k, "' does not apply to policy '", std::string(spec), "'"));
    }
    cfg.values[k] = v;
  }
  for (const auto& [k, v] : cfg.values) {
    if (k == "mode" || k == "layers" || k == "select" || k == "cold.format" || k == "cold.kind") {
      continue;
    }
    if (k == "window.size" && v == "auto") continue;
    double d;
    if (!absl::SimpleAtod(v, &d) || !std::isfinite(d) || d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", k, "' needs a non-negative number, got '", v, "'"));
    }
  }
  if (!cfg.full) {
    const std::string& mode = cfg.values["mode"];
    if (mode == "selective") {
      cfg.mode = Mode::kSelective;
    } else if (mode == "merge") {
      cfg.mode = Mode::kMerge;
    } else if (mode == "hybrid") {
      cfg.mode = Mode::kHybrid;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("mode '", mode, "' unknown"));
    }
    auto alloc = ParseLayerAllocator(cfg.values["layers"]);
    if (!alloc) {
      return absl::InvalidArgumentError(
          absl::StrCat("layers '", cfg.values["layers"],
                       "' unknown (uniform|pyramid|entropy|importance)"));
    }
    cfg.layers = *alloc;
    if (cfg.layers == LayerAllocator::kImportance && !cfg.has("kvzip")) {
      return absl::InvalidArgumentError("layers=importance needs the kvzip component");
    }
    const std::string& select = cfg.values["select"];
    if (select != "session" && select != "layer") {
      return absl::InvalidArgumentError(
          absl::StrCat("select '", select, "' unknown (session|layer)"));
    }
    cfg.per_layer = select == "layer";
    if (cfg.per_layer) {
      // Per-layer slots need per-layer scores: only the reconstruction probe
      // reports them per layer; the other streams are sums over layers.
      for (const std::string& c : cfg.components) {
        if (IsScoring(c) && c != "kvzip") {
          return absl::InvalidArgumentError(absl::StrCat(
              "select=layer ranks by per-layer importance only; component '", c,
              "' reads a stream summed over layers"));
        }
      }
      if (!cfg.has("kvzip")) {
        return absl::InvalidArgumentError("select=layer needs the kvzip component");
      }
      if (cfg.mode != Mode::kSelective) {
        return absl::InvalidArgumentError("select=layer needs mode=selective");
      }
    }
    cfg.skew = cfg.num("layers.skew");
    cfg.pool = static_cast<int64_t>(cfg.num("pool"));
    cfg.fill = cfg.num("fill") != 0;
    cfg.merge.threshold = static_cast<float>(cfg.num("merge.threshold"));
    cfg.merge.probe = std::max(1, static_cast<int>(cfg.num("merge.probe")));
    cfg.merge_share = std::clamp(cfg.num("merge.share"), 0.0, 1.0);
    cfg.merge_bias = cfg.num("merge.bias") != 0;
    cfg.merge_span = std::max(1.0, cfg.num("merge.span"));
    const std::string& cf = cfg.values["cold.format"];
    const std::string& ck = cfg.values["cold.kind"];
    if (ck != "k" && ck != "v" && ck != "kv") {
      return absl::InvalidArgumentError("cold.kind must be k, v or kv");
    }
    if (cf != "none") {
      const std::optional<kernels::PageFormat> format = kernels::ParseFormat(cf);
      if (!format) return absl::InvalidArgumentError(absl::StrCat("cold.format '", cf, "' unknown"));
      cfg.cold = ColdStep{*format, ck != "v", ck != "k",
                          std::clamp(cfg.num("cold.fraction"), 0.0, 1.0), -1};
    }
  }
  cfg.trigger = cfg.num("trigger");
  if (!(cfg.trigger >= 1.0) || std::isinf(cfg.trigger)) {
    return absl::InvalidArgumentError(
        absl::StrCat("trigger must be a finite ratio >= 1, got ", cfg.values["trigger"]));
  }
  if (cfg.values.contains("h2o.decay")) {
    cfg.attention_decay = cfg.num("h2o.decay");
    if (!(cfg.attention_decay > 0.0 && cfg.attention_decay <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("h2o.decay must be in (0, 1], got ", cfg.values["h2o.decay"]));
    }
  }
  ResolveTyped(cfg);
  std::vector<std::string> kv;
  for (const auto& [k, v] : cfg.values) kv.push_back(absl::StrCat(k, "=", v));
  cfg.spec = absl::StrCat(cfg.full ? "full" : absl::StrJoin(cfg.components, "+"), "{",
                          absl::StrJoin(kv, ","), "}");
  return cfg;
}

// ---------------------------------------------------------------- the work

// Facts about the whole session, computed once per decision.
struct SessionStats {
  int32_t first_user_turn = -1;
  int32_t num_turns = 0;
  int64_t newest_position = 0;
};

SessionStats Stats(const SessionView& view) {
  SessionStats s;
  int32_t max_turn = view.current_turn;
  for (const TokenMeta& t : view.tokens) {
    if (t.role == Role::kUser && (s.first_user_turn < 0 || t.turn < s.first_user_turn)) {
      s.first_user_turn = t.turn;
    }
    max_turn = std::max(max_turn, t.turn);
    s.newest_position = std::max(s.newest_position, t.position);
  }
  s.num_turns = max_turn + 1;
  return s;
}

// Buffers of one layer's decision. Decide keeps one per thread and reuses it
// across layers and calls, so a warm decision allocates only its Plan.
struct LayerWork {
  std::vector<uint8_t> tier;  // [n]
  std::vector<uint8_t> cls;   // [n] ProtectClass bits
  std::vector<float> score;   // [n] combined
  std::vector<float> raw;     // [n] scratch
  std::vector<float> src;     // [n] scratch (snapkv's pooling input)
  int64_t hard = 0;
  std::vector<uint8_t> token_tier;  // [num_tokens] see MarkTokens
  std::vector<uint8_t> token_cls;   // [num_tokens]
  // [num_tokens] structural recency exp(-(newest - position) / tau) per token,
  // computed once per decision instead of once per slot of every layer.
  // Empty = compute per slot (the reference path, ProtectClasses).
  std::vector<float> recency;
  // Fast path only.
  std::vector<uint8_t> fate;           // [n] 0 evict, 1 keep, 2 merged
  std::vector<uint64_t> keys;          // [candidates] RankKey
  std::vector<uint64_t> key_scratch;   // for the radix select / sort
  std::vector<uint32_t> rest;          // [merge candidates] slot indices, best first
  std::vector<uint8_t> flags;          // [merge candidates] scratch
  std::vector<uint32_t> picked;        // scratch
  KeyClusters clusters;
  // Cold step (both paths): this decision's (the caller's or the policy's).
  std::optional<ColdStep> cold;
  std::vector<uint32_t> order;  // [output slots] source slot of each (OutputOrder)
  std::vector<Ranked> blocks;   // [candidate blocks] score = mean, index = block
};

float StructuralPrior(BlockKind k) {
  switch (k) {
    case BlockKind::kSignature:
      return 1.0f;
    case BlockKind::kImport:
      return 0.9f;
    case BlockKind::kError:
      return 0.9f;
    case BlockKind::kClass:
      return 0.85f;
    case BlockKind::kToolCall:
      return 0.8f;
    case BlockKind::kStatement:
      return 0.6f;
    case BlockKind::kText:
      return 0.5f;
    case BlockKind::kNone:
      return 0.5f;
    case BlockKind::kBody:
      return 0.45f;
    case BlockKind::kToolOutput:
      return 0.35f;
    case BlockKind::kComment:
      return 0.3f;
  }
  return 0.5f;
}

class CompositePolicy final : public Policy {
 public:
  // reference: rank with the original full sorts over Ranked structs and
  // vector-per-group clustering (MakeReferencePolicy) instead of packed keys,
  // radix selection and flat clusters. Both make the same plans.
  CompositePolicy(Config cfg, bool reference) : cfg_(std::move(cfg)), reference_(reference) {}

  const std::string& spec() const override { return cfg_.spec; }
  bool ReadsKeys() const override { return cfg_.mode != Mode::kSelective; }
  StreamSet Reads() const override {
    StreamSet reads;
    using S = Config::Scorer;
    for (const Config::Scoring& c : cfg_.scorers) {
      // Every scorer but kvzip falls back to (or mixes in) decayed attention.
      if (c.kind != S::kKvzip) reads.add(ScoreStream::kAttention);
      if (c.kind == S::kSnapkv) reads.add(ScoreStream::kObservation);
      if (c.kind == S::kIntent) reads.add(ScoreStream::kIntent);
      if (c.kind == S::kKvzip) reads.add(ScoreStream::kImportance);
    }
    if (cfg_.layers == LayerAllocator::kEntropy) reads.add(ScoreStream::kEntropy);
    return reads;
  }
  bool SelectsPerLayer() const override { return cfg_.per_layer; }
  LayerAllocator Layers() const override { return cfg_.layers; }

  absl::StatusOr<std::vector<int64_t>> LayerBudgets(const SessionView& view,
                                                    const Budget& budget) const override {
    const int L = view.num_layers();
    const bool bytes = budget.unit == Budget::Unit::kBytes;
    std::vector<double> bpt(L, 0.0);  // most expensive slot of each layer
    if (bytes) {
      for (int l = 0; l < L; ++l) {
        bpt[l] = MaxBytesPerToken(view, l);
        if (bpt[l] <= 0) return absl::InvalidArgumentError("bytes budget needs a valid page shape");
      }
    }
    std::vector<int64_t> out(L, 0);
    if (!budget.per_layer.empty()) {
      if (static_cast<int>(budget.per_layer.size()) != L) {
        return absl::InvalidArgumentError(
            absl::StrCat("budget has ", budget.per_layer.size(), " layers, view has ", L));
      }
      for (int l = 0; l < L; ++l) {
        if (budget.per_layer[l] < 0) return absl::InvalidArgumentError("negative budget");
        out[l] = bytes ? static_cast<int64_t>(std::floor(budget.per_layer[l] / bpt[l]))
                       : budget.per_layer[l];
      }
      return out;
    }
    if (budget.total < 0) return absl::InvalidArgumentError("negative budget");
    int64_t total = budget.total;
    if (bytes) {
      const double mx = L > 0 ? *std::max_element(bpt.begin(), bpt.end()) : 1.0;
      total = std::max<int64_t>(0, static_cast<int64_t>(std::floor(total / mx)) - L);
    }
    std::vector<int64_t> sizes(L);
    std::vector<float> ent(L);
    for (int l = 0; l < L; ++l) {
      sizes[l] = static_cast<int64_t>(view.layers[l].slots.size());
      ent[l] = view.layers[l].score[ScoreStream::kEntropy];
    }
    if (cfg_.full) return AllocateLayerBudgets(LayerAllocator::kUniform, total, sizes, ent);
    // Pinned slots (a shared prefix's, kv_pool_compaction.cc) are kept
    // whatever the budget: ranked first, and no layer's budget below them.
    std::vector<int64_t> pinned(L, 0);
    for (int l = 0; l < L; ++l) {
      for (const Slot& s : view.layers[l].slots) pinned[l] += view.tokens[s.token].pinned;
    }
    if (cfg_.layers == LayerAllocator::kImportance) {
      std::vector<std::vector<float>> scores(L);
      for (int l = 0; l < L; ++l) {
        for (const Slot& s : view.layers[l].slots) {
          scores[l].push_back(view.tokens[s.token].pinned
                                  ? std::numeric_limits<float>::infinity()
                                  : s.score[ScoreStream::kImportance]);
        }
      }
      out = ImportanceLayerBudgets(total, scores);
    } else {
      out = AllocateLayerBudgets(cfg_.layers, total, sizes, ent, cfg_.skew);
    }
    for (int l = 0; l < L; ++l) out[l] = std::max(out[l], pinned[l]);
    return out;
  }

  double Trigger() const override { return cfg_.trigger; }
  double AttentionDecay() const override { return cfg_.attention_decay; }
  bool NeedsCompaction(const SessionView& view, const Budget& budget) const override {
    if (cfg_.full) return false;
    auto b = LayerBudgets(view, budget);
    if (!b.ok()) return false;
    for (int l = 0; l < view.num_layers(); ++l) {
      if (static_cast<double>(view.layers[l].slots.size()) > cfg_.trigger * (*b)[l]) return true;
    }
    return false;
  }

  std::vector<std::vector<uint8_t>> ProtectClasses(
      const SessionView& view, const std::vector<int64_t>& layer_budgets) const override {
    std::vector<std::vector<uint8_t>> out(view.num_layers());
    const SessionStats stats = Stats(view);
    LayerWork w;
    MarkTokens(view, stats, &w);
    for (int l = 0; l < view.num_layers(); ++l) {
      const int64_t b = l < static_cast<int>(layer_budgets.size()) ? layer_budgets[l] : 0;
      MarkTiers(view, l, b, &w);
      out[l] = w.cls;
    }
    return out;
  }

  absl::StatusOr<Plan> Decide(const SessionView& view, const Budget& budget) const override {
    // The view is validated layer by layer just before each layer is decided
    // (one pass over the slots from memory, the others from cache). Any
    // failure first asks ValidateView, so a bad view is reported as before.
    auto view_error = [&view](absl::Status other) {
      absl::Status st = ValidateView(view);
      return st.ok() ? other : st;
    };
    if (view.num_layers() == 0) {
      if (auto st = ValidateView(view); !st.ok()) return st;
    }
    auto budgets = LayerBudgets(view, budget);
    if (!budgets.ok()) return view_error(budgets.status());
    const SessionStats stats = Stats(view);
    Plan plan;
    plan.policy = cfg_.spec;
    plan.log_count_bias = cfg_.full ? true : cfg_.merge_bias;
    plan.layers.resize(view.num_layers());
    PlanChecks checks;
    checks.must_keep.resize(view.num_layers());
    checks.budget = &budget;
    // One per thread: Decide may run concurrently on one Policy, and reusing
    // the buffers across calls is most of what makes a decision cheap.
    thread_local LayerWork w;
    w.cold = budget.cold ? budget.cold : cfg_.cold;
    MarkTokens(view, stats, &w);
    w.recency.clear();
    if (!reference_ && cfg_.structural) {
      w.recency.resize(view.tokens.size());
      for (size_t t = 0; t < view.tokens.size(); ++t) {
        w.recency[t] =
            Recency(stats.newest_position, view.tokens[t].position, cfg_.structural_tau);
      }
    }
    for (int l = 0; l < view.num_layers(); ++l) {
      LayerPlan& lp = plan.layers[l];
      lp.budget_tokens = (*budgets)[l];
      if (budget.unit == Budget::Unit::kBytes) {
        lp.budget_bytes =
            budget.per_layer.empty()
                ? static_cast<int64_t>(std::ceil(lp.budget_tokens * MaxBytesPerToken(view, l)))
                : budget.per_layer[l];
      }
      if (auto st = ValidateLayer(view, l); !st.ok()) return st;
      if (auto st = DecideLayer(view, stats, l, lp.budget_tokens, &w, &lp); !st.ok()) {
        return view_error(st);
      }
      if (w.hard > 0) {
        checks.must_keep[l].reserve(static_cast<size_t>(w.hard));
        for (size_t i = 0; i < w.tier.size(); ++i) {
          if (w.tier[i] == kTierHard) checks.must_keep[l].push_back(static_cast<uint32_t>(i));
        }
      }
    }
    if (budget.unit == Budget::Unit::kBytes && budget.per_layer.empty()) {
      checks.budget = nullptr;  // per-layer byte limits were derived; checked per layer
    }
    if (auto st = ValidatePlan(view, plan, checks); !st.ok()) {
      return absl::InternalError(
          absl::StrCat("policy ", cfg_.spec, " made an invalid plan: ", st.message()));
    }
    return plan;
  }

 private:
  static double MaxBytesPerToken(const SessionView& view, int l) {
    double b = 0;
    for (const Slot& s : view.layers[l].slots) {
      b = std::max(b, BytesPerToken(view.shape, s.k_format, s.v_format));
    }
    // An empty layer plans for the widest common format.
    return b > 0
               ? b
               : BytesPerToken(view.shape, kernels::PageFormat::kBF16, kernels::PageFormat::kBF16);
  }

  static float Recency(int64_t newest, int64_t position, double tau) {
    return static_cast<float>(std::exp(-static_cast<double>(newest - position) / tau));
  }

  // The protect classes that depend on the token alone (sinks, pinned,
  // anchors) and their tiers, once per decision: every layer's slots then
  // look them up in a table of one byte per token.
  void MarkTokens(const SessionView& view, const SessionStats& stats, LayerWork* w) const {
    const size_t num_tokens = view.tokens.size();
    w->token_tier.resize(num_tokens);
    w->token_cls.resize(num_tokens);
    const int64_t sinks = cfg_.sinks;
    const bool sys = cfg_.anchor_system;
    const bool first = cfg_.anchor_first_user;
    const TokenMeta* tokens = view.tokens.data();
    uint8_t* tier = w->token_tier.data();
    uint8_t* cls = w->token_cls.data();
    for (size_t i = 0; i < num_tokens; ++i) {
      const TokenMeta& t = tokens[i];
      uint8_t c = 0, tr = 0;
      if (t.pinned) c |= kProtectPinned;
      if (t.position < sinks) c |= kProtectSink;
      if (c != 0) tr = kTierHard;
      if (sys && t.role == Role::kSystem) c |= kProtectSystem;
      if (first && t.role == Role::kUser && t.turn == stats.first_user_turn) {
        c |= kProtectFirstUser;
      }
      if (tr == 0 && (c & (kProtectSystem | kProtectFirstUser))) tr = kTierAnchor;
      tier[i] = tr;
      cls[i] = c;
    }
  }

  // Tiers and protect classes of one layer (steps shared by Decide and
  // ProtectClasses). REQUIRES: MarkTokens(view, ...) ran on w.
  void MarkTiers(const SessionView& view, int l, int64_t budget, LayerWork* w) const {
    const size_t n = view.layers[l].slots.size();
    w->tier.resize(n);
    w->cls.resize(n);
    // Raw pointers: a store through a uint8_t vector may alias anything, so
    // indexing the vectors would reload every pointer after every store.
    const Slot* slots = view.layers[l].slots.data();
    const uint8_t* token_tier = w->token_tier.data();
    const uint8_t* token_cls = w->token_cls.data();
    uint8_t* tier = w->tier.data();
    uint8_t* cls = w->cls.data();
    int64_t hard = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint32_t t = slots[i].token;
      tier[i] = token_tier[t];
      cls[i] = token_cls[t];
      hard += token_tier[t] == kTierHard;
    }
    w->hard = hard;
    if (cfg_.window) {
      int64_t win = cfg_.window_auto ? static_cast<int64_t>(std::floor(cfg_.window_ratio * budget))
                                     : cfg_.window_size;
      if (w->cold && w->cold->window >= 0) win = w->cold->window;  // the caller's step
      const int64_t room = std::max<int64_t>(0, budget - w->hard);
      const int64_t reserve = std::min(cfg_.pool, room);
      win = std::clamp<int64_t>(win, 0, room - reserve);
      for (size_t i = n; i-- > 0 && win > 0;) {
        if (w->tier[i] == kTierHard) continue;
        w->tier[i] = kTierWindow;
        w->cls[i] |= kProtectWindow;
        --win;
      }
    }
  }

  // Adds the weighted, min-max normalised raw score of one component.
  static void AddNormalized(std::vector<float>& raw, double weight, std::vector<float>* score) {
    float lo = INFINITY, hi = -INFINITY;
    for (float& r : raw) {
      if (!std::isfinite(r)) r = 0.f;
      lo = std::min(lo, r);
      hi = std::max(hi, r);
    }
    if (!(hi > lo)) return;
    const float inv = static_cast<float>(weight / (static_cast<double>(hi) - lo));
    if (!std::isfinite(inv)) return;  // a range too small to carry information
    for (size_t i = 0; i < raw.size(); ++i) (*score)[i] += (raw[i] - lo) * inv;
  }

  void Score(const SessionView& view, const SessionStats& stats, int l, LayerWork* w) const {
    const std::vector<Slot>& slots = view.layers[l].slots;
    const size_t n = slots.size();
    w->score.assign(n, 0.f);
    std::vector<float>& raw = w->raw;
    raw.resize(n);
    using S = Config::Scorer;
    using enum ScoreStream;
    for (const Config::Scoring& c : cfg_.scorers) {
      if (c.kind == S::kH2o) {
        for (size_t i = 0; i < n; ++i) raw[i] = slots[i].score[kAttention];
      } else if (c.kind == S::kSnapkv) {
        bool any = false;
        for (size_t i = 0; i < n; ++i) any |= slots[i].score[kObservation] != 0.f;
        // Without observation scores (no user/tool turn ended yet) SnapKV has
        // nothing to go on; fall back to the decayed attention.
        std::vector<float>& src = w->src;
        src.resize(n);
        for (size_t i = 0; i < n; ++i) {
          src[i] = slots[i].score[any ? kObservation : kAttention];
        }
        MaxPool(src, cfg_.snapkv_half, &raw);
      } else if (c.kind == S::kStructural) {
        const float a = cfg_.structural_alpha, b = cfg_.structural_beta, g = cfg_.structural_gamma;
        const double tau = cfg_.structural_tau;
        const float bonus = cfg_.structural_boundary;
        float amax = 0.f;
        for (const Slot& s : slots) {
          const float a = s.score[kAttention];
          amax = std::max(amax, std::isfinite(a) ? a : 0.f);
        }
        const float ainv = amax > 0 ? 1.f / amax : 0.f;
        for (size_t i = 0; i < n; ++i) {
          const TokenMeta& t = view.tokens[slots[i].token];
          const float s =
              std::min(1.f, StructuralPrior(t.tag.kind) + (t.tag.boundary ? bonus : 0.f));
          const float mass = slots[i].score[kAttention];
          const float att = std::isfinite(mass) ? mass * ainv : 0.f;
          const float rec = w->recency.empty()
                                ? Recency(stats.newest_position, t.position, tau)
                                : w->recency[slots[i].token];
          raw[i] = a * s + b * att + g * rec;
        }
      } else if (c.kind == S::kIntent) {
        const bool pays = stats.num_turns > cfg_.intent_min_turns ||
                          static_cast<double>(view.tokens.size()) > cfg_.intent_min_tokens;
        for (size_t i = 0; i < n; ++i) raw[i] = slots[i].score[pays ? kIntent : kAttention];
      } else if (c.kind == S::kKvzip) {
        for (size_t i = 0; i < n; ++i) raw[i] = slots[i].score[kImportance];
      }
      AddNormalized(raw, c.weight, &w->score);
    }
  }

  // out[i] = max(src[i-half .. i+half]) (SnapKV's pooling keeps neighbours of
  // hot tokens, so kept spans stay readable). O(n * half); half is small.
  static void MaxPool(const std::vector<float>& src, int half, std::vector<float>* out) {
    const int n = static_cast<int>(src.size());
    const float* s = src.data();
    float* o = out->data();
    for (int i = 0; i < n; ++i) {
      float m = s[i];
      const int hi = std::min(n - 1, i + half);
      for (int j = std::max(0, i - half); j <= hi; ++j) m = std::max(m, s[j]);
      o[i] = m;
    }
  }

  absl::Status DecideLayer(const SessionView& view, const SessionStats& stats, int l,
                           int64_t budget, LayerWork* w, LayerPlan* lp) const {
    const std::vector<Slot>& slots = view.layers[l].slots;
    const size_t n = slots.size();
    auto keep_all = [&] {
      lp->keep.resize(n);
      for (size_t i = 0; i < n; ++i) lp->keep[i] = static_cast<uint32_t>(i);
    };
    if (cfg_.full) {
      // Keeps every slot, so no protection to check: no tiers to mark.
      w->hard = 0;
      if (static_cast<int64_t>(n) > budget) {
        return absl::ResourceExhaustedError(absl::StrCat("policy full keeps every slot: layer ", l,
                                                         " holds ", n, " > budget ", budget));
      }
      keep_all();
      return absl::OkStatus();
    }
    MarkTiers(view, l, budget, w);
    if (w->hard > budget) {
      return absl::ResourceExhaustedError(
          absl::StrCat("layer ", l, ": ", w->hard,
                       " hard-protected slots (sinks, pinned) exceed budget ", budget));
    }
    auto score = [&] {
      if (cfg_.scoring()) {
        Score(view, stats, l, w);
      } else {
        w->score.assign(n, 0.f);  // protection only: rank by tier, then recency
      }
    };
    if (static_cast<int64_t>(n) <= budget) {
      keep_all();
      // Within budget nothing is evicted, yet the cold step still runs: that
      // is how the daemon's pressure ladder asks for requantization before
      // any eviction (a budget of every slot, daemon/compaction/pressure_ladder.h).
      if (w->cold && w->cold->fraction > 0) {
        score();
        if (reference_ || n > kRankIndexMask) {
          RequantizeReference(view, l, *w, lp);
        } else {
          Requantize(view, l, w, lp);
        }
      }
      return absl::OkStatus();
    }
    score();
    if (reference_ || n > kRankIndexMask) {
      SelectReference(view, l, budget, *w, lp);
      RequantizeReference(view, l, *w, lp);
    } else {
      Select(view, l, budget, w, lp);
      Requantize(view, l, w, lp);
    }
    return absl::OkStatus();
  }

  // The reference selection: Ranked structs, a heap or nth_element for the
  // selective mode, a full std::sort and ClusterByKey for merge / hybrid.
  void SelectReference(const SessionView& view, int l, int64_t budget, const LayerWork& w0,
                       LayerPlan* lp) const {
    const LayerWork* w = &w0;
    const std::vector<Slot>& slots = view.layers[l].slots;
    const size_t n = slots.size();
    std::vector<uint8_t> fate(n, 0);  // 0 evict, 1 keep, 2 merged
    std::vector<Ranked> cand;
    cand.reserve(n);
    int64_t fixed = 0;
    const bool scoring = cfg_.scoring();
    for (size_t i = 0; i < n; ++i) {
      if (w->tier[i] >= kTierWindow) {
        fate[i] = 1;
        ++fixed;
      } else if (scoring || w->tier[i] > 0) {
        cand.push_back(Ranked{w->tier[i], w->score[i], view.tokens[slots[i].token].position,
                              static_cast<uint32_t>(i)});
      }
    }
    int64_t room = budget - fixed;
    if (!cfg_.fill) room = std::min(room, cfg_.pool);
    room = std::max<int64_t>(0, room);
    std::vector<std::vector<uint32_t>> merged;  // groups of source indices
    if (cfg_.mode == Mode::kSelective || !scoring) {
      // The best `room` candidates. A small pool is the compaction study's
      // min-heap (O(n log G), most offers rejected by one comparison); a large
      // one is a selection (O(n)). Both give the same set: the order is total.
      if (static_cast<size_t>(room) * 8 < cand.size()) {
        GlobalPool pool(static_cast<size_t>(room));
        for (const Ranked& r : cand) pool.Offer(r);
        for (uint32_t i : pool.SortedIndices()) fate[i] = 1;
      } else if (!cand.empty()) {
        const size_t k = std::min(cand.size(), static_cast<size_t>(room));
        std::nth_element(cand.begin(), cand.begin() + k, cand.end(), BetterOrder{});
        for (size_t c = 0; c < k; ++c) fate[cand[c].index] = 1;
      }
    } else {
      std::sort(cand.begin(), cand.end(), BetterOrder{});
      int64_t anchors = 0;
      for (const Ranked& r : cand) anchors += r.tier > 0;
      int64_t direct = std::min(anchors, room);
      if (cfg_.mode == Mode::kHybrid) {
        direct = std::max(direct, static_cast<int64_t>(std::floor(static_cast<double>(room) *
                                                                  (1.0 - cfg_.merge_share))));
      }
      direct = std::min<int64_t>(direct, static_cast<int64_t>(cand.size()));
      // Only low-score slots merge: cluster the lowest-ranked span x excess
      // candidates, keep the ones above them as they are.
      const int64_t excess = static_cast<int64_t>(cand.size()) - room;
      const int64_t pool_size = static_cast<int64_t>(
          std::ceil(cfg_.merge_span * static_cast<double>(std::max<int64_t>(excess, 0))));
      direct = std::max(direct, static_cast<int64_t>(cand.size()) - pool_size);
      direct = std::min(direct, room);
      for (int64_t c = 0; c < direct; ++c) fate[cand[c].index] = 1;
      const absl::Span<const Ranked> rest = absl::MakeConstSpan(cand).subspan(direct);
      int64_t slots_left = room - direct;
      auto groups = ClusterByKey(view, l, rest, cfg_.merge);
      if (static_cast<int64_t>(groups.size()) > slots_left) groups.resize(slots_left);
      // Spare slots un-merge the best non-leader members: merge only as much
      // as the budget requires.
      int64_t spare = slots_left - static_cast<int64_t>(groups.size());
      std::vector<uint8_t> detached(rest.size(), 0);
      if (spare > 0) {
        std::vector<uint8_t> in_group(rest.size(), 0);
        for (const auto& g : groups) {
          for (size_t m = 1; m < g.size(); ++m) in_group[g[m]] = 1;
        }
        for (size_t c = 0; c < rest.size() && spare > 0; ++c) {
          if (in_group[c]) {
            detached[c] = 1;
            --spare;
          }
        }
      }
      for (const auto& g : groups) {
        std::vector<uint32_t> members;
        for (uint32_t c : g) {
          if (detached[c]) {
            fate[rest[c].index] = 1;
          } else {
            members.push_back(rest[c].index);
          }
        }
        if (members.size() == 1) {
          fate[members[0]] = 1;
        } else if (members.size() > 1) {
          for (uint32_t m : members) fate[m] = 2;
          merged.push_back(std::move(members));
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (fate[i] == 1) lp->keep.push_back(static_cast<uint32_t>(i));
      if (fate[i] == 0) lp->evict.push_back(static_cast<uint32_t>(i));
    }
    for (auto& g : merged) lp->merges.push_back(MakeMergeGroup(view, l, std::move(g), w->score));
    std::sort(lp->merges.begin(), lp->merges.end(), [](const MergeGroup& a, const MergeGroup& b) {
      return a.representative < b.representative;
    });
  }

  // The fast selection, the same choices as SelectReference: candidates as
  // RankKeys (one integer compare instead of Better's four), the best `room`
  // (selective) or the best `direct` (merge / hybrid) by radix select, and
  // only the clustered rest sorted, by radix sort.
  // REQUIRES: n <= kRankIndexMask.
  void Select(const SessionView& view, int l, int64_t budget, LayerWork* w, LayerPlan* lp) const {
    const size_t n = view.layers[l].slots.size();
    w->fate.assign(n, 0);
    uint8_t* fate = w->fate.data();  // a pointer, not the vector: see MarkTiers
    std::vector<uint64_t>& keys = w->keys;
    keys.resize(n);
    size_t num_cand = 0;
    int64_t fixed = 0, anchors = 0;
    const bool scoring = cfg_.scoring();
    const uint8_t* tier = w->tier.data();
    const float* score = w->score.data();
    for (size_t i = 0; i < n; ++i) {
      if (tier[i] >= kTierWindow) {
        fate[i] = 1;
        ++fixed;
      } else if (scoring || tier[i] > 0) {
        keys[num_cand++] = RankKey(tier[i], score[i], static_cast<uint32_t>(i));
        anchors += tier[i] > 0;
      }
    }
    keys.resize(num_cand);
    int64_t room = budget - fixed;
    if (!cfg_.fill) room = std::min(room, cfg_.pool);
    room = std::max<int64_t>(0, room);
    const int64_t cand = static_cast<int64_t>(num_cand);
    if (cfg_.mode == Mode::kSelective || !scoring) {
      const size_t k = static_cast<size_t>(std::min(cand, room));
      SelectLargest(absl::MakeSpan(keys), k, &w->key_scratch);
      for (size_t c = 0; c < k; ++c) fate[RankKeyIndex(keys[c])] = 1;
    } else {
      int64_t direct = std::min(anchors, room);
      if (cfg_.mode == Mode::kHybrid) {
        direct = std::max(direct, static_cast<int64_t>(std::floor(static_cast<double>(room) *
                                                                  (1.0 - cfg_.merge_share))));
      }
      direct = std::min<int64_t>(direct, cand);
      const int64_t excess = cand - room;
      const int64_t pool_size = static_cast<int64_t>(
          std::ceil(cfg_.merge_span * static_cast<double>(std::max<int64_t>(excess, 0))));
      direct = std::max(direct, cand - pool_size);
      direct = std::min(direct, room);
      SelectLargest(absl::MakeSpan(keys), static_cast<size_t>(direct), &w->key_scratch);
      for (int64_t c = 0; c < direct; ++c) fate[RankKeyIndex(keys[c])] = 1;
      const absl::Span<uint64_t> rest_keys = absl::MakeSpan(keys).subspan(direct);
      RadixSortAscending(rest_keys, &w->key_scratch);
      std::vector<uint32_t>& rest = w->rest;  // best first
      rest.resize(rest_keys.size());
      for (size_t c = 0; c < rest.size(); ++c) {
        rest[c] = RankKeyIndex(rest_keys[rest.size() - 1 - c]);
      }
      const int64_t slots_left = room - direct;
      KeyClusters& cl = w->clusters;
      ClusterByKeyInto(view, l, rest, cfg_.merge, &cl);
      const size_t num_groups =
          std::min(cl.num_groups(), static_cast<size_t>(std::max<int64_t>(slots_left, 0)));
      // Spare slots un-merge the best non-leader members: merge only as much
      // as the budget requires.
      int64_t spare = slots_left - static_cast<int64_t>(num_groups);
      std::vector<uint8_t>& detached = w->flags;  // [rest] 1 in a group but not its leader, 2 detached
      detached.assign(rest.size(), 0);
      if (spare > 0) {
        for (size_t g = 0; g < num_groups; ++g) {
          for (uint32_t m = cl.offsets[g] + 1; m < cl.offsets[g + 1]; ++m) detached[cl.members[m]] = 1;
        }
        for (size_t c = 0; c < rest.size() && spare > 0; ++c) {
          if (detached[c] == 1) {
            detached[c] = 2;
            --spare;
          }
        }
      }
      std::vector<uint32_t>& members = w->picked;
      for (size_t g = 0; g < num_groups; ++g) {
        members.clear();
        for (uint32_t m = cl.offsets[g]; m < cl.offsets[g + 1]; ++m) {
          const uint32_t c = cl.members[m];
          if (detached[c] == 2) {
            fate[rest[c]] = 1;
          } else {
            members.push_back(rest[c]);
          }
        }
        if (members.size() == 1) {
          fate[members[0]] = 1;
        } else if (members.size() > 1) {
          for (uint32_t m : members) fate[m] = 2;
          lp->merges.push_back(MakeMergeGroup(
              view, l, std::vector<uint32_t>(members.begin(), members.end()), w->score));
        }
      }
      std::sort(lp->merges.begin(), lp->merges.end(),
                [](const MergeGroup& a, const MergeGroup& b) {
                  return a.representative < b.representative;
                });
    }
    size_t num_keep = 0, num_evict = 0;
    for (size_t i = 0; i < n; ++i) {
      num_keep += fate[i] == 1;
      num_evict += fate[i] == 0;
    }
    lp->keep.resize(num_keep);
    lp->evict.resize(num_evict);
    uint32_t* keep = lp->keep.data();
    uint32_t* evict = lp->evict.data();
    for (size_t i = 0; i < n; ++i) {
      if (fate[i] == 1) {
        *keep++ = static_cast<uint32_t>(i);
      } else if (fate[i] == 0) {
        *evict++ = static_cast<uint32_t>(i);
      }
    }
  }

  // The cold step (cold.format). Formats are per block (a page holds
  // block_tokens slots in one format, policies/lowering.h), so it picks whole
  // output blocks: the layer's output order (after keep / merge) cut into
  // blocks of view.shape.block_tokens; only FULL blocks are candidates (the
  // trailing partial one is still being filled, and the lowering refuses it).
  //
  // A block holding a protected slot (tier > 0: sinks, pinned, the recent
  // window, anchors; a merged slot when any member is) is excluded, not
  // penalised: requantizing the block would store that slot coarser, and the
  // per-slot cold step this replaces never requantized a protected slot. A
  // block holding a slot of cold.format's bits in another format (fp8 under
  // cold.format=int8) is excluded too: it would be re-encoded at no saving.
  // The rest rank by the mean combined score of their slots (a merged slot:
  // its representative's), coldest first, ties to the older block.
  //
  // Fills w->order and w->blocks (score = mean, position = index = block)
  // and returns how many blocks to pick: floor(cold.fraction x output slots
  // / block_tokens), at most the candidates.
  size_t ColdBlocks(const SessionView& view, int l, const LayerPlan& lp, LayerWork* w) const {
    w->blocks.clear();
    if (!w->cold || w->cold->fraction <= 0) return 0;
    const ColdStep& cold = *w->cold;
    const size_t bt = static_cast<size_t>(std::max(1, view.shape.block_tokens));
    OutputOrder(lp, &w->order);
    const size_t num_out = w->order.size();
    const size_t want = static_cast<size_t>(
        std::floor(cold.fraction * static_cast<double>(num_out) / static_cast<double>(bt)));
    if (want == 0) return 0;
    const std::vector<Slot>& slots = view.layers[l].slots;
    const int bits = kernels::FormatBits(cold.format);
    // Same bits as cold.format, another format: see above.
    auto odd = [&](kernels::PageFormat f) {
      return kernels::FormatBits(f) == bits && f != cold.format;
    };
    size_t g = 0;  // merges ascend by representative, as the order does
    for (size_t b = 0; b < num_out / bt; ++b) {
      bool excluded = false;
      double sum = 0;
      for (size_t j = b * bt; j < (b + 1) * bt; ++j) {
        const uint32_t src = w->order[j];
        excluded |= w->tier[src] > 0;
        if (g < lp.merges.size() && lp.merges[g].representative == src) {
          for (uint32_t m : lp.merges[g].members) excluded |= w->tier[m] > 0;
          ++g;
        }
        excluded |= (cold.keys && odd(slots[src].k_format)) ||
                    (cold.values && odd(slots[src].v_format));
        sum += w->score[src];
      }
      if (excluded) continue;
      const auto index = static_cast<uint32_t>(b);
      w->blocks.push_back(Ranked{0, static_cast<float>(sum / static_cast<double>(bt)), index, index});
    }
    return std::min(want, w->blocks.size());
  }

  // Requantizes every output slot of the picked blocks (ascending block
  // indices) to cold.format, per cold kind, except a slot already at or below
  // its bits: the block is then stored in cold.format, as the lowering wants.
  void EmitColdBlocks(const SessionView& view, int l, const LayerWork& w,
                      absl::Span<const uint32_t> picked, LayerPlan* lp) const {
    const std::vector<Slot>& slots = view.layers[l].slots;
    const size_t bt = static_cast<size_t>(std::max(1, view.shape.block_tokens));
    const ColdStep& cold = *w.cold;
    const int bits = kernels::FormatBits(cold.format);
    for (uint32_t b : picked) {  // ascending output slots: the (slot, kind) order
      for (size_t j = b * bt; j < (b + 1) * bt; ++j) {
        const uint32_t i = w.order[j];
        if (cold.keys && kernels::FormatBits(slots[i].k_format) > bits) {
          lp->requant.push_back({i, kernels::KvKind::kKey, cold.format});
        }
        if (cold.values && kernels::FormatBits(slots[i].v_format) > bits) {
          lp->requant.push_back({i, kernels::KvKind::kValue, cold.format});
        }
      }
    }
  }

  // RequantizeReference's choice by radix select: the `take` smallest keys
  // are the coldest blocks (selected as the largest complements).
  void Requantize(const SessionView& view, int l, LayerWork* w, LayerPlan* lp) const {
    const size_t take = ColdBlocks(view, l, *lp, w);
    if (take == 0) return;
    std::vector<uint64_t>& cold = w->keys;
    cold.resize(w->blocks.size());
    for (size_t c = 0; c < cold.size(); ++c) {
      cold[c] = ~RankKey(0, w->blocks[c].score, w->blocks[c].index);
    }
    SelectLargest(absl::MakeSpan(cold), take, &w->key_scratch);
    std::vector<uint32_t>& picked = w->picked;
    picked.resize(take);
    for (size_t c = 0; c < take; ++c) picked[c] = RankKeyIndex(~cold[c]);
    std::sort(picked.begin(), picked.end());
    EmitColdBlocks(view, l, *w, picked, lp);
  }

  // The coldest candidate blocks by a full sort (Better reversed).
  void RequantizeReference(const SessionView& view, int l, LayerWork& w, LayerPlan* lp) const {
    const size_t take = ColdBlocks(view, l, *lp, &w);
    if (take == 0) return;
    std::vector<Ranked> cold = w.blocks;
    std::sort(cold.begin(), cold.end(),
              [](const Ranked& a, const Ranked& b) { return Better(b, a); });
    std::vector<uint32_t> picked;
    for (size_t c = 0; c < take; ++c) picked.push_back(cold[c].index);
    std::sort(picked.begin(), picked.end());
    EmitColdBlocks(view, l, w, picked, lp);
  }

  // Constant after construction.
  const Config cfg_;
  const bool reference_;
};

}  // namespace

absl::StatusOr<PolicyParams> ParseParams(std::string_view text) {
  PolicyParams out;
  for (absl::string_view item :
       absl::StrSplit(absl::string_view(text.data(), text.size()), ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", item, "' is not key=value"));
    }
    out[std::string(absl::StripAsciiWhitespace(item.substr(0, eq)))] =
        std::string(absl::StripAsciiWhitespace(item.substr(eq + 1)));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view spec,
                                                   const PolicyParams& params) {
  auto cfg = Resolve(spec, params);
  if (!cfg.ok()) return cfg.status();
  return std::unique_ptr<Policy>(new CompositePolicy(*std::move(cfg), /*reference=*/false));
}

namespace {

// MakePolicyFromText's syntax: "spec" or "spec{k=v,...}".
absl::StatusOr<std::pair<std::string_view, PolicyParams>> SplitPolicyText(std::string_view text) {
  const size_t brace = text.find('{');
  if (brace == std::string_view::npos) return std::pair{text, PolicyParams{}};
  if (text.back() != '}') return absl::InvalidArgumentError("missing closing '}'");
  auto params = ParseParams(text.substr(brace + 1, text.size() - brace - 2));
  if (!params.ok()) return params.status();
  return std::pair{text.substr(0, brace), *std::move(params)};
}

absl::Status NamingText(std::string_view text, const absl::Status& st) {
  return absl::InvalidArgumentError(
      absl::StrCat("policy '", std::string(text), "': ", st.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Policy>> MakePolicyFromText(std::string_view text) {
  auto split = SplitPolicyText(text);
  if (!split.ok()) return NamingText(text, split.status());
  auto p = MakePolicy(split->first, split->second);
  if (p.ok()) return p;
  return NamingText(text, p.status());
}

absl::StatusOr<std::string> WithParams(std::string_view text, const PolicyParams& overrides) {
  auto split = SplitPolicyText(text);
  if (!split.ok()) return NamingText(text, split.status());
  PolicyParams params = std::move(split->second);
  for (const auto& [k, v] : overrides) params[k] = v;
  std::string out(split->first);
  if (params.empty()) return out;
  out += '{';
  for (const auto& [k, v] : params) absl::StrAppend(&out, out.back() == '{' ? "" : ",", k, "=", v);
  out += '}';
  return out;
}

absl::StatusOr<std::unique_ptr<Policy>> MakeReferencePolicy(std::string_view spec,
                                                            const PolicyParams& params) {
  auto cfg = Resolve(spec, params);
  if (!cfg.ok()) return cfg.status();
  return std::unique_ptr<Policy>(new CompositePolicy(*std::move(cfg), /*reference=*/true));
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> out;
  for (const Preset& p : kPresets) out.emplace_back(p.name);
  return out;
}

absl::StatusOr<std::vector<ParamDoc>> DescribeParams(std::string_view spec) {
  auto cfg = Resolve(spec, {});
  if (!cfg.ok()) return cfg.status();
  std::vector<ParamDoc> out;
  for (const ParamDef& d : kParams) {
    auto it = cfg->values.find(d.key);
    if (it != cfg->values.end()) out.push_back({d.key, it->second, d.doc});
  }
  return out;
}

}  // namespace polykv::policies
