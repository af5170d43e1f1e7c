// KvPool: the façade the Session and Admin services call, in internal
// types. It owns one mutex and four parts that each think in one unit:
//   BlockPool    (block_pool.h)    bytes: tenants' arenas, blocks, accounting
//   SessionTable (session_table.h) sessions: tokens, leases, block tables
//   Admission    (admission.h)     QoS: guarantees, caps, watermarks, refusal
//   compaction/  (compactor.h, pressure_ladder.h, policy_registry.h)
//                decisions and copies over plain data, run WITHOUT the lock
// and sequences them: authorize, admit, allocate, publish. Its members are
// defined by concern: kv_pool.cc (sessions: open, reserve, commit, sync, ack,
// release, close, leases), kv_pool_compaction.cc (what a Sync compacts or
// moves; the pressure ladder), kv_pool_blocks.cc (blocks staged and freed
// in steps; RunStaged, the lock sequence of a staged_run.h: a
// compaction_run.h or a relocation_run.h), kv_pool_reports.cc (score
// reports), kv_pool_admin.cc (stats, QoS, evict, drain, invariants).
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
//  - a session holds one slot record per committed token;
//  - quarantined pages (below) stay charged to their agent and tenant.
//
// Quarantine (issue 14, finding 6). A worker maps its tenant's arenas
// read-write, so a session taken from it without its consent (evict, lease
// expiry, the end of a drain) may still be written by it: a worker paused
// past its lease writes on when resumed. Such a session's pages are not
// reused until its worker has learned it — its next call with the session's
// token on the session's own thread (any call but Heartbeat, Watch and the fd
// fetch, which run beside the writer), answered NOT_FOUND — or its process is
// gone (ReclaimExpired checks). Quarantined sessions count against their
// uid's session cap. Pages a worker gives back itself (Close, Release, Ack)
// are reused at once.
//
// Compaction (docs/compaction.md) runs inside Sync, the worker's step
// boundary: the policy decides on a snapshot and the pages are copied with
// mu_ released; only allocation and publication hold it, in short steps.
//
// Thread-safety: all public methods are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/compaction/compactor.h"
#include "daemon/compaction/policy_registry.h"
#include "daemon/compaction/pressure_ladder.h"
#include "daemon/memory/arena.h"
#include "daemon/memory/offload_store.h"
#include "daemon/pool/admission.h"
#include "daemon/pool/block_pool.h"
#include "daemon/pool/event_channel.h"
#include "daemon/pool/session_move.h"
#include "daemon/pool/session_table.h"
#include "daemon/pool/staged_run.h"
#include "daemon/pool/types.h"

