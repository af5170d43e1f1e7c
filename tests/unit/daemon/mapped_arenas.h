// A worker's view of a pool's pages in the pool's tests: the arenas it
// mapped through DupArenaFd, as the client library maps the fds it fetches,
// by arena id (ids are unique within a tenant: one MappedArenas per tenant),
// unmapped on Clear and destruction.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "daemon/pool/kv_pool.h"
#include "gtest/gtest.h"

namespace polykv::daemon {

class MappedArenas {
 public:
  explicit MappedArenas(KvPool* pool) : pool_(pool) {}
  ~MappedArenas() { Clear(); }
  MappedArenas(const MappedArenas&) = delete;
  MappedArenas& operator=(const MappedArenas&) = delete;

  // Unmaps everything; later calls map from `pool` (a new one, or the same).
  void Reset(KvPool* pool) {
    Clear();
    pool_ = pool;
  }
  // Maps those of `arenas` not mapped yet, as session `id` may.
  void Map(uint64_t id, const std::string& token, const PeerCreds& peer,
           const std::vector<ArenaExport>& arenas) {
    for (const auto& a : arenas) Fetch(id, token, peer, a.arena_id);
  }
  // The address of page `p`, mapping its arena first if needed.
  uint8_t* At(uint64_t id, const std::string& token, const PeerCreds& peer, const PageDesc& p) {
    if (!maps_.contains(p.arena_id)) Fetch(id, token, peer, p.arena_id);
    return Addr(p);
  }
  // The address of page `p`, whose arena is mapped.
  uint8_t* Addr(const PageDesc& p) const {
    return static_cast<uint8_t*>(maps_.at(p.arena_id).first) + p.offset;
  }

 private:
  void Fetch(uint64_t id, const std::string& token, const PeerCreds& peer, uint32_t arena) {
    if (maps_.contains(arena)) return;
    auto fd = pool_->DupArenaFd(id, token, peer, arena);
    ASSERT_TRUE(fd.ok()) << fd.status();
    const size_t len = static_cast<size_t>(fd->size_bytes);
    ASSERT_EQ(len, static_cast<size_t>(lseek(fd->fd, 0, SEEK_END)));
    void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd->fd, 0);
    close(fd->fd);
    ASSERT_NE(m, MAP_FAILED);
    maps_[arena] = {m, len};
  }
  void Clear() {
    for (auto& [id, m] : maps_) munmap(m.first, m.second);
    maps_.clear();
  }

  KvPool* pool_;
  std::map<uint32_t, std::pair<void*, size_t>> maps_;
};

}  // namespace polykv::daemon
