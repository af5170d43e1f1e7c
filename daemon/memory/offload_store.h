// OffloadStore: where an idle session's pages wait while they are out of
// the pool (issue 42, docs/offload.md). Two tiers under the pool: host
// memory (the daemon's heap; pinned host memory is the same tier on a GPU
// node) and disk (one checksummed file per entry in a directory of the
// daemon's own). An entry is a session's own pages, concatenated; the pool
// keeps their order and sizes.
//
// Host memory takes an entry while it has room, moving the entries stored
// longest ago to disk to make it; an entry larger than the host tier goes to
// disk directly. A disk file names the daemon's run (instance) and carries a
// CRC-32C of its header and of its bytes: a file from an earlier run, or
// changed on disk, is never served (DATA_LOSS), and Create removes every
// file of earlier runs. Writes go through the page cache (no O_DIRECT: an
// entry is read back once, soon after it may still be cached).
//
// Thread-safety: all methods are thread-safe. Transfers (Put, its spills,
// Get) go one at a time under io_mu_; Drop, Where and stats take only the
// short metadata lock, so a caller holding its own lock (the pool's) never
// waits for a disk. An entry dropped while it is being transferred goes
// when that transfer ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace polykv::daemon {

struct OffloadOptions {
  uint64_t host_bytes = 0;  // the host tier's capacity; 0 = none
  std::string disk_dir;     // the disk tier's directory (made 0700); "" = none
  uint64_t disk_bytes = 0;  // the disk tier's capacity (file bytes, headers included)
  uint32_t instance = 0;    // this run of the daemon (session ids' high half)
};

enum class OffloadTier { kHost, kDisk };
const char* OffloadTierName(OffloadTier tier);  // "host", "disk"

class OffloadStore {
 public:
  // INVALID_ARGUMENT when neither tier has room, or a disk tier has no
  // capacity; the directory's errors name it.
  static absl::StatusOr<std::unique_ptr<OffloadStore>> Create(const OffloadOptions& options);

  // Stores the concatenation of `pages` under `key`. RESOURCE_EXHAUSTED,
  // naming both tiers' room, when neither can take it (a full disk
  // included); another disk error is UNAVAILABLE naming the file. On any
  // error nothing is stored and no other entry is lost.
  // REQUIRES: no entry under `key`.
  absl::Status Put(uint64_t key, std::span<const std::span<const std::byte>> pages);
  // Writes the entry back into `pages`, whose sizes must be Put's (else
  // INVALID_ARGUMENT). NOT_FOUND for no entry; DATA_LOSS when its checksum
  // or header does not match (the entry is dropped then). The entry stays
  // until Drop.
  absl::Status Get(uint64_t key, std::span<const std::span<std::byte>> pages);
  void Drop(uint64_t key);
  std::optional<OffloadTier> Where(uint64_t key) const;

  struct Stats {
    uint64_t host_capacity = 0, disk_capacity = 0;
    uint64_t host_bytes = 0, disk_bytes = 0;  // held now
    uint32_t host_entries = 0, disk_entries = 0;
    uint64_t spilled = 0;        // entries moved host -> disk
    uint64_t disk_errors = 0;    // writes that failed (the entry stayed or was refused)
    uint64_t corrupt = 0;        // reads that failed their checks
  };
  Stats stats() const;

  ~OffloadStore();

 private:
  explicit OffloadStore(const OffloadOptions& options);

  struct Entry {
    OffloadTier tier = OffloadTier::kHost;
    std::vector<std::byte> data;  // host tier
    uint64_t bytes = 0;           // of the pages
    uint32_t pages = 0;
    uint32_t crc = 0;             // of the pages' bytes
    std::list<uint64_t>::iterator lru;  // host tier: place in host_order_
    bool io = false;       // being transferred (without mu_)
    bool dropped = false;  // Drop came meanwhile: forget it after
  };

  std::string PathOf(uint64_t key) const;
  static uint64_t FileBytes(uint64_t bytes);
  // Writes `pages` as key's file, its room on disk taken first.
  // RESOURCE_EXHAUSTED past disk_bytes or on ENOSPC, UNAVAILABLE on other
  // errors; no file is left and no room kept on failure.
  absl::Status WriteFile(uint64_t key, std::span<const std::span<const std::byte>> pages,
                         uint32_t crc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status ReadFile(uint64_t key, uint64_t bytes, uint32_t pages, uint32_t crc,
                        std::span<const std::span<std::byte>> out) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_);
  // Moves the host entry stored longest ago to disk; false when there is
  // none or the disk cannot take it (it stays in host memory).
  bool SpillOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(io_mu_) ABSL_LOCKS_EXCLUDED(mu_);
  // The end of a transfer of `key`: forgets it if it was dropped meanwhile.
  void EndIo(uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(uint64_t key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const OffloadOptions options_;
  absl::Mutex io_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<uint64_t> host_order_ ABSL_GUARDED_BY(mu_);  // oldest first
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace polykv::daemon