namespace polykv::daemon {

using Clock = std::function<absl::Time()>;

struct KvPoolOptions {
  std::string tier = "host";               // For stats and metrics labels.
  // What arena_factory makes; sessions whose worker cannot map it are refused
  // at OpenSession (OpenRequest::can_map).
  ArenaKind arena_kind = ArenaKind::kHostShm;
  int cuda_device = -1;  // device arenas: the GPU they are on
  uint64_t pool_bytes = 1ull << 30;        // Budget for all arenas together.
  uint64_t arena_bytes = 64ull << 20;      // The largest arena (block_pool.h).
  uint64_t first_arena_bytes = 0;          // A tenant's first arena; 0 = arena_bytes / 16.
  uint64_t superblock_bytes = 2ull << 20;  // Slab unit inside arenas.
  uint32_t default_block_tokens = 16;
  uint32_t default_lease_ms = 5000;
  uint32_t min_lease_ms = 200;
  uint32_t max_lease_ms = 600000;
  uint32_t max_sessions = 4096;
  uint32_t max_sessions_per_uid = 0;  // 0 = max_sessions / 4 (at least 1)
  // Tenants bound to identities. A tenant named here is opened only by its
  // uids/gids; any other name is private to the uid that opens it (two uids
  // naming "t1" get two tenants), so pages never cross uids unless the
  // config says so (issue 14, finding 1).
  std::map<std::string, TenantBinding> tenant_bindings;
  // Tenants of its own (names not bound in the config) one uid may hold
  // sessions in at once: each takes arenas, so one uid opening many could
  // strand the pool's arena budget. 0 = no limit.
  uint32_t max_tenants_per_uid = 0;
  QosRecord default_qos;  // For agents without a record (agent_id ignored).
  // The uids a QoS record that names none applies to: the operator's
  // (polykvd's own uid, root and admin_uids; the daemon sets them). A session
  // of another uid named like an agent with a record gets the default QoS
  // under the identity "<agent>@uid<N>". Empty: every uid (pool unit tests).
  std::set<uid_t> operator_uids;
  // Pressure ladder (RunPressureLadder): below low_watermark free bytes the
  // daemon compacts sessions of the lowest priority first, then refuses their
  // reservations; at 2 x low_watermark free it stops refusing.
  // 0 = pool_bytes / 10.
  uint64_t low_watermark_bytes = 0;
  // High half of every session id (session_table.h); 0 = drawn at random.
  uint32_t instance = 0;
  ArenaFactory arena_factory;  // Required.
  Clock clock;                 // Defaults to absl::Now.
  // Offload tiers (issue 42, docs/offload.md): where idle sessions' pages
  // go when the ladder needs room, when an operator asks (polykvctl
  // offload), or once idle for offload_idle. Null: nothing is offloaded.
  std::shared_ptr<OffloadStore> offload_store;
  absl::Duration offload_idle = absl::InfiniteDuration();
  // Ladder step 4: evict idle sessions (lowest class, longest idle first)
  // when offload cannot make the room (ladder_evict_idle).
  bool ladder_evict_idle = false;
  // Whether a worker process still lives (pidfds in polykvd). Pages taken
  // from a live worker without its consent are quarantined, and retired
  // arenas kept, while it lives. Empty: nobody is watched (pages and arenas
  // change owner at once), as in-process tests without worker processes.
  ProcessWatcher process_watcher;
};

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
  // then_idle: the worker writes and reads nothing until its next Sync
  // (SyncRequest.then_idle): no tables are published at this call, and a
  // move parks the session at once while it is idle.
  absl::StatusOr<SyncResult> Sync(uint64_t session_id, absl::string_view token,
                                  const PeerCreds& peer, uint64_t known_epoch,
                                  bool then_idle = false);
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
  // A duplicate of the arena's fd for the fd socket (the caller owns it),
  // and the arena's size. PERMISSION_DENIED unless the arena belongs to the
  // session's tenant.
  absl::StatusOr<ArenaFd> DupArenaFd(uint64_t session_id, absl::string_view token,
                                     const PeerCreds& peer, uint32_t arena_id);

  // --- Shared prefixes (issue 42; kv_pool_prefix.cc, prefix_index.h) ---
  // Shares the session's leading full blocks, which hold `token_ids` (its
  // first tokens, committed and never compacted), with the later sessions
  // of its tenant and model whose context starts the same way. Returns how
  // many leading tokens of the session are in shared blocks now.
  // FAILED_PRECONDITION when those slots were compacted, requantized or
  // split by layer; INVALID_ARGUMENT for more ids than committed tokens.
  absl::StatusOr<uint64_t> SharePrefix(uint64_t session_id, absl::string_view token,
                                       const PeerCreds& peer,
                                       std::span<const int32_t> token_ids);
  // A fresh session (nothing reserved) takes the tenant's shared blocks that
  // hold the leading full blocks of `token_ids`, as committed tokens its
  // worker need not compute; as many as its agent's max_bytes allows (each
  // session holding a shared block is charged its bytes, the pool once).
  absl::StatusOr<AttachPrefixResult> AttachPrefix(uint64_t session_id, absl::string_view token,
                                                  const PeerCreds& peer,
                                                  std::span<const int32_t> token_ids);

