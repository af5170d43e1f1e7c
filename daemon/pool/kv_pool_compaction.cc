// KvPool's compaction side: what a Sync at the worker's step boundary asks
// of its session (a move out of vacated arenas, the budget's compaction, the
// ladder's requantization step), the runs themselves (RelocationRun,
// CompactionRun, sequenced with the pool lock), failures, and the pressure
// ladder's rounds. kv_pool.h documents the members.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/compaction/pressure_ladder.h"
#include "daemon/pool/compaction_run.h"
#include "daemon/pool/kv_pool.h"
#include "daemon/pool/relocation_run.h"

namespace polykv::daemon {
namespace {

// What the compaction trigger counts as the session's size: the slots its
// layers hold, on average (committed tokens unless layers keep budgets of
// their own).
uint64_t HeldTokens(const Session& s, const std::vector<LayerHole>& holes) {
  const uint64_t n = s.tables.committed_tokens;
  uint64_t sum = 0;
  for (const LayerHole& h : holes) sum += n - std::min(h.length, n);
  return holes.empty() ? n : sum / holes.size();
}

// Slots of the session's leading shared prefix blocks (prefix_index.h),
// with their records pinned in every list: a compaction keeps them whole, so
// the blocks stay shared by reference, and its budget counts the session's
// other slots only (a shared block is the pool's once, whatever holds it).
// Every layer holds a shared block (the index's blocks have every layer's
// pages), so a layer with a budget of its own keeps them too, in place: its
// hole follows them (PlanCompaction). Slots pinned for an earlier compaction
// whose blocks are shared no more are unpinned.
uint64_t PinSharedPrefix(Session& s) {
  size_t b = 0;
  while (b < s.tables.blocks.size() && s.tables.blocks[b].prefix != 0) ++b;
  const uint64_t slots = std::min<uint64_t>(b * s.block_tokens, s.tables.committed_tokens);
  // The prefix holds the session's first tokens: positions 0 .. n - 1,
  // wherever a layer's list holds them now.
  const auto pinned_before = static_cast<int64_t>(s.policy.prefix_pinned);
  for (auto& list : s.policy.records) {
    for (SlotRecord& r : list) {
      if (r.meta.position >= 0 && r.meta.position < pinned_before) r.meta.pinned = false;
    }
    for (uint64_t i = 0; i < slots; ++i) list[i].meta.pinned = true;
  }
  s.policy.prefix_pinned = slots;
  return slots;
}

}  // namespace

absl::Status KvPool::Relocate(Session& s) {
  RelocationRun run(s, blocks_);
  if (run.moving().empty()) return absl::OkStatus();
  s.busy = true;
  if (auto st = RunStaged(s, run); !st.ok()) {
    if (absl::IsNotFound(st)) return st;
    // Those arenas cannot be emptied now: let them serve allocations again
    // rather than hold free space nobody may use.
    for (size_t b : run.moving()) blocks_.StopVacating(s.tenant(), s.tables.blocks[b]);
    return st;
  }
  relocated_blocks_ += run.moving().size();
  s.events->Push({SessionEventMsg::Type::kEpoch, s.tables.epoch,
                  absl::StrCat("moved ", run.moving().size(),
                               " blocks out of sparsely used arenas; Sync then Ack")});
  return absl::OkStatus();
}

absl::Status KvPool::CompactAtStepBoundary(Session& s) {
  if (s.policy.wants.per_layer) SplitLayerRecords(s);
  std::vector<LayerHole> holes = LayerHoles(s.tables.blocks, s.profile.num_layers, s.block_tokens);
  const QosRecord& qos = admission_.For(s.agent_id());
  // A policy that ranks by importance has nothing to rank by until the
  // worker reports some (one that runs no probes never does): its
  // session is not evicted meanwhile.
  const bool can_rank =
      !s.policy.wants.has(policies::ScoreStream::kImportance) || s.policy.importance_reported;
  const uint64_t shared = PinSharedPrefix(s);
  const uint64_t want = s.policy.want_tokens;
  TargetInputs in{.compacting_policy = qos.policy != "full" && can_rank,
                  .committed_tokens = HeldTokens(s, holes) - shared,
                  .block_tokens = s.block_tokens,
                  .budget_tokens = SessionBudget(qos.budget_tokens, qos.budget_fraction,
                                                 s.policy.next_position - shared),
                  .want_tokens = want == 0 ? 0 : std::max(want, shared + 1) - shared};
  // Only a budget reads the policy's trigger, so a Sync without one looks
  // nothing up. A policy the registry refuses keeps the default trigger;
  // Compact reports the error.
  if (in.compacting_policy && in.budget_tokens > 0) {
    if (auto policy = policies_.Get(qos.policy); policy.ok()) in.trigger = (*policy)->Trigger();
  }
  uint64_t target = CompactionTarget(in);
  if (target > 0) target += shared;
  const PolicyInputs::Failure now{s.tables.committed_tokens, s.policy.reports, qos.policy};
  if (target > 0 && s.policy.failed == now) {
    // Failed as it is: the session keeps its tables until it changes.
    s.policy.want_tokens = 0;
  } else if (target > 0) {
    // releases mu_ while it decides and copies
    auto st = Compact(s, qos, target, std::move(holes));
    if (absl::IsNotFound(st)) return st;  // closed or evicted meanwhile
    if (!st.ok()) {
      // The session keeps its tables; the ladder and budget retry once
      // it has changed.
      CompactionFailed(s, now, st);
      s.policy.want_tokens = 0;
    } else {
      s.policy.failed.reset();
    }
  } else if (s.policy.want_requant_blocks > 0) {
    // The ladder's step 1: every slot stays, cold blocks' values shrink.
    // The cold step counts blocks already cold towards its fraction (so
    // repeated compactions keep the share steady): ask for those too.
    const PageFormat to = LadderValueFormat(qos.value_floor);
    uint64_t blocks = std::exchange(s.policy.want_requant_blocks, 0);
    for (size_t b = 0; b < s.tables.committed_tokens / s.block_tokens; ++b) {
      blocks += kernels::FormatBits(s.tables.blocks[b].shape.value_format) <=
                kernels::FormatBits(to);
    }
    const uint64_t epoch = s.tables.epoch;
    const policies::ColdStep step =
        LadderColdStep(to, blocks, s.tables.committed_tokens, s.block_tokens);
    auto st = Compact(s, qos, s.tables.committed_tokens, std::move(holes), step);
    if (absl::IsNotFound(st)) return st;
    if (!st.ok()) CompactionFailed(s, now, st);
    if (s.tables.epoch == epoch) s.policy.requant_idle_at = s.tables.committed_tokens;
  }
  return absl::OkStatus();
}

absl::Status KvPool::Compact(Session& s, const QosRecord& qos, uint64_t target,
                             std::vector<LayerHole> layer_holes,
                             std::optional<policies::ColdStep> cold) {
  auto policy = policies_.Get(qos.policy);
  if (!policy.ok()) return policy.status();
  CompactionRun run(**policy, qos.policy, target, cold, options_.superblock_bytes);
  if (auto st = run.Prepare(s, qos, blocks_, std::move(layer_holes)); !st.ok()) return st;
  // From here until the end the session cannot change (compaction_run.h).
  s.busy = true;
  mu_.Unlock();
  absl::StatusOr<bool> changes = run.Decide(s);
  mu_.Lock();
  if (s.doomed) return FinishDoomed(s);
  if (!changes.ok() || !*changes) {
    s.busy = false;
    return changes.status();
  }
  if (auto st = RunStaged(s, run); !st.ok()) return st;
  const CompactionRun::Published& done = run.published();
  shared_blocks_ += done.shared_blocks;
  copied_blocks_ += done.copied_blocks;
  // The policy this run decided by, whatever the QoS says by now.
  const std::string& policy_text = run.policy_text();
  ++compactions_[policy_text];
  evicted_tokens_[policy_text] += done.evicted_tokens;
  merged_tokens_[policy_text] += done.merged_tokens;
  s.events->Push({SessionEventMsg::Type::kEpoch, s.tables.epoch,
                  absl::StrCat("compacted by policy '", policy_text, "' to ",
                               s.tables.committed_tokens, " slots; Sync then Ack")});
  return absl::OkStatus();
}

void KvPool::CompactionFailed(Session& s, PolicyInputs::Failure what, const absl::Status& why) {
  ++ladder_steps_["compaction_failed"];
  if (compaction_errors_.size() < kMaxCompactionErrors) {
    compaction_errors_.push_back(absl::StrCat("session ", s.id, " (agent ", s.agent_id(),
                                              ", policy '", what.policy, "'): ", why.message()));
  }
  // No room for new pages depends on other sessions: the next Sync may
  // find it. Anything else fails again until the session changes.
  if (!absl::IsUnavailable(why)) s.policy.failed = std::move(what);
}

std::vector<std::string> KvPool::TakeCompactionErrors() {
  absl::MutexLock lock(&mu_);
  return std::exchange(compaction_errors_, {});
}

void KvPool::SplitLayerRecords(Session& s) {
  if (s.policy.layers_apart() || s.profile.num_layers < 2) return;
  s.policy.records.resize(s.profile.num_layers, s.policy.records[0]);
}

std::vector<std::string> KvPool::RunPressureLadder() {
  absl::MutexLock lock(&mu_);
  std::vector<LadderCandidate> candidates;
  const bool under_pressure = blocks_.free_bytes() < admission_.low_watermark();
  const absl::Time now = Now();
  // Steps 3 and 4 take idle sessions when either is on; else an idle
  // session is asked to compact at its next Sync like any other.
  const bool idle_steps = options_.offload_store != nullptr || options_.ladder_evict_idle;
  Priority lowest = Priority::kCritical;
  for (const auto& [id, s] : sessions_) {
    lowest = std::min(lowest, s.priority);
    const QosRecord& q = admission_.For(s.agent_id());
    // A compacting session publishes soon and clears its ask; it is asked
    // again next round if still needed.
    // An idle session is a candidate for steps 3 and 4 whatever its policy
    // (offloading loses nothing); an offloaded one holds no pages here.
    const bool idle = idle_steps && s.idle && !s.busy && s.move == Session::Move::kNone;
    if (s.offloaded || (!idle && (q.policy == "full" || s.busy || s.policy.want_tokens != 0 ||
                                  s.policy.want_requant_blocks != 0 ||
                                  !s.tables.pending.empty()))) {
      continue;
    }
    LadderCandidate& c = candidates.emplace_back(
        LadderCandidate{id, static_cast<int>(s.priority), s.account.bytes,
                        s.tables.committed_tokens, s.block_tokens, s.shape.bytes(),
                        q.guaranteed_bytes});
    c.idle = idle;
    c.idle_ms = idle ? absl::ToInt64Milliseconds(now - s.idle_since) : 0;
    c.never_evict = s.priority == Priority::kCritical;
    // A scan of the session's blocks, under the lock: only when step 1 can run.
    if (under_pressure && !idle) DescribeRequant(s, c);
  }
  LadderInputs in{blocks_.free_bytes(), admission_.low_watermark(), admission_.refusing(),
                  sessions_.size() > 0};
  if (options_.offload_store) {
    const OffloadStore::Stats st = options_.offload_store->stats();
    in.offload_on = true;
    in.offload_room = (st.host_capacity - st.host_bytes) + (st.disk_capacity - st.disk_bytes);
  }
  in.evict_idle = options_.ladder_evict_idle;
  const LadderSteps plan = PlanLadder(std::move(candidates), in);
  std::vector<std::string> steps;
  if (plan.resume) {
    admission_.Resume();
    steps.push_back("resume");
  }
  for (const auto& [id, blocks] : plan.requant) {
    sessions_.Find(id)->policy.want_requant_blocks = blocks;
    steps.push_back("requant");
  }
  for (const auto& [id, want] : plan.compact) {
    sessions_.Find(id)->policy.want_tokens = want;
    steps.push_back("compact");
  }
  // Steps 3 and 4 act now (an offload copies with the lock released; each
  // session is looked up again after).
  for (uint64_t id : plan.offload) {
    Session* s = sessions_.Find(id);
    if (s == nullptr || !s->idle || s->busy || s->offloaded || s->move != Session::Move::kNone) {
      continue;
    }
    steps.push_back(OffloadLocked(*s).ok() ? "offload" : "offload_refused");
  }
  for (uint64_t id : plan.evict) {
    Session* s = sessions_.Find(id);
    if (s == nullptr || !s->idle || s->busy) continue;
    // Idle: its worker touches no page until its next Sync, which finds
    // the session gone; nothing to quarantine.
    DestroySession(id, {SessionEventMsg::Type::kEvicted, 0,
                        "evicted by the pressure ladder while idle: the pool needed its memory"},
                   /*consented=*/true);
    ++offload_counts_.evicted_idle;
    steps.push_back("evict_idle");
  }
  if (plan.refuse) {
    admission_.Refuse(lowest);
    steps.push_back("refuse");
  }
  for (const std::string& name : steps) ++ladder_steps_[name];
  return steps;
}

void KvPool::DescribeRequant(const Session& s, LadderCandidate& c) const {
  if (s.tables.committed_tokens < s.policy.requant_idle_at + s.block_tokens) return;
  const PageFormat to = LadderValueFormat(admission_.For(s.agent_id()).value_floor);
  // The recent window stays (LadderColdStep); so does the fill block.
  const size_t full = s.tables.committed_tokens / s.block_tokens;
  const size_t window = kLadderRequantWindow / s.block_tokens;
  if (full <= window) return;
  const size_t cold = std::min(full - window, s.tables.blocks.size());
  // The requantized shape of the session's key format; a block whose keys
  // were stored otherwise gets its own.
  const absl::StatusOr<BlockShape> fill = MakeBlockShape(
      s.profile.num_layers, s.page_shape(), s.shape.key_format, to, options_.superblock_bytes);
  uint64_t saved = 0;
  for (size_t b = 0; b < cold; ++b) {
    const Block& block = s.tables.blocks[b];
    // A shared block's copy would add memory, not save it.
    if (block.prefix != 0) continue;
    if (kernels::FormatBits(block.shape.value_format) <= kernels::FormatBits(to)) continue;
    const absl::StatusOr<BlockShape> shape =
        block.shape.key_format == s.shape.key_format
            ? fill
            : MakeBlockShape(block.shape.layers, s.page_shape(), block.shape.key_format, to,
                             options_.superblock_bytes);
    if (!shape.ok() || shape->bytes() >= block.bytes()) continue;
    ++c.requant_blocks;
    saved += block.bytes() - shape->bytes();
    c.requant_block_bytes = std::max(c.requant_block_bytes, shape->bytes());
  }
  if (c.requant_blocks == 0) return;
  c.requant_saving = saved / c.requant_blocks;
  if (fill.ok()) c.requant_room = blocks_.FreeBlocksFor(s.tenant(), *fill);
}

}  // namespace polykv::daemon
