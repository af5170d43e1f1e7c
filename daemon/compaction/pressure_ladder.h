// The pressure ladder's decision (docs/compaction.md), over plain data: which
// sessions to ask to compact, to how many tokens, and whether to start or
// stop refusing reservations. The pool gathers the candidates and applies
// the result under its lock; this file only decides.
//
// Thread-safety: stateless; thread-safe.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

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
};

struct LadderInputs {
  uint64_t free_bytes = 0;
  uint64_t low_watermark = 0;
  bool refusing = false;
  bool any_sessions = false;
};

struct LadderSteps {
  std::vector<std::pair<uint64_t, uint64_t>> compact;  // (session id, target tokens)
  bool refuse = false;  // refuse the lowest priority class present
  bool resume = false;  // stop refusing
};

// Below the watermark: candidates by (priority asc, bytes desc) are asked to
// compact to max(guarantee, min(half their tokens, what fits in 90% of the
// still free bytes)) until the expected free bytes reach 2 x watermark; with
// no candidate, refuse. At or above 2 x watermark: resume.
// Candidates below their floor (guarantee, or one block) are skipped.
LadderSteps PlanLadder(std::vector<LadderCandidate> candidates, const LadderInputs& in);

}  // namespace polykv::daemon