  // --- Prefix cache, for an engine's connector (no session) ---
  // The same blocks, named by a stated space rather than a session's: an
  // engine that computes KV in its own memory finds, reads and stores whole
  // blocks by their token ids (docs/prefix-sharing.md). None of these holds
  // a block after it returns; what a store adds is cached (dropped first
  // when memory is needed) until a session attaches it.
  // How many leading tokens of `token_ids` the tenant's blocks hold (whole
  // blocks; 0 when the tenant has none).
  absl::StatusOr<uint64_t> LookupPrefix(const PrefixSpaceRequest& space,
                                        std::span<const int32_t> token_ids);
  // The pages of the blocks [first_block, first_block + max_blocks) of that
  // chain that exist (fewer, or none, where it ends), at most 16 MiB.
  absl::StatusOr<PrefixPages> ReadPrefix(const PrefixSpaceRequest& space,
                                         std::span<const int32_t> token_ids, uint64_t first_block,
                                         uint64_t max_blocks);
  // Stores blocks first_block, first_block + 1, ... of `token_ids`' chain
  // from `pages` (PrefixPages' layout); those before first_block must be
  // stored already (FAILED_PRECONDITION), those stored already are kept.
  // Returns the leading blocks the chain holds now; RESOURCE_EXHAUSTED when
  // the pool has no room even without cached blocks (those stored stay).
  absl::StatusOr<uint64_t> StorePrefix(const PrefixSpaceRequest& space,
                                       std::span<const int32_t> token_ids, uint64_t first_block,
                                       std::span<const std::string_view> pages);

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
  // Ends every session's event stream (Watch returns): the daemon is
  // stopping, and gRPC's shutdown would otherwise wait for each stream.
  void CloseEventStreams();
  bool draining() const;

  // Reclaims sessions whose lease ran out (and, after a drain deadline, all
  // sessions). Returns those reclaimed, each with why: "lease" (its lease
  // ran out) or "drain" (the drain's deadline passed). Called periodically by
  // the daemon.
  struct Reclaimed {
    uint64_t session_id;
    const char* reason;
  };
  std::vector<Reclaimed> ReclaimExpired();

  // Stores per-slot metadata and attention mass for the session's policy.
  // FAILED_PRECONDITION when request.epoch is not the session's epoch;
  // INVALID_ARGUMENT for slots past the committed count, unknown roles or
  // tags, negative or non-finite attention. No error changes state.
  absl::Status ReportSlots(uint64_t session_id, absl::string_view token, const PeerCreds& peer,
                           const ReportSlotsRequest& request);

  // --- Moving a session to another polykvd (session_move.h) ---
  // Source side. Asks the session's worker to park at its next Sync and
  // waits up to `wait` for it; DEADLINE_EXCEEDED, nothing changed, if it
  // does not; NOT_FOUND if the session ends meanwhile; FAILED_PRECONDITION
  // if it is moving already or its pages are not in host memory.
  absl::StatusOr<MoveSource> ParkForMove(uint64_t session_id, absl::Duration wait);
  // The moved session ends here (its pages wait, quarantined, until its
  // worker hears of the move); the worker's next Sync with the old id and
  // token gets `to`. NOT_FOUND if it was evicted during the move.
  absl::Status FinishMove(uint64_t session_id, MovedTo to);
  // The move failed: the session goes on here, its worker unparked.
  void AbortMove(uint64_t session_id);
  // Target side. A session like `m`, known to no one yet, with zeroed pages
  // for its bytes; the same checks as Open (tenant binding, session caps,
  // admission for its bytes, draining).
  absl::StatusOr<ImportTarget> BeginImport(const MovedSession& m);
  // Hands the imported session out: its id and token. The worker must
  // attach within the session's lease or it is reclaimed.
  absl::StatusOr<MovedTo> CompleteImport(uint64_t session_id);
  void AbortImport(uint64_t session_id);
  // The worker takes over an imported session: Open's reply for it (every
  // arena announced again) with its tables; the caller's uid must be the
  // session's.
  absl::StatusOr<OpenResult> Attach(uint64_t session_id, absl::string_view token,
                                    const PeerCreds& peer);

