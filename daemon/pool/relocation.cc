// KvPool::Relocate: a session's blocks leave arenas being vacated (issue 40:
// a tenant's few remaining pages spread over many arenas kept them all, and
// the pool refused other tenants while mostly free). It is a compaction that
// keeps every slot: the same shapes, the bytes copied as they are, published
// as a new epoch at the worker's step boundary, the old pages freed on Ack.
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/pool/kv_pool.h"

namespace polykv::daemon {

absl::Status KvPool::Relocate(Session& s) {
  BlockTables& t = s.tables;
  std::vector<size_t> moving;  // indices into t.blocks
  std::vector<BlockShape> shapes;
  for (size_t b = 0; b < t.blocks.size(); ++b) {
    if (!blocks_.InVacatingArena(s.tenant(), t.blocks[b])) continue;
    moving.push_back(b);
    shapes.push_back(t.blocks[b].shape);
  }
  if (moving.empty()) return absl::OkStatus();
  // As in Compact: the session cannot change while busy, and its pages, old
  // and new, stay allocated (so their arenas stay mapped) without the lock.
  s.busy = true;
  absl::Status failure = StageBlocks(s, shapes, /*in_flight=*/false);
  if (s.doomed) return FinishDoomed(s);
  struct Copy {
    const void* from;
    void* to;
    size_t bytes;
  };
  std::vector<Copy> copies;
  for (size_t i = 0; failure.ok() && i < moving.size(); ++i) {
    const Block& from = t.blocks[moving[i]];
    const Block& to = t.staged[i];
    for (size_t p = 0; p < from.pages.size(); ++p) {
      if (from.pages[p] == kNoPage) continue;
      const uint64_t src = blocks_.HostAddress(s.tenant(), from.pages[p]);
      const uint64_t dst = blocks_.HostAddress(s.tenant(), to.pages[p]);
      if (src == 0 || dst == 0) {
        failure = absl::UnimplementedError("moving pages of device (CUDA) arenas is not implemented yet");
        break;
      }
      copies.push_back({reinterpret_cast<const void*>(src), reinterpret_cast<void*>(dst),
                        from.shape.page_bytes(p)});
    }
  }
  if (failure.ok()) {
    mu_.Unlock();
    for (const Copy& c : copies) std::memcpy(c.to, c.from, c.bytes);
    mu_.Lock();
    if (s.doomed) return FinishDoomed(s);
  }
  if (!failure.ok()) {
    // Those arenas cannot be emptied now: let them serve allocations again
    // rather than hold free space nobody may use.
    for (size_t b : moving) blocks_.StopVacating(s.tenant(), t.blocks[b]);
    if (!FreeGradually(s, t.staged)) return FinishDoomed(s);
    s.busy = false;
    return failure;
  }
  t.pending.clear();
  t.pending_bytes = 0;
  for (size_t i = 0; i < moving.size(); ++i) {
    Block& old = t.blocks[moving[i]];
    t.pending_bytes += old.bytes();
    t.pending.push_back(std::move(old));
    old = std::move(t.staged[i]);
  }
  t.staged.clear();
  pending_bytes_ += t.pending_bytes;
  ++t.epoch;
  t.pending_epoch = t.epoch;
  relocated_blocks_ += moving.size();
  s.busy = false;
  s.events->Push({SessionEventMsg::Type::kEpoch, t.epoch,
                  absl::StrCat("moved ", moving.size(),
                               " blocks out of sparsely used arenas; Sync then Ack")});
  return absl::OkStatus();
}

}  // namespace polykv::daemon
