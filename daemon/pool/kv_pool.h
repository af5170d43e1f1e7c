// KvPool: the daemon's state — tenants, their arenas and page allocators,
// sessions with leases and block tables, per-agent QoS — and every operation
// the Session and Admin services expose, in internal types.
//
// Invariants (checked by CheckInvariants, asserted in tests):
//  - used bytes of the pool == sum over tenants == sum over sessions == sum
//    over agents;
//  - every page id in a block table is allocated, exactly once;
//  - a session's pages live only in its tenant's arenas;
//  - a failed call changes no state (allocations of a failed Reserve are
//    rolled back, arenas it created are removed again).
//  - pages of a session are in exactly one of: its block table, its pending
//    tables (the previous epoch, until the worker acks), its staged pages (a
//    compaction being copied); pending bytes add up across sessions;
//  - a session holds one slot record per committed token.
//
// Compaction (docs/compaction.md) runs inside Sync, the worker's step
// boundary; its copy releases mu_ for its duration (see Compact).
//
// Thread-safety: all public methods are thread-safe (one mutex; shard only
// after measuring contention).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/compaction/executor.h"
#include "daemon/memory/arena.h"
#include "daemon/pool/event_channel.h"
#include "daemon/pool/page_allocator.h"
#include "daemon/pool/types.h"

namespace polykv::policies {
class Policy;
}

namespace polykv::daemon {

using ArenaFactory = std::function<absl::StatusOr<std::unique_ptr<Arena>>(const ArenaOptions&)>;
using Clock = std::function<absl::Time()>;

struct KvPoolOptions {
  std::string tier = "host";               // For stats and metrics labels.
  uint64_t pool_bytes = 1ull << 30;        // Budget for all arenas together.
  uint64_t arena_bytes = 64ull << 20;      // Size of each new arena (last one may be smaller).
  uint64_t superblock_bytes = 2ull << 20;  // Slab unit inside arenas.
  uint32_t default_block_tokens = 16;
  uint32_t default_lease_ms = 5000;
  uint32_t min_lease_ms = 200;
  uint32_t max_lease_ms = 600000;
  uint32_t max_sessions = 4096;
  QosRecord default_qos;  // For agents without a record (agent_id ignored).
  // Pressure ladder (RunPressureLadder): below low_watermark free bytes the
  // daemon compacts sessions of the lowest priority first, then refuses their
  // reservations; at 2 x low_watermark free it stops refusing.
  // 0 = pool_bytes / 10.
  uint64_t low_watermark_bytes = 0;
  ArenaFactory arena_factory;  // Required.
  Clock clock;                 // Defaults to absl::Now.
};

// OK when `text` names a policy the daemon can run: a preset or '+'-joined
// components (policies::MakePolicy), optionally with parameters in braces,
// e.g. "h2o{window.size=64}". INVALID_ARGUMENT otherwise.
absl::Status ValidatePolicyName(const std::string& text);

class KvPool {
 public:
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(const KvPoolOptions& options);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // --- Session service ---
  absl::StatusOr<OpenResult> Open(const OpenRequest& request);
  absl::StatusOr<ReserveResult> Reserve(uint64_t session_id, absl::string_view token,
                                        const PeerCreds& peer, uint64_t num_tokens);
  absl::StatusOr<uint64_t> Commit(uint64_t session_id, absl::string_view token,
                                  const PeerCreds& peer, uint64_t committed_tokens);
  absl::StatusOr<SyncResult> Sync(uint64_t session_id, absl::string_view token,
                                  const PeerCreds& peer, uint64_t known_epoch);
  absl::Status Ack(uint64_t session_id, absl::string_view token, const PeerCreds& peer,
                   uint64_t epoch);
  absl::StatusOr<ReleaseResult> Release(uint64_t session_id, absl::string_view token,
                                        const PeerCreds& peer, uint64_t keep_tokens);
  // Returns the bytes freed.
  absl::StatusOr<uint64_t> Close(uint64_t session_id, absl::string_view token,
                                 const PeerCreds& peer);
  absl::StatusOr<HeartbeatResult> Heartbeat(uint64_t session_id, absl::string_view token,
                                            const PeerCreds& peer);
  absl::StatusOr<std::shared_ptr<EventChannel>> Watch(uint64_t session_id,
                                                      absl::string_view token,
                                                      const PeerCreds& peer);
  // A duplicate of the arena's fd for the fd socket; the caller owns it.
  // PERMISSION_DENIED unless the arena belongs to the session's tenant.
  absl::StatusOr<int> DupArenaFd(uint64_t session_id, absl::string_view token,
                                 const PeerCreds& peer, uint32_t arena_id);

