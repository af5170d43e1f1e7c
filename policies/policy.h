// Policy: scores + budget in, plan out. Pure decision code.
//
// Every policy is a Composite of components joined by '+' in a spec string,
// e.g. "sinks+structural+intent". Components contribute in one declared way:
//
//   * protection tiers — sinks and pinned tokens are hard-protected (tier 3:
//     never evicted; a budget too small for them is RESOURCE_EXHAUSTED), the
//     recent window is tier 2, anchors (system prompt, first user instruction;
//     the "protected base scores" of the compaction study) tier 1;
//   * scores — each scoring component writes a raw score per slot, min-max
//     normalised per layer to [0, 1] and added with weight `<name>.weight`.
//
// Slots are ranked by (tier desc, score desc, position desc, index asc) — a
// strict total order, so every decision is deterministic. The selection mode
// (selective / merge / hybrid) then keeps, merges and evicts. A composite with
// no scoring component (window, sinks+window) keeps only protected slots.
//
// Named presets expand to a composite plus parameter defaults:
//   full, window, streaming, h2o, snapkv, hybrid, merge, structural, intent.
// See docs/policies.md for every parameter and where its default comes from.
//
// Thread-safety: a Policy is immutable after MakePolicy; all methods are const
// and may be called concurrently. Online state (H2O decay accumulation) lives
// with the caller (policies/decay.h). Decide's scratch buffers are per thread
// (thread_local, sized by the largest layer that thread decided), so a warm
// decision allocates only the Plan it returns.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "policies/layer_budget.h"
#include "policies/plan.h"
#include "policies/score_stream.h"
#include "policies/session_view.h"

namespace polykv::policies {

// "key" -> "value", e.g. {"window.size", "1024"}, {"mode", "hybrid"}.
using PolicyParams = std::map<std::string, std::string, std::less<>>;

// Parses "a=1,b=x" (whitespace around items ignored). Empty text = no params.
absl::StatusOr<PolicyParams> ParseParams(std::string_view text);

// Protection classes, for checks and reports (bit flags).
enum ProtectClass : uint8_t {
  kProtectSink = 1,
  kProtectPinned = 2,
  kProtectWindow = 4,
  kProtectSystem = 8,      // anchors: system prompt
  kProtectFirstUser = 16,  // anchors: first user instruction
};

class Policy {
 public:
  virtual ~Policy() = default;

  // Canonical spec: components and every parameter value, e.g.
  // "sinks+window+h2o{mode=selective,sinks.count=4,...}". Two policies with
  // the same spec make the same plans.
  virtual const std::string& spec() const = 0;

  // True when its plans depend on LayerView::keys (merging clusters by key
  // similarity), so a caller that must fetch keys (the daemon reads them from
  // its pages) knows it has to. Without keys such a policy evicts instead.
  virtual bool ReadsKeys() const { return false; }

  // The score streams its plans rank by (score_stream.h): the one place a
  // policy says what a worker must measure, which the daemon passes on to the
  // worker (OpenSession and Sync) so that it measures nothing else.
  virtual StreamSet Reads() const { return {}; }
  // Whether a caller that keeps one slot list for all layers (the daemon,
  // until the policy asks otherwise) should give each layer its own: then
  // each layer keeps its own slots by its own importance (parameter
  // select=layer). Such a policy ranks by nothing but per-layer importance,
  // positions and structure (no attention stream a worker sums over layers).
  virtual bool SelectsPerLayer() const { return false; }
  // How the attention stream's held mass ages (parameter h2o.decay, H2O with
  // decay as the compaction study has it): per token committed, what is held
  // is multiplied by this, so attention paid long ago counts less than
  // attention paid now. 1: a plain sum (the undecayed H2O score).
  virtual double AttentionDecay() const { return 1.0; }
  // Its layer allocator (parameter layers=): how a total budget is split over
  // layers. A caller that keeps one slot list for all layers (the daemon)
  // says where that makes the policy act layer-uniform (PolicyNote).
  virtual LayerAllocator Layers() const { return LayerAllocator::kUniform; }

  // Plans one compaction of `view` down to `budget`.
  // REQUIRES: nothing; bad input returns InvalidArgument.
  // Returns ResourceExhausted when hard-protected slots alone exceed a layer's
  // budget (or, for "full", when the view exceeds it). The plan is checked by
  // ValidatePlan (with HardProtected as must_keep) before it is returned;
  // a violation there is Internal (a bug).
  virtual absl::StatusOr<Plan> Decide(const SessionView& view, const Budget& budget) const = 0;

  // True when some layer holds more than trigger x its budget (parameter
  // `trigger`, default 1.10 — compact at 110% of budget, then down to 100%),
  // so compaction runs in batches rather than on every token.
  virtual bool NeedsCompaction(const SessionView& view, const Budget& budget) const = 0;
  // That trigger ratio, for a caller that counts a session's tokens itself
  // (the daemon's compaction trigger) instead of building a view.
  virtual double Trigger() const { return 1.10; }

  // Per-layer token budgets this policy plans for (its layer allocator applied
  // to a total budget; bytes converted to tokens).
  virtual absl::StatusOr<std::vector<int64_t>> LayerBudgets(const SessionView& view,
                                                            const Budget& budget) const = 0;

  // Per layer, per slot: the ProtectClass bits this policy gives the slot for
  // the given layer budgets. Hard classes (sink, pinned) are never evicted;
  // the others win ties against unprotected slots (see file comment).
  virtual std::vector<std::vector<uint8_t>> ProtectClasses(
      const SessionView& view, const std::vector<int64_t>& layer_budgets) const = 0;
};

// Builds a policy from a preset name or a '+'-joined component list, with
// parameter overrides. Unknown names or parameters are InvalidArgument.
absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view spec,
                                                   const PolicyParams& params = {});

// A policy as configs and command lines name it: a spec, optionally followed
// by parameter overrides in braces, e.g. "h2o" or
// "hybrid{cold.format=int4,cold.fraction=0.5}" (the syntax of the daemon's
// policy names; the evaluation's cache configs use it). InvalidArgument naming the
// text when it is malformed or MakePolicy refuses it.
absl::StatusOr<std::unique_ptr<Policy>> MakePolicyFromText(std::string_view text);

// `text` (MakePolicyFromText's syntax) with `overrides` set, parameters in
// key order: WithParams("h2o{window.size=64}", {{"cold.format", "int4"}}) is
// "h2o{cold.format=int4,window.size=64}". INVALID_ARGUMENT naming the text
// when it is malformed; the result is not checked against MakePolicy.
absl::StatusOr<std::string> WithParams(std::string_view text, const PolicyParams& overrides);

// The same policy ranked by the original code: full sorts over Ranked
// structs (ranking.h's Better), a GlobalPool or nth_element for the selective
// mode, ClusterByKey's vector-per-group clustering, no per-decision caches.
// MakePolicy's policies rank with packed integer keys, radix selection and
// reused buffers instead, and must make exactly the plans this one makes; it
// is kept as their reference (tests/unit/policies/policy_fast_path_test.cc).
absl::StatusOr<std::unique_ptr<Policy>> MakeReferencePolicy(std::string_view spec,
                                                            const PolicyParams& params = {});

// Preset names, in documentation order.
std::vector<std::string> PresetNames();

// Documentation of one parameter (for --help output and docs/policies.md).
struct ParamDoc {
  std::string key;
  std::string default_value;
  std::string doc;
};
// Every parameter a composite may take (component parameters appear only when
// the component is named). For a preset, defaults include its overrides.
absl::StatusOr<std::vector<ParamDoc>> DescribeParams(std::string_view spec);

}  // namespace polykv::policies
