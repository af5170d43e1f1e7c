// Score streams: what a worker measures of a session and reports to the daemon
// for its policy to rank by. One table says, per stream, how a report folds
// into what the daemon holds, how a merge group (or the layers of a session
// that keeps one record per slot) combines, and what a slot no report reached
// ranks as. Every report path (wire, client, C ABI, Python, the daemon's
// records, the offline replay) goes through these rules; adding a stream is
// an entry here, where the worker measures it, and where a policy reads it.
//
// Plain data and constexpr functions; thread-safe.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

namespace polykv::policies {

// Wire-stable values: the proto's ScoreStream is this value + 1.
enum class ScoreStream : uint8_t {
  // Per slot. Attention mass summed over layers, query heads and the queries
  // of decode steps and prefill chunks since the last report (H2O).
  kAttention = 0,
  // Per slot. Relevance to the current turn's intent: the attention the
  // worker's intent probe paid the slot (IntentKV); any sign.
  kIntent = 1,
  // Per slot, or per layer and slot. Query-agnostic importance: the most a
  // context-reconstruction probe's query paid the slot (KVzip).
  kImportance = 2,
  // Per slot. Attention from the observation window at the end of the latest
  // user or tool message, summed over its queries (SnapKV).
  kObservation = 3,
  // Per layer. Mean entropy (nats) of the layer's decode attention, over
  // query-head groups and decode steps since the last report (IntentKV's
  // entropy-calibrated layer budgets).
  kEntropy = 4,
};
inline constexpr int kNumScoreStreams = 5;

// How a reported value folds into what is held.
enum class OnReport : uint8_t {
  kAdd,      // accumulates (mass since the last report)
  kReplace,  // the latest probe's value replaces the last
  kKeepMax,  // the most any probe ever gave
};
// How values of one stream combine into one: the members of a merge group,
// or the layers of a per-layer report where the daemon keeps one record for
// all layers.
enum class OnCombine : uint8_t {
  kSum,  // mass: a group got what its members got
  kMax,  // relevance: a group matters as much as its most relevant member
};
// What a slot no report reached (a newer slot than the last probe) ranks as.
enum class WhenAbsent : uint8_t {
  kZero,  // got no mass
  kMost,  // as the highest value any slot of its layer has (it is the newest)
};

struct ScoreStreamRule {
  std::string_view name;  // wire-stable: CLI, JSON, Python
  bool per_layer;         // one value per layer, not per slot
  OnReport on_report;
  OnCombine on_combine;
  WhenAbsent when_absent;
  bool signed_values;  // may be negative (else >= 0); always finite
};

// Indexed by ScoreStream.
inline constexpr std::array<ScoreStreamRule, kNumScoreStreams> kScoreStreamRules{{
    {"attention", false, OnReport::kAdd, OnCombine::kSum, WhenAbsent::kZero, false},
    {"intent", false, OnReport::kReplace, OnCombine::kMax, WhenAbsent::kMost, true},
    {"importance", false, OnReport::kKeepMax, OnCombine::kMax, WhenAbsent::kMost, false},
    {"observation", false, OnReport::kReplace, OnCombine::kSum, WhenAbsent::kMost, false},
    {"entropy", true, OnReport::kReplace, OnCombine::kMax, WhenAbsent::kMost, false},
}};

constexpr const ScoreStreamRule& RuleOf(ScoreStream s) {
  return kScoreStreamRules[static_cast<size_t>(s)];
}
// s's index among the streams of its shape (per slot or per layer): where
// SlotScores or LayerScores hold its value.
constexpr size_t ShapeIndex(ScoreStream s) {
  size_t i = 0;
  for (size_t o = 0; o < static_cast<size_t>(s); ++o) {
    i += kScoreStreamRules[o].per_layer == RuleOf(s).per_layer;
  }
  return i;
}
constexpr int CountStreams(bool per_layer) {
  int n = 0;
  for (const ScoreStreamRule& r : kScoreStreamRules) n += r.per_layer == per_layer;
  return n;
}
inline constexpr int kNumSlotStreams = CountStreams(false);
inline constexpr int kNumLayerStreams = CountStreams(true);
constexpr std::string_view ScoreStreamName(ScoreStream s) { return RuleOf(s).name; }
std::optional<ScoreStream> ParseScoreStream(std::string_view name);
// The proto's ScoreStream value of `s` (the wire's 0 is UNSPECIFIED), and
// back: nullopt for a value no stream has (unset, or a newer peer's).
constexpr int WireValue(ScoreStream s) { return static_cast<int>(s) + 1; }
constexpr std::optional<ScoreStream> FromWireValue(int v) {
  if (v < 1 || v > kNumScoreStreams) return std::nullopt;
  return static_cast<ScoreStream>(v - 1);
}
// Every stream, in enum order.
constexpr std::array<ScoreStream, kNumScoreStreams> AllScoreStreams() {
  std::array<ScoreStream, kNumScoreStreams> all{};
  for (int i = 0; i < kNumScoreStreams; ++i) all[size_t(i)] = static_cast<ScoreStream>(i);
  return all;
}

// A held value that no report has reached yet.
inline constexpr float kUnreported = std::numeric_limits<float>::quiet_NaN();

// `a` and `b` combined by `rule`, where an unreported value (NaN) gives way
// to a reported one and two unreported stay unreported.
inline float Combine(OnCombine rule, float a, float b) {
  if (std::isnan(a)) return b;
  if (std::isnan(b)) return a;
  return rule == OnCombine::kSum ? a + b : std::max(a, b);
}
// What is held after `reported` folds into `held` by `s`'s rule.
inline float FoldReport(ScoreStream s, float held, float reported) {
  switch (RuleOf(s).on_report) {
    case OnReport::kAdd: return std::isnan(held) ? reported : held + reported;
    case OnReport::kReplace: return reported;
    case OnReport::kKeepMax: return Combine(OnCombine::kMax, held, reported);
  }
  return reported;
}
// Whether `v` may be reported for `s`: finite, and >= 0 unless signed.
inline bool ValidScore(ScoreStream s, float v) {
  return std::isfinite(v) && (RuleOf(s).signed_values || v >= 0.f);
}

// A value per stream of one shape: what is held of one slot (SlotScores) or
// of one layer (LayerScores), indexed by the stream.
template <bool kPerLayer>
struct StreamValues {
  static constexpr int kSize = kPerLayer ? kNumLayerStreams : kNumSlotStreams;
  std::array<float, kSize> v;
  // Each value unreported (NaN), except where absent means zero: what the
  // daemon holds before any report reaches it.
  StreamValues() {
    for (ScoreStream s : AllScoreStreams()) {
      if (RuleOf(s).per_layer != kPerLayer) continue;
      (*this)[s] = RuleOf(s).when_absent == WhenAbsent::kZero ? 0.f : kUnreported;
    }
  }
  // Every value 0 (a policy's view, where nothing is unreported).
  static StreamValues Zero() {
    StreamValues o;
    o.v.fill(0.f);
    return o;
  }
  // REQUIRES: s has this shape (RuleOf(s).per_layer == kPerLayer).
  float& operator[](ScoreStream s) { return v[ShapeIndex(s)]; }
  float operator[](ScoreStream s) const { return v[ShapeIndex(s)]; }
  // Folds a merge group member's (or a layer's) values in, by each
  // stream's OnCombine.
  void CombineWith(const StreamValues& o) {
    for (ScoreStream s : AllScoreStreams()) {
      if (RuleOf(s).per_layer == kPerLayer) {
        (*this)[s] = Combine(RuleOf(s).on_combine, (*this)[s], o[s]);
      }
    }
  }
};
// What is held of one slot: a value per slot stream.
using SlotScores = StreamValues<false>;
// What is held of one layer: a value per per-layer stream.
using LayerScores = StreamValues<true>;

// A set of streams (what a policy reads, what the daemon asks a worker for).
class StreamSet {
 public:
  constexpr StreamSet() = default;
  constexpr StreamSet(std::initializer_list<ScoreStream> streams) {
    for (ScoreStream s : streams) add(s);
  }
  constexpr void add(ScoreStream s) { bits_ |= 1u << static_cast<unsigned>(s); }
  constexpr bool has(ScoreStream s) const { return (bits_ >> static_cast<unsigned>(s)) & 1u; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr bool operator==(const StreamSet&) const = default;

 private:
  uint32_t bits_ = 0;
};

// One stream's values in a report (ReportSlots): a slot stream's for the n
// slots from the report's first slot, [n], or [num_layers x n] layer-major
// when per_layer; a per-layer stream's [num_layers].
struct ScoreValues {
  ScoreStream stream = ScoreStream::kAttention;
  bool per_layer = false;
  std::vector<float> values;
};

// What the daemon asks a session's worker to report (OpenSession and Sync):
// the streams the agent's policy reads, and whether slot streams go per
// layer (a policy that selects per layer keeps each layer's records apart).
struct WantedStreams {
  StreamSet streams;
  bool per_layer = false;
  // Policy::AttentionDecay: per token, what the attention stream holds ages
  // by this factor. A worker applies it to the mass it has not reported yet
  // (each step ages what came before it), the daemon to what it holds (at
  // each report, by the tokens committed since the last), so the two
  // together hold the decayed H2O score whatever the report interval.
  float attention_decay = 1.f;
  bool has(ScoreStream s) const { return streams.has(s); }
  bool operator==(const WantedStreams&) const = default;
};

}  // namespace polykv::policies