  // --- Offload tiers (kv_pool_offload.cc, docs/offload.md) ---
  // Moves an idle session's own pages (its worker said Idle and has called
  // nothing since) to the offload store and frees them; its next Sync
  // restores them into new pages (epoch + 1, the same bytes). Returns the
  // bytes offloaded. FAILED_PRECONDITION when offload is not configured or
  // the session is not idle (or is moving, or offloaded already);
  // RESOURCE_EXHAUSTED / UNAVAILABLE from the store (the session keeps its
  // pages); NOT_FOUND for no such session.
  absl::StatusOr<uint64_t> Offload(uint64_t session_id);
  // Offloads the sessions idle for options.offload_idle or longer (called
  // periodically by the daemon). Returns how many it offloaded.
  uint32_t OffloadIdle();

  // One round of the pressure ladder (called periodically by the daemon):
  // below the low watermark, asks sessions with a compacting policy, lowest
  // priority first, to requantize cold blocks or compact down to
  // max(guarantee, half their tokens) at their next Sync; offloads idle
  // sessions (with offload tiers), then evicts idle ones (with
  // ladder_evict_idle); when nothing is left, refuses new reservations of
  // the lowest priority class (with a retry hint) until free bytes are back
  // above 2 x low watermark (pressure_ladder.h). Returns the steps taken
  // ("requant", "compact", "offload", "offload_refused", "evict_idle",
  // "refuse", "resume"), for logs.
  std::vector<std::string> RunPressureLadder();
  // Why compactions failed since the last call (at most a few; each failure
  // also counts as ladder step "compaction_failed"), for the daemon's log.
  std::vector<std::string> TakeCompactionErrors();

  uint64_t used_bytes() const;
  // Bytes of old pages held until workers acknowledge newer epochs.
  uint64_t pending_bytes() const;
  uint32_t num_sessions() const;
  absl::Status CheckInvariants() const;

 private:
  // INVALID_ARGUMENT when a token of this profile could cost the daemon more
  // bytes of slot records than of pages, at the lowest precision its pages
  // may reach (values lowered by the ladder as far as `value_floor` allows,
  // where that shape exists): bounds the daemon's heap by pool_bytes for any
  // profile and page size.
  absl::Status CheckRecordsWithinPages(const ModelProfile& profile,
                                       const kernels::PageShape& page, PageFormat key_format,
                                       PageFormat value_format,
                                       std::optional<PageFormat> value_floor) const;

