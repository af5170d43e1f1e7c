#include "daemon/compaction/pressure_ladder.h"

#include <algorithm>

#include "policies/lowering.h"
#include "policies/policy.h"

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
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const LadderCandidate& a, const LadderCandidate& b) {
                     if (a.priority != b.priority) return a.priority < b.priority;
                     return a.bytes > b.bytes;
                   });
  uint64_t expect = 0;
  auto enough = [&] { return in.free_bytes + expect >= 2 * low; };
  std::vector<LadderCandidate> idle;
  if (in.offload_on || in.evict_idle) {
    for (const LadderCandidate& c : candidates) {
      if (c.idle) idle.push_back(c);
    }
    std::erase_if(candidates, [](const LadderCandidate& c) { return c.idle; });
    std::stable_sort(idle.begin(), idle.end(),
                     [](const LadderCandidate& a, const LadderCandidate& b) {
                       if (a.priority != b.priority) return a.priority < b.priority;
                       return a.idle_ms > b.idle_ms;
                     });
  }
  // Step 1. Each block is rewritten into new pages before its old ones go.
  uint64_t room = in.free_bytes;
  std::vector<LadderCandidate> rest;
  for (const LadderCandidate& c : candidates) {
    const uint64_t fit =
        c.requant_block_bytes > 0 ? uint64_t(double(room) * 0.9) / c.requant_block_bytes : 0;
    // Requantization is lossy: no more blocks than the watermark needs.
    const uint64_t missing = 2 * low - std::min(2 * low, in.free_bytes + expect);
    const uint64_t needed =
        c.requant_saving > 0 ? (missing + c.requant_saving - 1) / c.requant_saving : 0;
    const uint64_t take = std::min({c.requant_blocks, fit, c.requant_room, needed});
    if (enough() || take == 0) {
      rest.push_back(c);
      continue;
    }
    out.requant.emplace_back(c.session_id, take);
    room -= take * c.requant_block_bytes;
    expect += take * c.requant_saving;
  }
  // Step 2. A compaction writes its output into NEW pages before the old
  // ones go, so each target must also fit in what is still free (90%, for
  // fragmentation).
  std::erase_if(rest,
                [](const LadderCandidate& c) { return c.committed_tokens <= FloorTokens(c); });
  for (const LadderCandidate& c : rest) {
    if (enough()) break;
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
  // Steps 3 and 4: what an idle session holds leaves the pool at once.
  uint64_t offload_room = in.offload_room;
  for (const LadderCandidate& c : idle) {
    if (enough()) break;
    if (c.bytes == 0) continue;
    if (in.offload_on && c.bytes <= offload_room) {
      out.offload.push_back(c.session_id);
      offload_room -= c.bytes;
    } else if (in.evict_idle && !c.never_evict) {
      out.evict.push_back(c.session_id);
    } else {
      continue;
    }
    expect += c.bytes;
  }
  // Nothing (more) to requantize, compact, offload or evict: refuse the
  // lowest class present.
  out.refuse = out.requant.empty() && rest.empty() && out.offload.empty() &&
               out.evict.empty() && !in.refusing && in.any_sessions;
  return out;
}

kernels::PageFormat LadderValueFormat(std::optional<kernels::PageFormat> value_floor) {
  return value_floor ? policies::FinerFormat(kernels::PageFormat::kInt4, *value_floor)
                     : kernels::PageFormat::kInt4;
}

policies::ColdStep LadderColdStep(kernels::PageFormat value_format, uint64_t blocks,
                                  uint64_t committed_tokens, uint32_t block_tokens) {
  // The cold step takes floor(fraction x slots / block_tokens) blocks; half a
  // block more keeps the rounding off the boundary.
  const double slots = double(std::max<uint64_t>(1, committed_tokens));
  const double fraction = std::min(1.0, (double(blocks) + 0.5) * block_tokens / slots);
  return policies::ColdStep{value_format, /*keys=*/false, /*values=*/true, fraction,
                            kLadderRequantWindow};
}

}  // namespace polykv::daemon
