#include "policies/slot_record.h"

#include <algorithm>
#include <cmath>

namespace polykv::policies {

SlotScores AbsentValues(std::span<const SlotRecord> records) {
  SlotScores absent;
  for (ScoreStream s : AllScoreStreams()) {
    if (RuleOf(s).per_layer) continue;
    float most = kUnreported;
    if (RuleOf(s).when_absent == WhenAbsent::kMost) {
      for (const SlotRecord& r : records) most = Combine(OnCombine::kMax, most, r.score[s]);
    }
    absent[s] = std::isnan(most) ? 0.f : most;
  }
  return absent;
}

SlotScores Resolved(const SlotScores& r, const SlotScores& absent) {
  SlotScores o;
  for (size_t i = 0; i < o.v.size(); ++i) o.v[i] = std::isnan(r.v[i]) ? absent.v[i] : r.v[i];
  return o;
}

}  // namespace polykv::policies
