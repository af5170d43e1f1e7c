#include "daemon/compaction/pressure_ladder.h"

#include <algorithm>

namespace polykv::daemon {
namespace {

double BytesPerToken(const LadderCandidate& c) {
  return double(c.block_bytes) / c.block_tokens;
}

// Tokens the session keeps at least: its agent's guarantee, one block.
uint64_t FloorTokens(const LadderCandidate& c) {
  const double per_token = BytesPerToken(c);
  return std::max<uint64_t>(
      c.block_tokens, per_token > 0 ? uint64_t(double(c.guaranteed_bytes) / per_token) : 0);
}

}  // namespace

LadderSteps PlanLadder(std::vector<LadderCandidate> candidates, const LadderInputs& in) {
  LadderSteps out;
  const uint64_t low = in.low_watermark;
  if (in.free_bytes >= 2 * low) {
    out.resume = in.refusing;
    return out;
  }
  if (in.free_bytes >= low) return out;
  std::erase_if(candidates, [](const LadderCandidate& c) { return c.committed_tokens <= FloorTokens(c); });
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const LadderCandidate& a, const LadderCandidate& b) {
                     if (a.priority != b.priority) return a.priority < b.priority;
                     return a.bytes > b.bytes;
                   });
  // A compaction writes its output into NEW pages before the old ones go, so
  // each target must also fit in what is still free (90%, for fragmentation).
  uint64_t expect = 0;
  uint64_t room = in.free_bytes;
  for (const LadderCandidate& c : candidates) {
    if (in.free_bytes + expect >= 2 * low) break;
    const double per_token = BytesPerToken(c);
    const uint64_t fits =
        uint64_t(double(room) * 0.9 / per_token) / c.block_tokens * c.block_tokens;
    const uint64_t want = std::max(FloorTokens(c), std::min(c.committed_tokens / 2, fits));
    if (want >= c.committed_tokens) continue;
    out.compact.emplace_back(c.session_id, want);
    const uint64_t out_bytes = (want + c.block_tokens - 1) / c.block_tokens * c.block_bytes;
    room -= std::min(room, out_bytes);
    expect += uint64_t(double(c.committed_tokens - want) * per_token);
  }
  // Nothing (more) to compact: refuse the lowest class present.
  out.refuse = candidates.empty() && !in.refusing && in.any_sessions;
  return out;
}

}  // namespace polykv::daemon
