// The pressure ladder's decision (docs/compaction.md), over plain data: which
// sessions to ask to compact, to how many tokens, and whether to start or
// stop refusing reservations. The pool gathers the candidates and applies
// the result under its lock; this file only decides.
//
// Thread-safety: stateless; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/page_format.h"
#include "policies/session_view.h"

namespace polykv::daemon {

// A session whose policy compacts and that is not already compacting.
struct LadderCandidate {
  uint64_t session_id = 0;
  int priority = 0;  // lower is asked first
  uint64_t bytes = 0;
  uint64_t committed_tokens = 0;
  uint32_t block_tokens = 16;
  uint64_t block_bytes = 0;
  uint64_t guaranteed_bytes = 0;  // its agent's guarantee (never compacted below)
  // Step 1: its full blocks outside the recent window whose values are finer
  // than the ladder's format, what requantizing one saves (their mean), and
  // the bytes of one requantized block (written before the old one is freed).
  uint64_t requant_blocks = 0;
  uint64_t requant_saving = 0;
  uint64_t requant_block_bytes = 0;
  uint64_t requant_room = 0;  // such blocks its tenant could allocate now
  // Its worker is idle (it calls nothing until its next Sync), for idle_ms
  // since its last call: steps 3 and 4 take it, when they are on.
  bool idle = false;
  int64_t idle_ms = 0;
  bool never_evict = false;  // its class is critical
};

struct LadderInputs {
  uint64_t free_bytes = 0;
  uint64_t low_watermark = 0;
  bool refusing = false;
  bool any_sessions = false;
  // Step 3: bytes the offload tiers can take (0: offload is off or full).
  uint64_t offload_room = 0;
  bool offload_on = false;
  // Step 4: idle sessions may be evicted (ladder_evict_idle).
  bool evict_idle = false;
};

struct LadderSteps {
  std::vector<std::pair<uint64_t, uint64_t>> requant;  // (session id, blocks)
  std::vector<std::pair<uint64_t, uint64_t>> compact;  // (session id, target tokens)
  std::vector<uint64_t> offload;  // idle sessions to offload now
  std::vector<uint64_t> evict;    // idle sessions to evict now
  bool refuse = false;  // refuse the lowest priority class present
  bool resume = false;  // stop refusing
};

// Below the watermark, two steps, each over the candidates by (priority asc,
// bytes desc), until the expected free bytes reach 2 x watermark:
//   1. requantize: candidates with requant_blocks are asked to requantize as
//      many of their coldest blocks as the watermark needs and fit in 90% of
//      the still free bytes and in requant_room (the new pages are written
//      before the old go);
//   2. compact: the others are asked to compact to max(guarantee, min(half
//      their tokens, what fits in 90% of the still free bytes)); candidates
//      at their floor (guarantee, or one block) are skipped.
//   3. offload: idle candidates, by (priority asc, longest idle first), as
//      many as the watermark needs and the offload tiers can take;
//   4. evict idle: with evict_idle, the idle candidates step 3 could not
//      take, in the same order, but never_evict ones.
// Idle candidates go to steps 3 and 4 only, when either is on (an idle
// session compacts nothing before its next Sync); else to steps 1 and 2
// like the others. With no candidate at all, refuse. At or above 2 x
// watermark: resume. A session asked to requantize is asked to compact in a
// later round if the pressure stays.
LadderSteps PlanLadder(std::vector<LadderCandidate> candidates, const LadderInputs& in);

// Step 1's requantization: values go to int4 (KIVI's and our K8V4's value
// format), or to the agent's value floor when that is finer; keys stay.
kernels::PageFormat LadderValueFormat(std::optional<kernels::PageFormat> value_floor);

// Recent slots step 1 leaves in the fill format (where the policy has a
// window component; its sinks, pins and anchors stay protected too).
inline constexpr int kLadderRequantWindow = 128;

// The cold step a requantization step plans with the agent's own policy
// (CompactionInputs::cold): values to `value_format`, keys kept, a fraction
// such that the `blocks` coldest full blocks it does not protect are taken
// (of `committed_tokens` slots in blocks of `block_tokens`; blocks already in
// that format count, as the cold step counts them) and, where the policy has
// a window, kLadderRequantWindow recent slots kept. Planned at a budget of
// all the session's slots, it evicts nothing (the cold step runs within
// budget, policies/composite.cc).
policies::ColdStep LadderColdStep(kernels::PageFormat value_format, uint64_t blocks,
                                  uint64_t committed_tokens, uint32_t block_tokens);

}  // namespace polykv::daemon
