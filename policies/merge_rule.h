// How a merge group's output slot scores from its members' scores: the one
// rule for the daemon's slot records (daemon/compaction/executor.cc) and the
// views the offline replay plans over (ApplyPlan). Attention and observation
// mass add up; intent and importance are the most of any member's (a group
// matters as much as its most relevant member); the slot is pinned if any
// member is. NaN means "not reported": it is skipped, and a score stays NaN
// only when no member reported it.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

namespace polykv::policies {

// The larger of two scores where NaN means "not reported yet": a known value
// beats an unknown one.
inline float MaxKnown(float a, float b) {
  return std::isnan(a) ? b : std::isnan(b) ? a : std::max(a, b);
}
// Their sum, with the same rule.
inline float SumKnown(float a, float b) { return std::isnan(a) ? b : std::isnan(b) ? a : a + b; }

struct GroupScores {
  static constexpr float kUnknown = std::numeric_limits<float>::quiet_NaN();
  float attn = 0.f;
  float obs = kUnknown;
  float intent = kUnknown;
  float importance = kUnknown;
  bool pinned = false;

  void Add(float m_attn, float m_obs, float m_intent, float m_importance, bool m_pinned) {
    attn = SumKnown(attn, m_attn);
    obs = SumKnown(obs, m_obs);
    intent = MaxKnown(intent, m_intent);
    importance = MaxKnown(importance, m_importance);
    pinned |= m_pinned;
  }
};

}  // namespace polykv::policies
