// KvPool's offload tiers (issue 42, docs/offload.md): an idle session's own
// pages go to the OffloadStore and are freed; its next Sync brings them back
// into new pages (a RestoreRun, published at epoch + 1 like any move of its
// pages). An idle worker touches no page until that Sync (client.h, Idle),
// so neither step waits for it.
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/pool/kv_pool.h"
#include "kernels/device.h"

namespace polykv::daemon {
namespace {

// A session's own pages (not its shared blocks), in the store's order
// (block by block, K and V by layer), in host or device memory. Device pages
// travel through a host copy (`staging`): the store holds host bytes.
class OwnPages {
 public:
  static absl::StatusOr<OwnPages> Locate(const BlockPool& pool, const std::string& tenant,
                                         const std::vector<Block>& blocks) {
    OwnPages out;
    for (const Block& b : blocks) {
      if (b.prefix != 0) continue;
      for (size_t i = 0; i < b.pages.size(); ++i) {
        if (b.pages[i] == kNoPage) continue;
        int device = -1;
        const uint64_t addr = pool.PageAddress(tenant, b.pages[i], &device);
        if (addr == 0) return absl::InternalError("a page to offload has no memory to copy");
        if (!out.pages_.empty() && device != out.device_) {
          return absl::InternalError("a session's pages are on two devices");
        }
        out.device_ = device;
        out.pages_.emplace_back(reinterpret_cast<std::byte*>(addr), b.shape.page_bytes(i));
        out.bytes_ += b.shape.page_bytes(i);
      }
    }
    return out;
  }
  uint64_t bytes() const { return bytes_; }

  // The pages' bytes, readable on the host.
  absl::StatusOr<std::vector<std::span<const std::byte>>> Read() {
    if (device_ < 0) return std::vector<std::span<const std::byte>>(pages_.begin(), pages_.end());
    if (auto st = kernels::SetDevice(device_); !st.ok()) return st;
    const std::vector<std::span<std::byte>> host = Staging();
    for (size_t i = 0; i < pages_.size(); ++i) {
      auto st = kernels::CopyToHost(host[i].data(), pages_[i].data(), host[i].size());
      if (!st.ok()) return st;
    }
    return std::vector<std::span<const std::byte>>(host.begin(), host.end());
  }
  // Fills the pages with what `get` writes into host spans of their sizes.
  absl::Status Write(
      const std::function<absl::Status(std::span<const std::span<std::byte>>)>& get) {
    if (device_ < 0) return get(pages_);
    const std::vector<std::span<std::byte>> host = Staging();
    if (auto st = get(host); !st.ok()) return st;
    if (auto st = kernels::SetDevice(device_); !st.ok()) return st;
    for (size_t i = 0; i < pages_.size(); ++i) {
      auto st = kernels::CopyToDevice(pages_[i].data(), host[i].data(), host[i].size());
      if (!st.ok()) return st;
    }
    return kernels::DeviceSynchronize();
  }

 private:
  // One host span per page, of its size, in staging_.
  std::vector<std::span<std::byte>> Staging() {
    staging_.resize(bytes_);
    std::vector<std::span<std::byte>> host;
    size_t at = 0;
    for (const auto& p : pages_) {
      host.emplace_back(staging_.data() + at, p.size());
      at += p.size();
    }
    return host;
  }

  std::vector<std::span<std::byte>> pages_;
  int device_ = -1;  // -1: host memory
  uint64_t bytes_ = 0;
  std::vector<std::byte> staging_;  // device pages' bytes on the host
};

// An offloaded session's own blocks written back into new pages: the same
// shapes, the same bytes, the shared blocks it held in their places.
class RestoreRun : public StagedRun {
 public:
  explicit RestoreRun(OffloadStore& store) : store_(store) {}

  absl::StatusOr<std::vector<BlockShape>> NewShapes(const Session& s) const override {
    std::vector<BlockShape> shapes;
    for (const Block& b : s.offloaded->blocks) {
      if (b.prefix == 0) shapes.push_back(b.shape);
    }
    return shapes;
  }
  absl::Status Address(const Session& s, const BlockPool& blocks) override {
    auto pages = OwnPages::Locate(blocks, s.tenant(), s.tables.staged);
    if (!pages.ok()) return pages.status();
    pages_ = *std::move(pages);
    return absl::OkStatus();
  }
  absl::Status Copy(const Session& s) const override {
    return pages_.Write([&](std::span<const std::span<std::byte>> host) {
      return store_.Get(s.id, host);
    });
  }
  std::vector<Block> Publish(Session& s) override {
    std::vector<Block> table = std::move(s.offloaded->blocks);
    size_t next = 0;
    for (Block& b : table) {
      if (b.prefix == 0) b = std::move(s.tables.staged[next++]);
    }
    s.tables.staged.clear();
    s.tables.blocks = std::move(table);
    s.offloaded.reset();
    return {};
  }
  bool KeepsSlots() const override { return true; }