  // `agent_id` where its QoS record applies to sessions of `uid` (or there is
  // none and `uid` is the operator's), else "<agent_id>@uid<uid>".
  std::string QosIdentity(const std::string& agent_id, uid_t uid) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  explicit KvPool(const KvPoolOptions& options);
  absl::Time Now() const { return options_.clock ? options_.clock() : absl::Now(); }
  // Frees everything the session holds and forgets it (deferred to the end
  // of its compaction if one is running). Returns bytes freed.
  // `consented`: the worker asked (Close); otherwise the pages of a live
  // worker are quarantined.
  uint64_t DestroySession(uint64_t session_id, SessionEventMsg last_event, bool consented)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SessionTable's Authorize / AuthorizeMutation; a NOT_FOUND for a
  // quarantined session of this caller (token and uid) releases its pages:
  // the worker now knows.
  absl::StatusOr<Session*> Authorize(uint64_t id, absl::string_view token, const PeerCreds& peer,
                                     bool mutation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bytes of `table`'s own pages (each must be allocated in `tenant`; else
  // INTERNAL naming `who`); adds their number to held.pages, its shared
  // blocks to held.prefix_refs and their bytes to `shared`. For
  // CheckInvariants.
  absl::StatusOr<uint64_t> TableBytes(const std::string& tenant, const std::vector<Block>& table,
                                      absl::string_view who, BlockPool::Holdings& held,
                                      uint64_t& shared) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Frees a quarantined session's pages and forgets it.
  void ReleaseQuarantined(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The pool's key for `tenant` opened by `peer`: a bound tenant's name if
  // the peer may use it (else PERMISSION_DENIED), else the name qualified by
  // the uid (RESOURCE_EXHAUSTED past max_tenants_per_uid).
  // RESOURCE_EXHAUSTED when `uid` may open no more sessions (its quarantined
  // ones count).
  absl::Status CheckRoom(uid_t uid) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::string> TenantKey(const std::string& tenant, const PeerCreds& peer) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Open's reply for session `s` of QoS `qos`.
  OpenResult Describe(Session& s, const QosRecord& qos) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The forward a moved session's worker asks for (its old id, token and
  // uid), taken: the worker has stopped using the old pages.
  std::optional<MovedTo> TakeForward(uint64_t id, absl::string_view token, const PeerCreds& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the agent's policy (its QoS `qos`, read only until the lock is
  // first released: an operator may change it meanwhile) down to `target`
  // tokens, with the ladder's requantization step `cold` if set: a
  // CompactionRun, whose phases this sequences with the lock
  // (compaction_run.h). When the plan changes anything, NEW pages are
  // published at epoch + 1; the old tables become pending.
  // NOT_FOUND when the session was destroyed meanwhile (then `s` is gone).
  // REQUIRES: no pending tables, not busy.
  // layer_holes: s's (LayerHoles).
  absl::Status Compact(Session& s, const QosRecord& qos, uint64_t target,
                       std::vector<LayerHole> layer_holes,
                       std::optional<policies::ColdStep> cold = std::nullopt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At s's step boundary (Sync, when the worker holds the current tables
  // and has acknowledged the previous ones): the compaction its budget or
  // the ladder asks for, if any (kv_pool_compaction.cc). NOT_FOUND when the
  // session was destroyed meanwhile; any other failure is recorded
  // (CompactionFailed) and the session keeps its tables.
  absl::Status CompactAtStepBoundary(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves s's blocks that have pages in arenas being vacated
  // (BlockPool::InVacatingArena) into new pages, byte for byte: a
  // RelocationRun, published at epoch + 1 (the old blocks become pending);
  // no slot changes. On failure the arenas take allocations again.
  // NOT_FOUND when the session was destroyed meanwhile.
  // REQUIRES: at s's step boundary (in Sync), no pending tables, not busy.
  absl::Status Relocate(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The staged half of a run (staged_run.h), sequenced with the lock: its
  // new blocks staged a few per hold, Address, Copy with the lock released,
  // Publish, the old blocks it returns pending, epoch + 1, s no longer busy.
  // On failure the staged blocks are freed and s keeps its tables (no room
  // for the new pages is UNAVAILABLE: the next Sync may find some);
  // NOT_FOUND when s was destroyed meanwhile (then it is gone).
  // REQUIRES: s busy, no pending tables. Defined in kv_pool_blocks.cc.
  absl::Status RunStaged(Session& s, StagedRun& run) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Step 1 of the ladder for `s`: fills c's requant_* fields (none when its
  // last requantization step found nothing and no block has filled since).
  void DescribeRequant(const Session& s, LadderCandidate& c) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `count` new blocks for a Reserve of `s`, all or nothing; more than a few
  // are allocated in steps, yielding the lock between them. NOT_FOUND when
  // `s` was destroyed meanwhile (then it is gone).
  absl::StatusOr<std::vector<Block>> AllocateForReserve(Session& s, uint64_t count)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases mu_ and takes it back (a compaction's pause, so other sessions'
  // calls go on). False when `s` was doomed meanwhile: the caller must stop.
  bool Yield(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Appends new blocks of `shapes` to s's staged table, a few per hold of
  // the lock (REQUIRES: s busy). With `in_flight` (a reservation), the pages
  // are zeroed and each step's bytes leave admission's in-flight count as
  // they land. OK; the allocation error (what
  // was staged stays staged); or ABORTED when s was doomed during a yield.
  absl::Status StageBlocks(Session& s, const std::vector<BlockShape>& shapes, bool in_flight)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees `blocks` (one of s's tables) from the back, a few blocks per hold
  // of the lock; with `pending`, each block leaves the pending byte counts.
  // False when `s` was doomed meanwhile; what is left is freed by the
  // deferred destruction.
  bool FreeGradually(Session& s, std::vector<Block>& blocks, bool pending = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreePending(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a failed compaction of `s`: counted and kept for the log; not
  // retried until `what` changes, unless it was UNAVAILABLE (no room for its
  // new pages now: the next Sync tries again).
  void CompactionFailed(Session& s, PolicyInputs::Failure what, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives each layer its own slot records, for a policy that selects per
  // layer: copies of the session's (until then every layer holds the same
  // tokens). No-op once split. REQUIRES: !s.busy (Compact reads the records
  // without the lock).
  void SplitLayerRecords(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Offload's work on `s` (REQUIRES: s idle, not busy, not moving, not
  // offloaded, offload configured): the copy runs with mu_ released (s busy
  // and offloading). NOT_FOUND when s was destroyed meanwhile.
  absl::StatusOr<uint64_t> OffloadLocked(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Brings an offloaded s back into new pages at epoch + 1 (a RestoreRun
  // through RunStaged). UNAVAILABLE when the pool has no room now (s stays
  // offloaded); DATA_LOSS when the store lost its pages (s is destroyed);
  // NOT_FOUND when s was destroyed meanwhile.
  absl::Status Restore(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits while `id` is being offloaded; the session afterwards, or null.
  Session* AwaitOffloaded(uint64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Finishes a destruction deferred while `s` was busy.
  absl::Status FinishDoomed(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const KvPoolOptions options_;
  const absl::Time start_time_;
  PolicyRegistry policies_;  // its own lock

  mutable absl::Mutex mu_;
  // State below is protected by mu_.
  BlockPool blocks_ ABSL_GUARDED_BY(mu_);
  SessionTable sessions_ ABSL_GUARDED_BY(mu_);
  Admission admission_ ABSL_GUARDED_BY(mu_);
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time drain_evict_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  uint64_t lease_expiries_ ABSL_GUARDED_BY(mu_) = 0;
  // Compaction counters (since start, by QoS policy text / ladder step).
  std::map<std::string, uint64_t> compactions_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> evicted_tokens_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> merged_tokens_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint64_t> ladder_steps_ ABSL_GUARDED_BY(mu_);
  uint64_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, QuarantinedSession> quarantine_ ABSL_GUARDED_BY(mu_);  // by session id
  // Sessions moved away, by their old id, until their worker asks, is gone,
  // or the deadline passes (ReclaimExpired): where they went.
  struct Forward {
    std::string token;
    uid_t uid = 0;
    std::shared_ptr<const ProcessRef> process;
    MovedTo to;
    absl::Time deadline;
  };
  // How long a forward waits for its worker: a parked worker asks within
  // milliseconds; this only bounds what a worker that vanished leaves.
  static constexpr absl::Duration kForwardTtl = absl::Minutes(10);
  std::map<uint64_t, Forward> forwards_ ABSL_GUARDED_BY(mu_);
  uint64_t shared_blocks_ ABSL_GUARDED_BY(mu_) = 0;  // output blocks reusing old pages
  uint64_t copied_blocks_ ABSL_GUARDED_BY(mu_) = 0;  // output blocks written anew
  uint64_t prefix_hits_ ABSL_GUARDED_BY(mu_) = 0;    // full blocks attached
  uint64_t prefix_misses_ ABSL_GUARDED_BY(mu_) = 0;  // full blocks asked for, not found
  uint64_t relocated_blocks_ ABSL_GUARDED_BY(mu_) = 0;  // moved out of vacated arenas
  OffloadCounts offload_counts_ ABSL_GUARDED_BY(mu_);
  static constexpr size_t kMaxCompactionErrors = 16;
  std::vector<std::string> compaction_errors_ ABSL_GUARDED_BY(mu_);
};

}  // namespace polykv::daemon