  // --- Admin service ---
  PoolSummary Stats() const;
  std::vector<SessionSummary> ListSessions(absl::string_view tenant,
                                           absl::string_view agent_id) const;
  QosRecord GetQos(absl::string_view agent_id) const;
  absl::StatusOr<QosRecord> SetQos(const QosRecord& qos);
  absl::StatusOr<uint64_t> Evict(uint64_t session_id, absl::string_view reason);
  // Stops admitting sessions and reservations. With evict_after > 0, sessions
  // still open after it are evicted by ReclaimExpired.
  uint32_t Drain(absl::Duration evict_after);
  bool draining() const;

  // Reclaims sessions whose lease ran out (and, after a drain deadline, all
  // sessions). Returns the ids reclaimed. Called periodically by the daemon.
  std::vector<uint64_t> ReclaimExpired();

  // Stores per-slot metadata and attention mass for the session's policy.
  // FAILED_PRECONDITION when request.epoch is not the session's epoch;
  // INVALID_ARGUMENT for slots past the committed count, unknown roles or
  // tags, negative or non-finite attention. No error changes state.
  absl::Status ReportSlots(uint64_t session_id, absl::string_view token, const PeerCreds& peer,
                           const ReportSlotsRequest& request);

  // One round of the pressure ladder (called periodically by the daemon):
  // below the low watermark, asks sessions with a compacting policy, lowest
  // priority first, to compact down to max(guarantee, half their tokens)
  // at their next Sync; when nothing is left to compact, refuses new
  // reservations of the lowest priority class (with a retry hint) until free
  // bytes are back above 2 x low watermark. Returns the steps taken
  // ("compact", "refuse", "resume"), for logs.
  std::vector<std::string> RunPressureLadder();

  uint64_t used_bytes() const;
  // Bytes of old pages held until workers acknowledge newer epochs.
  uint64_t pending_bytes() const;
  uint32_t num_sessions() const;
  absl::Status CheckInvariants() const;

 private:
  struct Tenant {
    explicit Tenant(const PageAllocatorOptions& o) : allocator(o) {}
    PageAllocator allocator;
    std::map<uint32_t, std::unique_ptr<Arena>> arenas;
    uint32_t num_sessions = 0;
  };
  struct Session {
    uint64_t id = 0;
    std::string token;
    std::string agent_id;
    std::string tenant;
    ModelProfile profile;
    Priority priority = Priority::kNormal;
    PageFormat key_format = PageFormat::kF16;
    PageFormat value_format = PageFormat::kF16;
    uint32_t block_tokens = 16;
    uint32_t key_page_bytes = 0;    // size class
    uint32_t value_page_bytes = 0;  // size class
    std::vector<std::vector<PageId>> blocks;  // [block][2 * num_layers]
    uint64_t committed_tokens = 0;
    uint64_t epoch = 0;
    uint64_t acked_epoch = 0;
    uint64_t bytes = 0;
    uint32_t lease_ms = 0;
    absl::Time deadline;
    absl::Time last_seen;
    PeerCreds peer;
    std::vector<uint32_t> known_arenas;  // sorted
    std::shared_ptr<EventChannel> events;
    // Policy engine state. slots: [committed_tokens] what the policy ranks.
    std::vector<SlotRecord> slots;
    int64_t next_position = 0;   // logical position of the next committed token
    int32_t current_turn = 0;
    uint64_t want_tokens = 0;    // compaction target asked by the ladder; 0 = none
    // The previous epoch's tables, freed when the worker acks pending_epoch
    // (or the session ends): the daemon never frees pages a worker may read.
    std::vector<std::vector<PageId>> pending_blocks;
    uint64_t pending_epoch = 0;
    uint64_t pending_bytes = 0;
    // New pages of a compaction being copied (the lock is released during the
    // copy); while `compacting`, mutating calls are refused and destruction
    // is deferred (`doomed`) to the end of the compaction.
    std::vector<std::vector<PageId>> staged_blocks;
    bool compacting = false;
    bool doomed = false;
    SessionEventMsg doom_event;
    uint64_t reserved_tokens() const { return uint64_t(blocks.size()) * block_tokens; }
    uint64_t block_bytes() const {
      return uint64_t(profile.num_layers) * (key_page_bytes + value_page_bytes);
    }
  };

