#include "daemon/pool/relocation_run.h"

#include <cstring>
#include <utility>

#include "kernels/device.h"

namespace polykv::daemon {

RelocationRun::RelocationRun(const Session& s, const BlockPool& blocks) {
  for (size_t b = 0; b < s.tables.blocks.size(); ++b) {
    if (blocks.InVacatingArena(s.tenant(), s.tables.blocks[b])) moving_.push_back(b);
  }
}

absl::StatusOr<std::vector<BlockShape>> RelocationRun::NewShapes(const Session& s) const {
  std::vector<BlockShape> shapes;
  for (size_t b : moving_) shapes.push_back(s.tables.blocks[b].shape);
  return shapes;
}

absl::Status RelocationRun::Address(const Session& s, const BlockPool& blocks) {
  for (size_t i = 0; i < moving_.size(); ++i) {
    const Block& from = s.tables.blocks[moving_[i]];
    const Block& to = s.tables.staged[i];
    for (size_t p = 0; p < from.pages.size(); ++p) {
      if (from.pages[p] == kNoPage) continue;
      const uint64_t src = blocks.PageAddress(s.tenant(), from.pages[p], &device_);
      const uint64_t dst = blocks.PageAddress(s.tenant(), to.pages[p], &device_);
      if (src == 0 || dst == 0) return absl::InternalError("a page to move has no memory");
      copies_.push_back({reinterpret_cast<const void*>(src), reinterpret_cast<void*>(dst),
                         from.shape.page_bytes(p)});
    }
  }
  return absl::OkStatus();
}

absl::Status RelocationRun::Copy(const Session&) const {
  if (device_ < 0) {
    for (const PageCopy& c : copies_) std::memcpy(c.to, c.from, c.bytes);
    return absl::OkStatus();
  }
  if (auto st = kernels::SetDevice(device_); !st.ok()) return st;
  for (const PageCopy& c : copies_) {
    if (auto st = kernels::CopyOnDevice(c.to, c.from, c.bytes); !st.ok()) return st;
  }
  return absl::OkStatus();
}

std::vector<Block> RelocationRun::Publish(Session& s) {
  BlockTables& t = s.tables;
  std::vector<Block> old;
  for (size_t i = 0; i < moving_.size(); ++i) {
    old.push_back(std::exchange(t.blocks[moving_[i]], std::move(t.staged[i])));
  }
  t.staged.clear();
  return old;
}

}  // namespace polykv::daemon
