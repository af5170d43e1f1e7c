// SlotRecord: what the daemon holds of one committed slot of a session
// between compactions, and the one rule by which a merge group's output slot
// gets its record from its members' (the daemon's compaction and the offline
// replay's ApplyPlan both call it).
#pragma once

#include <cstdint>
#include <span>

#include "policies/score_stream.h"
#include "policies/session_view.h"

namespace polykv::policies {

struct SlotRecord {
  TokenMeta meta;      // of the slot's (representative) token
  uint32_t count = 1;  // tokens folded into this slot
  SlotScores score;    // the worker's reports (score_stream.h), unreported = NaN
};

// A merge group's scores and pin: each stream combined by its rule (mass adds
// up, relevance is the most of any member's), pinned if any member is.
struct GroupScores {
  SlotScores score;
  bool pinned = false;
  void Add(const SlotScores& member, bool member_pinned) {
    score.CombineWith(member);
    pinned |= member_pinned;
  }
};

// What an unreported value of each slot stream stands for among `records`
// (one layer's): 0 for a stream whose absence means zero, else the highest
// value any record reported (0 when none did), so that slots newer than the
// last probe rank with the most relevant, not below everything.
SlotScores AbsentValues(std::span<const SlotRecord> records);
// `r`'s scores with every unreported value replaced by `absent`'s.
SlotScores Resolved(const SlotScores& r, const SlotScores& absent);

}  // namespace polykv::policies
