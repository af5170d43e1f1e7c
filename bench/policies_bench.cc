// polykv-bench policies: decision time per compaction step, per policy, at
// 1K / 8K / 32K cached tokens; the online H2O update per decode step; and the
// attention error of merged caches with and without the log-count bias.
//
//   polykv-bench policies --json [--layers 8] [--tokens 1024,8192,32768] [--min-ms 200]
//
// A "step" is one Policy::Decide over all layers of a synthetic agent session
// (policies/synthetic.h: key summaries of 16 dims, one view per size, seed 1)
// at two operating points: "trigger" (the cache just reached 110% of budget,
// the compaction the daemon runs routinely) and "quarter" (budget = 25%).
// Per point: the median decision (`*_ms`, buffers warm), the first decision
// of that policy on that view (`*_first_ms`, one sample), and at trigger
// `amortized_us_per_step`: the median decision over the decode steps between
// two trigger decisions (a compaction to budget B fires again at 1.1 B, so
// after B / 10 steps).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_json.h"
#include "bench/bench_registry.h"
#include "policies/decay.h"
#include "policies/merge.h"
#include "policies/plan.h"
#include "policies/policy.h"
#include "policies/synthetic.h"
#include "policies/tagger.h"

namespace polykv::policies {
namespace {

using Clock = std::chrono::steady_clock;

// Median seconds of fn over >= 3 runs and >= min_ms total.
template <typename Fn>
double Time(Fn fn, double min_ms) {
  std::vector<double> t;
  const auto start = Clock::now();
  while (t.size() < 3 ||
         std::chrono::duration<double, std::milli>(Clock::now() - start).count() < min_ms) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    if (t.size() >= 200) break;
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct MergeError {
  double with_bias = 0, without_bias = 0;
  int64_t slots_before = 0, slots_after = 0;
};

// Relative L2 error of attention outputs (random queries) between the full
// cache and the merged one, with and without the log(count) logit bias.
MergeError MeasureMergeBias(int tokens, uint64_t seed) {
  SyntheticOptions o;
  o.seed = seed;
  o.num_layers = 1;
  o.num_tokens = tokens;
  o.key_dim = 16;
  const SessionView v = MakeSyntheticView(o);
  const int d = v.key_dim;
  const size_t n = v.layers[0].slots.size();
  // Keys: the summaries scaled to make attention peaky; values: a per-block
  // centre plus noise, so merged values stay meaningful.
  SplitMix rng(seed + 11);
  std::vector<float> keys(v.layers[0].keys), values(n * d);
  for (float& k : keys) k *= 1.5f;
  std::vector<float> centre(d);
  uint32_t block = ~0u;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = v.tokens[v.layers[0].slots[i].token].tag.block_id;
    if (b != block) {
      block = b;
      for (float& c : centre) c = static_cast<float>(rng.Normal());
    }
    for (int j = 0; j < d; ++j)
      values[i * d + j] = centre[j] + 0.3f * static_cast<float>(rng.Normal());
  }
  auto policy = MakePolicy("merge", {{"window.size", "0"}, {"sinks.count", "0"}});
  auto plan = (*policy)->Decide(v, Budget::TokensPerLayer(1, static_cast<int64_t>(n / 2)));
  if (!plan.ok()) return {};
  const LayerPlan& lp = plan->layers[0];
  std::vector<float> mk, mv;
  std::vector<uint32_t> counts;
  size_t k = 0, g = 0;
  while (k < lp.keep.size() || g < lp.merges.size()) {
    if (g == lp.merges.size() || (k < lp.keep.size() && lp.keep[k] < lp.merges[g].representative)) {
      const uint32_t i = lp.keep[k++];
      mk.insert(mk.end(), keys.begin() + i * d, keys.begin() + (i + 1) * d);
      mv.insert(mv.end(), values.begin() + i * d, values.begin() + (i + 1) * d);
      counts.push_back(v.layers[0].slots[i].count);
    } else {
      const MergeGroup& mg = lp.merges[g++];
      std::vector<float> kk(d, 0.f), vv(d, 0.f);
      for (size_t m = 0; m < mg.members.size(); ++m) {
        for (int j = 0; j < d; ++j) {
          kk[j] += mg.weights[m] * keys[mg.members[m] * d + j];
          vv[j] += mg.weights[m] * values[mg.members[m] * d + j];
        }
      }
      mk.insert(mk.end(), kk.begin(), kk.end());
      mv.insert(mv.end(), vv.begin(), vv.end());
      counts.push_back(mg.count);
    }
  }
  std::vector<uint32_t> ones(n);
  for (size_t i = 0; i < n; ++i) ones[i] = v.layers[0].slots[i].count;
  MergeError e;
  e.slots_before = static_cast<int64_t>(n);
  e.slots_after = static_cast<int64_t>(counts.size());
  double num_with = 0, num_without = 0, den = 0;
  std::vector<float> q(d), full(d), with(d), without(d);
  for (int t = 0; t < 64; ++t) {
    // Queries near a random cached key: attention focused like a real head's.
    const size_t at = static_cast<size_t>(rng.Next() % n);
    for (int j = 0; j < d; ++j) q[j] = keys[at * d + j] + 0.5f * static_cast<float>(rng.Normal());
    AttendRef(q, keys, values, ones, d, true, absl::MakeSpan(full));
    AttendRef(q, mk, mv, counts, d, true, absl::MakeSpan(with));
    AttendRef(q, mk, mv, counts, d, false, absl::MakeSpan(without));
    for (int j = 0; j < d; ++j) {
      den += double(full[j]) * full[j];
      num_with += double(with[j] - full[j]) * (with[j] - full[j]);
      num_without += double(without[j] - full[j]) * (without[j] - full[j]);
    }
  }
  e.with_bias = std::sqrt(num_with / den);
  e.without_bias = std::sqrt(num_without / den);
  return e;
}

// Tagger throughput: ns per token over an agent-like mix of prose, fenced
// code, tool calls and tool output, in tokenizer-like pieces.
double TaggerNsPerToken(size_t* tokens_out) {
  static const char* kMessage =
      "Let me fix the parser.\n```python\nimport os\n\nclass Parser:\n"
      "    def parse(self, text: str) -> list:\n        \"\"\"Split lines.\"\"\"\n"
      "        out = []\n        for line in text.splitlines():\n"
      "            out.append(line.strip())\n        return out\n```\n"
      "<tool_call>\n{\"name\": \"run\", \"arguments\": {\"cmd\": \"pytest -q\"}}\n</tool_call>\n";
  static const char* kOutput =
      "#include <stdio.h>\nstatic int add(int a, int b) {\n    return a + b;\n}\n"
      "Traceback (most recent call last):\n  File \"x.py\", line 3\nValueError: bad\n\n";
  std::vector<std::pair<std::string, Role>> pieces;
  for (int rep = 0; rep < 200; ++rep) {
    for (auto [text, role] :
         {std::pair{kMessage, Role::kAssistant}, std::pair{kOutput, Role::kToolOutput}}) {
      std::string t(text);
      for (size_t i = 0; i < t.size();) {
        size_t j = i + 1;
        while (j < t.size() && j - i < 4 && std::isalnum(static_cast<unsigned char>(t[j]))) ++j;
        pieces.push_back({t.substr(i, j - i), role});
        i = j;
      }
    }
  }
  *tokens_out = pieces.size();
  const double s = Time(
      [&] {
        StructureTagger tagger;
        for (const auto& [p, role] : pieces) tagger.Feed(p, role);
        tagger.EndMessage();
      },
      100);
  return 1e9 * s / static_cast<double>(pieces.size());
}

int Main(int argc, char** argv) {
  bool json = false;
  int layers = 8;
  double min_ms = 200;
  std::vector<int> sizes = {1024, 8192, 32768};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "--layers") && i + 1 < argc) {
      layers = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--min-ms") && i + 1 < argc) {
      min_ms = std::atof(argv[++i]);
    } else if (!std::strcmp(argv[i], "--tokens") && i + 1 < argc) {
      sizes.clear();
      for (char* p = argv[++i]; *p;) {
        sizes.push_back(static_cast<int>(std::strtol(p, &p, 10)));
        if (*p == ',') ++p;
      }
    } else {
      std::fprintf(stderr,
                   "usage: polykv-bench policies [--json] [--layers N] [--tokens 1024,8192,32768] "
                   "[--min-ms MS]\n");
      return std::strcmp(argv[i], "--help") ? 2 : 0;
    }
  }
  std::vector<std::string> specs = PresetNames();
  specs.erase(std::remove(specs.begin(), specs.end(), "full"), specs.end());
  specs.insert(specs.begin(), "full");
  specs.push_back("sinks+structural+intent");
  using bench::Round;
  bench::Json out = {{"bench", "policies"},
                     {"layers", layers},
                     {"key_dim", 16},
                     {"unit", "ms per step (all layers)"},
                     {"decide", bench::Json::array()},
                     {"h2o_update", bench::Json::array()}};
  for (int n : sizes) {
    SyntheticOptions o;
    o.num_layers = layers;
    o.num_tokens = n;
    o.key_dim = 16;
    const SessionView view = MakeSyntheticView(o);
    for (const std::string& spec : specs) {
      auto policy = MakePolicy(spec);
      if (!policy.ok()) return 1;
      double ms[2] = {0, 0}, first_ms[2] = {0, 0};
      int64_t merges[2] = {0, 0};
      const int64_t budgets[2] = {static_cast<int64_t>(std::floor(n / 1.1)), n / 4};
      for (int b = 0; b < 2; ++b) {
        const Budget budget = Budget::TokensPerLayer(layers, spec == "full" ? n : budgets[b]);
        const auto t0 = Clock::now();
        auto probe = (*policy)->Decide(view, budget);
        first_ms[b] = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (!probe.ok()) {
          std::fprintf(stderr, "%s: %s\n", spec.c_str(),
                       std::string(probe.status().message()).c_str());
          return 1;
        }
        for (const LayerPlan& lp : probe->layers)
          merges[b] += static_cast<int64_t>(lp.merges.size());
        ms[b] = 1e3 * Time([&] { (void)(*policy)->Decide(view, budget); }, min_ms);
      }
      const double steps = std::max<double>(1.0, std::floor(budgets[0] / 10.0));
      const double amortized_us = 1e3 * ms[0] / steps;
      std::fprintf(stderr,
                   "%-26s %6d tokens: trigger %8.3f ms (first %8.3f, %7.3f us/step)  quarter "
                   "%8.3f ms (first %8.3f)\n",
                   spec.c_str(), n, ms[0], first_ms[0], amortized_us, ms[1], first_ms[1]);
      out["decide"].push_back({{"policy", spec},
                               {"tokens", n},
                               {"trigger_ms", Round(ms[0], 4)},
                               {"trigger_first_ms", Round(first_ms[0], 4)},
                               {"amortized_us_per_step", Round(amortized_us, 4)},
                               {"quarter_ms", Round(ms[1], 4)},
                               {"quarter_first_ms", Round(first_ms[1], 4)},
                               {"trigger_merge_groups", merges[0]},
                               {"quarter_merge_groups", merges[1]}});
    }
  }
  for (int n : sizes) {
    DecayAccumulator acc(0.99f);
    acc.Append(n);
    std::vector<float> w(n, 1.f / n);
    std::vector<uint32_t> idx(64);
    std::vector<float> wk(64, 1.f / 64);
    for (int i = 0; i < 64; ++i) idx[i] = static_cast<uint32_t>((i * 7919) % n);
    const double dense = 1e6 * Time([&] { acc.Step(w); }, min_ms / 4);
    const double sparse = 1e6 * Time([&] { acc.StepSparse(idx, wk); }, min_ms / 4);
    std::fprintf(stderr, "h2o update %6d tokens: dense %.2f us  top-64 %.3f us per layer\n", n,
                 dense, sparse);
    out["h2o_update"].push_back({{"tokens", n},
                                 {"dense_us_per_layer", Round(dense, 3)},
                                 {"top64_us_per_layer", Round(sparse, 4)}});
  }
  const MergeError me = MeasureMergeBias(4096, 1);
  out["merge_bias"] = {{"tokens", me.slots_before},
                       {"slots_after", me.slots_after},
                       {"rel_l2_error_with_bias", Round(me.with_bias, 5)},
                       {"rel_l2_error_without_bias", Round(me.without_bias, 5)}};
  std::fprintf(stderr, "merge bias: rel L2 error with %.5f, without %.5f\n", me.with_bias,
               me.without_bias);
  size_t tagged = 0;
  const double tag_ns = TaggerNsPerToken(&tagged);
  out["tagger"] = {{"tokens", tagged}, {"ns_per_token", Round(tag_ns, 1)}};
  std::fprintf(stderr, "tagger: %.1f ns per token (%zu tokens)\n", tag_ns, tagged);
  if (json) bench::PrintJson(out);
  return 0;
}

}  // namespace
}  // namespace polykv::policies

POLYKV_BENCH(policies, "policy decision time per step (1K/8K/32K tokens), H2O update, merge bias",
             [](int argc, char** argv) -> int { return polykv::policies::Main(argc, argv); });
