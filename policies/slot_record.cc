#include "policies/slot_record.h"

#include <algorithm>
#include <cmath>

namespace polykv::policies {

namespace {
constexpr ScoreStream kAttn = ScoreStream::kAttention, kIntent = ScoreStream::kIntent,
                      kImportance = ScoreStream::kImportance, kObs = ScoreStream::kObservation;
}  // namespace

SlotScores ScoresOf(const Slot& s) {
  SlotScores o;
  o[kAttn] = s.attn;
  o[kIntent] = s.intent;
  o[kImportance] = s.importance;
  o[kObs] = s.obs;
  return o;
}

void SetScores(Slot& s, const SlotScores& o) {
  s.attn = o[kAttn];
  s.intent = o[kIntent];
  s.importance = o[kImportance];
  s.obs = o[kObs];
}

SlotScores AbsentValues(std::span<const SlotRecord> records) {
  SlotScores absent;
  for (int i = 0; i < kNumSlotStreams; ++i) {
    const auto s = static_cast<ScoreStream>(i);
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
  for (int i = 0; i < kNumSlotStreams; ++i) {
    const auto s = static_cast<ScoreStream>(i);
    o[s] = std::isnan(r[s]) ? absent[s] : r[s];
  }
  return o;
}

}  // namespace polykv::policies