  explicit KvPool(const KvPoolOptions& options);
  absl::StatusOr<Session*> Authorize(uint64_t session_id, absl::string_view token,
                                     const PeerCreds& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Authorize, and FAILED_PRECONDITION while a compaction copies the
  // session's pages (calls that change the session must wait for it).
  absl::StatusOr<Session*> AuthorizeMutation(uint64_t session_id, absl::string_view token,
                                             const PeerCreds& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const QosRecord& QosFor(const std::string& agent_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Adds one arena to `tenant` if the budget allows (after reclaiming empty
  // arenas of tenants without sessions). Returns the new arena id.
  absl::StatusOr<uint32_t> GrowTenant(Tenant& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One page from the tenant's allocator, adding an arena when it is full;
  // arenas added are appended to `grown` so a failed caller can roll back.
  absl::StatusOr<PageId> AllocGrowing(Tenant& tenant, uint64_t bytes,
                                      std::vector<uint32_t>& grown)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<uint32_t> NextArenaId() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a newly allocated block's pages (K, V, K, V... by layer) as the
  // session's: its bytes, the pool's, its agent's and the per-format gauges.
  // FreeBlock is the inverse.
  void ChargeBlock(Session& s, const std::vector<PageId>& pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeBlock(Session& s, std::vector<PageId>& pages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BlockDesc Describe(const Session& s, uint32_t block_index) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::vector<ArenaExport> NewArenasFor(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees everything the session holds and forgets it. Returns bytes freed.
  uint64_t DestroySession(uint64_t session_id, SessionEventMsg last_event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseEmptyArenas(Tenant& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t TotalArenaBytes() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Compaction target for the session now (0 = none needed).
  uint64_t CompactionTarget(const Session& s) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Runs the session's policy down to `target` tokens and, when the plan
  // changes anything, writes NEW pages and publishes them at epoch + 1; the
  // old tables become pending. REQUIRES: no pending tables.
  absl::Status Compact(Session& s, uint64_t target) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<const policies::Policy*> PolicyFor(const std::string& spec)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreePending(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const KvPoolOptions options_;
  const absl::Time start_time_;

  mutable absl::Mutex mu_;
  // State below is protected by mu_.
  std::map<std::string, std::unique_ptr<Tenant>> tenants_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, QosRecord> qos_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> agent_bytes_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<PageFormat, bool>, uint64_t> pages_by_format_ ABSL_GUARDED_BY(mu_);
  uint64_t next_session_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint32_t next_arena_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t used_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time drain_evict_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  uint64_t lease_expiries_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_reservations_ ABSL_GUARDED_BY(mu_) = 0;
  // Policy engine.
  std::map<std::string, std::unique_ptr<policies::Policy>> policies_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> compactions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> evicted_tokens_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> merged_tokens_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> ladder_steps_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t shared_blocks_ ABSL_GUARDED_BY(mu_) = 0;  // output blocks reusing old pages
  uint64_t copied_blocks_ ABSL_GUARDED_BY(mu_) = 0;  // output blocks written anew
  // Reservations of this class and below are refused (pressure ladder).
  std::optional<Priority> refuse_up_to_ ABSL_GUARDED_BY(mu_);
};

}  // namespace polykv::daemon