 private:
  OffloadStore& store_;
  mutable OwnPages pages_;  // Copy stages device pages through its buffer
};

}  // namespace

absl::StatusOr<uint64_t> KvPool::Offload(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  Session* sp = sessions_.Find(session_id);
  if (sp == nullptr || sp->move == Session::Move::kImporting) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id));
  }
  Session& s = *sp;
  if (!options_.offload_store) {
    return absl::FailedPreconditionError(
        "offload is not configured (offload_host_bytes, or offload_dir and offload_disk_bytes)");
  }
  if (s.offloaded || s.offloading) {
    return absl::FailedPreconditionError(
        absl::StrCat("session ", session_id, " is offloaded already"));
  }
  if (!s.idle || s.busy || s.move != Session::Move::kNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session_id, " is not idle: only a session whose worker said Idle (and "
        "has called nothing since) can be offloaded, since it touches no page until its next "
        "Sync"));
  }
  return OffloadLocked(s);
}

uint32_t KvPool::OffloadIdle() {
  absl::MutexLock lock(&mu_);
  if (!options_.offload_store || options_.offload_idle == absl::InfiniteDuration()) return 0;
  const absl::Time now = Now();
  std::vector<uint64_t> due;
  for (const auto& [id, s] : sessions_) {
    if (s.idle && !s.busy && !s.offloaded && s.move == Session::Move::kNone &&
        now - s.idle_since >= options_.offload_idle) {
      due.push_back(id);
    }
  }
  uint32_t done = 0;
  for (uint64_t id : due) {  // each releases the lock while it copies
    Session* s = sessions_.Find(id);
    if (s == nullptr || !s->idle || s->busy || s->offloaded || s->move != Session::Move::kNone) {
      continue;
    }
    done += OffloadLocked(*s).ok();
  }
  return done;
}

absl::StatusOr<uint64_t> KvPool::OffloadLocked(Session& s) {
  auto pages = OwnPages::Locate(blocks_, s.tenant(), s.tables.blocks);
  if (!pages.ok()) return pages.status();
  const uint64_t bytes = pages->bytes();
  s.busy = true;
  s.offloading = true;
  mu_.Unlock();
  auto read = pages->Read();
  const absl::Status stored = read.ok() ? options_.offload_store->Put(s.id, *read) : read.status();
  mu_.Lock();
  s.offloading = false;
  if (s.doomed) {
    if (stored.ok()) options_.offload_store->Drop(s.id);
    return FinishDoomed(s);
  }
  s.busy = false;
  if (!stored.ok()) {
    ++offload_counts_.refused;
    return stored;
  }
  // The worker holds no page now: its pending pages (an epoch it has not
  // acked) go too, and its own blocks keep only their shapes.
  FreePending(s);
  Session::Offloaded out{std::move(s.tables.blocks), bytes};
  s.tables.blocks.clear();
  for (Block& b : out.blocks) {
    if (b.prefix == 0) blocks_.Free(s.account, b);
  }
  s.offloaded = std::move(out);
  ++offload_counts_.offloaded;
  offload_counts_.offloaded_bytes += bytes;
  return bytes;
}

Session* KvPool::AwaitOffloaded(uint64_t id) {
  auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const Session* p = sessions_.Find(id);
    return p == nullptr || !p->offloading;
  };
  mu_.Await(absl::Condition(&settled));
  return sessions_.Find(id);
}

absl::Status KvPool::Restore(Session& s) {
  const absl::Time start = absl::Now();
  const uint64_t id = s.id;
  RestoreRun run(*options_.offload_store);
  s.busy = true;
  absl::Status st = RunStaged(s, run);
  if (absl::IsNotFound(st)) return st;  // destroyed meanwhile
  if (absl::IsDataLoss(st)) {
    ++offload_counts_.lost;
    DestroySession(id, {SessionEventMsg::Type::kEvicted, 0, std::string(st.message())},
                   /*consented=*/true);
    return absl::DataLossError(absl::StrCat("session ", id, " was offloaded and its pages "
                                            "were lost (", st.message(), "); it has ended"));
  }
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("session ", id, " is offloaded and cannot be "
                                                "restored now: ", st.message()));
  }
  options_.offload_store->Drop(id);
  ++offload_counts_.restored;
  offload_counts_.ObserveRestore(absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

}  // namespace polykv::daemon
