// KvPool's block lifecycle under the pool lock: a call's blocks are
// allocated (staged) and freed a few at a time, the lock yielded between
// steps so that other sessions' calls barely wait; a session closed or
// evicted meanwhile ("doomed") is finished by the call that held it.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/pool/kv_pool.h"

namespace polykv::daemon {
namespace {

// Blocks allocated or freed per hold of the pool lock (a block is 2 x layers
// pages): long enough to amortize the lock, short enough that other
// sessions' calls barely wait.
constexpr size_t kBlocksPerStep = 4;

}  // namespace

absl::StatusOr<std::vector<Block>> KvPool::AllocateForReserve(Session& s, uint64_t count) {
  if (count <= kBlocksPerStep) {
    return blocks_.Allocate(s.account, s.shape, count, /*zero=*/true,
                            admission_.UnusedGuarantees(s.agent_id(), blocks_));
  }
  // A prompt's worth: a few blocks per hold of the lock, into `staged`
  // (counted, so invariants hold at every step), the rest held in flight
  // by admission so that no concurrent reservation is admitted into it.
  const uint64_t block_bytes = s.shape.bytes();
  admission_.AddInFlight(s.agent_id(), count * block_bytes);
  s.busy = true;
  const absl::Status failure =
      StageBlocks(s, std::vector<BlockShape>(count, s.shape), /*in_flight=*/true);
  admission_.RemoveInFlight(s.agent_id(), (count - s.tables.staged.size()) * block_bytes);
  if (s.doomed) return FinishDoomed(s);
  if (!failure.ok()) {
    if (!FreeGradually(s, s.tables.staged)) return FinishDoomed(s);
    s.busy = false;
    return failure;
  }
  std::vector<Block> out = std::move(s.tables.staged);
  s.tables.staged.clear();
  s.busy = false;
  return out;
}

bool KvPool::Yield(Session& s) {
  mu_.Unlock();
  mu_.Lock();
  return !s.doomed;
}

absl::Status KvPool::StageBlocks(Session& s, const std::vector<BlockShape>& shapes,
                                 bool in_flight) {
  const size_t count = shapes.size();
  for (size_t done = 0; done < count;) {
    const size_t step_end = std::min(count, done + kBlocksPerStep);
    while (done < step_end) {  // runs of one shape per Allocate
      size_t run = 1;
      while (done + run < step_end && shapes[done + run] == shapes[done]) ++run;
      // A reservation's pages (in flight) are zeroed for the worker; a
      // compaction's are written whole by its copy before anyone reads them.
      // A reservation's new arenas leave other agents' unused guarantees
      // unmapped; a compaction's output may use them (admission keeps room).
      auto got = blocks_.Allocate(
          s.account, shapes[done], run, /*zero=*/in_flight,
          in_flight ? admission_.UnusedGuarantees(s.agent_id(), blocks_) : 0);
      if (!got.ok()) return got.status();
      if (in_flight) admission_.RemoveInFlight(s.agent_id(), run * shapes[done].bytes());
      for (Block& b : *got) s.tables.staged.push_back(std::move(b));
      done += run;
    }
    if (done < count && !Yield(s)) return absl::AbortedError("the session was closed meanwhile");
  }
  return absl::OkStatus();
}

bool KvPool::FreeGradually(Session& s, std::vector<Block>& blocks, bool pending) {
  while (!blocks.empty()) {
    for (size_t i = 0; i < kBlocksPerStep && !blocks.empty(); ++i) {
      const uint64_t bytes = OwnBytes(blocks.back());
      blocks_.Free(s.account, blocks.back());
      blocks.pop_back();
      if (pending) {
        s.tables.pending_bytes -= bytes;
        pending_bytes_ -= bytes;
      }
    }
    if (!blocks.empty() && !Yield(s)) return false;
  }
  return true;
}

absl::Status KvPool::RunStaged(Session& s, StagedRun& run) {
  // New pages for the run's output, a few blocks per hold of the lock. Not
  // a reservation (a compaction shrinks the session, a move keeps its
  // size), so quotas do not apply, but the pool budget does. They are the
  // session's (staged) from allocation on, so counts stay exact.
  auto shapes = run.NewShapes(s);
  absl::Status failure =
      shapes.ok() ? StageBlocks(s, *shapes, /*in_flight=*/false) : shapes.status();
  if (absl::IsResourceExhausted(failure)) {
    failure =
        absl::UnavailableError(absl::StrCat("no room for new pages now: ", failure.message()));
  }
  if (s.doomed) return FinishDoomed(s);
  if (failure.ok()) failure = run.Address(s, blocks_);
  if (failure.ok()) {
    mu_.Unlock();
    failure = run.Copy(s);
    mu_.Lock();
    if (s.doomed) return FinishDoomed(s);
  }
  if (!failure.ok()) {
    if (!FreeGradually(s, s.tables.staged)) return FinishDoomed(s);
    s.busy = false;
    return failure;
  }
  // The old blocks the new table does not hold stay allocated until the
  // worker acks it.
  BlockTables& t = s.tables;
  t.pending = run.Publish(s);
  t.pending_bytes = 0;
  for (const Block& b : t.pending) t.pending_bytes += OwnBytes(b);
  pending_bytes_ += t.pending_bytes;
  ++t.epoch;
  t.pending_epoch = t.epoch;
  if (!run.KeepsSlots()) t.slots_epoch = t.epoch;
  s.busy = false;
  return absl::OkStatus();
}

absl::Status KvPool::FinishDoomed(Session& s) {
  const uint64_t id = s.id;
  s.busy = false;
  DestroySession(id, std::move(s.doom_event), s.doom_consented);
  return absl::NotFoundError(
      absl::StrCat("session ", id, " was closed or evicted while a call worked on its pages"));
}

void KvPool::FreePending(Session& s) {
  for (Block& block : s.tables.pending) blocks_.Free(s.account, block);
  s.tables.pending.clear();
  pending_bytes_ -= s.tables.pending_bytes;
  s.tables.pending_bytes = 0;
}

}  // namespace polykv::daemon
