// Sessions: who holds what. A Session is one worker's claim on the pool — its
// capability token and lease, its block tables by epoch, and what its policy
// knows about each committed token. The SessionTable finds sessions by id and
// authorizes callers (token, then uid), renewing the lease of every
// authorized call.
//
// Thread-safety: none; the owner (KvPool) serializes calls under its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/compaction/executor.h"
#include "daemon/memory/process_ref.h"
#include "daemon/pool/block_pool.h"
#include "daemon/pool/event_channel.h"
#include "daemon/pool/types.h"

namespace polykv::daemon {

// The worker end of a session: who it is and until when it is trusted.
struct Lease {
  PeerCreds peer;
  std::shared_ptr<const ProcessRef> process;  // the worker, while watched
  uint32_t lease_ms = 0;
  absl::Time deadline;
  absl::Time last_seen;
  void Renew(absl::Time now) {
    last_seen = now;
    deadline = now + absl::Milliseconds(lease_ms);
  }
};

// A session's pages by epoch. Each page is in exactly one of: `blocks` (the
// current tables), `pending` (the previous epoch's pages the new tables do
// not share, freed when the worker acks `pending_epoch` — the daemon never
// frees pages a worker may read), `staged` (a compaction's new pages while it
// copies).
struct BlockTables {
  std::vector<Block> blocks;  // [block]
  uint64_t committed_tokens = 0;
  uint64_t epoch = 0;
  uint64_t acked_epoch = 0;
  std::vector<Block> pending;
  uint64_t pending_epoch = 0;
  uint64_t pending_bytes = 0;
  std::vector<Block> staged;
  // The last epoch whose tables changed the slots or their bytes (not only
  // where they are: StagedRun::KeepsSlots).
  uint64_t slots_epoch = 0;
};

// What the policy ranks: one record per committed slot.
struct PolicyInputs {
  // The slot records, each list [committed_tokens]: one list that every
  // layer holds, or one per layer ([num_layers]) once a policy that selects
  // per layer (select=layer) split them, at its first per-layer report or
  // compaction. Split lists stay split even if the QoS changes back: the
  // layers' slots may differ from then on. records[0] is what Sync's
  // slot_positions describe.
  std::vector<std::vector<SlotRecord>> records{1};
  bool layers_apart() const { return records.size() > 1; }
  // The last compaction's Plan::log_count_bias: false (merge.bias=0) sends
  // the worker counts of 1, so a merged slot attends as one token; the
  // records keep their true counts for the next plan.
  bool log_count_bias = true;
  int64_t next_position = 0;      // logical position of the next committed token
  // next_position when the held attention mass was last aged (at an
  // attention report): the next report ages it by wants.attention_decay to
  // the power of the tokens committed since.
  int64_t attention_aged_at = 0;
  int32_t current_turn = 0;
  uint64_t want_tokens = 0;       // compaction target asked by the ladder; 0 = none
  uint64_t want_requant_blocks = 0;  // blocks the ladder asks to requantize; 0 = none
  // Committed tokens when a requantization step last found nothing to do:
  // the ladder asks again only once a new full block is past it.
  uint64_t requant_idle_at = 0;
  // What the agent's policy reads (set at Open and by SetQos; Sync tells the
  // worker).
  policies::WantedStreams wants;
  // [num_layers] the per-layer streams' values (entropy), folded by each
  // stream's rule; unreported (NaN) until a report reaches them. Empty
  // until the first report of one.
  std::vector<policies::LayerScores> layer_scores;
  // The worker has reported importance (ReportSlots) at least once.
  bool importance_reported = false;
  // ReportSlots calls accepted so far.
  uint64_t reports = 0;
  // Tokens the daemon pinned as a shared prefix the session holds whole
  // (positions 0 .. prefix_pinned - 1; kv_pool_compaction.cc
  // PinSharedPrefix); unpinned when it no longer does.
  uint64_t prefix_pinned = 0;
  // A compaction that failed is not retried (nor counted again) until the
  // session changes: more tokens, a report, another policy text. Otherwise
  // every idle Sync ran and counted the same failure. (One that found no
  // room for its new pages is not recorded here: KvPool::CompactionFailed.)
  struct Failure {
    uint64_t committed = 0;
    uint64_t reports = 0;
    std::string policy;
    bool operator==(const Failure&) const = default;
  };
  std::optional<Failure> failed;
};

struct Session {
  uint64_t id = 0;
  std::string token;
  BlockAccount account;  // tenant (the pool's key, see KvPoolOptions), agent, bytes held
  std::string tenant_name;  // as the worker named it
  ModelProfile profile;
  Priority priority = Priority::kNormal;
  uint32_t block_tokens = 16;
  BlockShape shape;  // the fill shape: of every reserved block (compaction may store coarser)
  Lease lease;
  BlockTables tables;
  PolicyInputs policy;
  std::vector<uint32_t> known_arenas;  // sorted ids the worker has been sent
  std::shared_ptr<EventChannel> events;
  // While a call works on the session's pages in steps, releasing the pool
  // lock between them (a compaction in Sync, the frees of an Ack, a large
  // Reserve), other calls that change the session are refused and its
  // destruction is deferred (`doomed`) until that call is back under the lock.
  bool busy = false;
  bool doomed = false;
  // Moving to another polykvd (session_move.h): asked to park, parked (its
  // worker waits in Sync, the session is busy), or being imported here.
  enum class Move { kNone, kRequested, kParked, kImporting };
  Move move = Move::kNone;
  // Its worker said it is idle (Sync then_idle) and has called nothing since:
  // it touches no page until its next Sync, so a move may park it at once.
  bool idle = false;
  absl::Time idle_since;  // when it last went idle
  // Offloaded (kv_pool_offload.cc, docs/offload.md): its own pages are in
  // the offload store under its id, freed here; `blocks` is its table, the
  // own blocks without pages (their shapes say what to restore), the shared
  // prefix blocks still held. tables.blocks is empty meanwhile. Its next
  // Sync restores it; its other calls but Close are refused.
  struct Offloaded {
    std::vector<Block> blocks;
    uint64_t bytes = 0;  // its own pages' bytes, in the store
  };
  std::optional<Offloaded> offloaded;
  bool offloading = false;  // its pages are being copied out (busy too)
  bool doom_consented = false;
  SessionEventMsg doom_event;

  const std::string& agent_id() const { return account.agent_id; }
  const std::string& tenant() const { return account.tenant; }
  uint64_t reserved_tokens() const { return uint64_t(tables.blocks.size()) * block_tokens; }
  // One page's shape: block_tokens rows of num_kv_heads x head_dim.
  kernels::PageShape page_shape() const {
    return {static_cast<int>(block_tokens), static_cast<int>(profile.num_kv_heads),
            static_cast<int>(profile.head_dim)};
  }
};

// A layer's pages start at its first block and go on to the end of the
// table (right-aligned: the worker appends to every layer alike); a block's
// shape counts the layers it has pages of; only a session whose layers hold
// their own records may have layers start late. INTERNAL naming the fault.
absl::Status CheckLayerPresence(const Session& s);

// What is left of a session taken from a live worker (kv_pool.h, Quarantine):
// its pages, still charged, and how to recognize its worker.
struct QuarantinedSession {
  std::string token;
  uid_t uid = 0;
  std::shared_ptr<const ProcessRef> process;
  BlockAccount account;
  std::vector<Block> blocks;
};

// Session ids are [instance:32][counter:32]: `instance` is drawn anew each
// time polykvd starts, so an id from before a restart is never another
// session's, and the error can say what happened.
class SessionTable {
 public:
  // instance: nonzero. max_per_uid: sessions one uid may hold at once, so
  // that one worker cannot take every slot (issue 14, finding 5).
  SessionTable(uint32_t max_sessions, uint32_t max_per_uid, uint32_t instance)
      : max_sessions_(max_sessions),
        max_per_uid_(max_per_uid),
        instance_(instance),
        next_id_((uint64_t(instance) << 32) | 1) {}

  // RESOURCE_EXHAUSTED at max_sessions, or when `uid` holds max_per_uid
  // (counting `also_held` sessions held elsewhere, e.g. quarantined).
  absl::Status CheckRoom(uid_t uid, uint32_t also_held = 0) const;
  // Takes the next id; `s.id` is set.
  // REQUIRES: fewer than 2^32 - 1 sessions opened by this instance.
  // The distinct tenant keys of `uid`'s sessions.
  std::set<std::string> TenantsOf(uid_t uid) const;
  Session& Insert(Session s);
  void Erase(uint64_t id);

  // The session if `token` and `peer.uid` match, its lease renewed at `now`.
  // NOT_FOUND for an unknown id, PERMISSION_DENIED otherwise.
  absl::StatusOr<Session*> Authorize(uint64_t id, absl::string_view token, const PeerCreds& peer,
                                     absl::Time now);
  // Authorize, and FAILED_PRECONDITION while the session is `busy` (calls
  // that change the session must wait for the one working on it).
  absl::StatusOr<Session*> AuthorizeMutation(uint64_t id, absl::string_view token,
                                             const PeerCreds& peer, absl::Time now);

  Session* Find(uint64_t id);
  bool HasOtherOf(const std::string& agent_id, uint64_t except_id) const;
  // Ids whose lease ran out at `now` (all of them if `all`), skipping busy
  // sessions: their worker is inside a call, its lease just renewed.
  std::vector<uint64_t> Expired(absl::Time now, bool all) const;

  size_t size() const { return sessions_.size(); }
  auto begin() { return sessions_.begin(); }
  auto end() { return sessions_.end(); }
  auto begin() const { return sessions_.begin(); }
  auto end() const { return sessions_.end(); }

 private:
  const uint32_t max_sessions_;
  const uint32_t max_per_uid_;
  const uint32_t instance_;
  std::map<uint64_t, Session> sessions_;
  std::map<uid_t, uint32_t> per_uid_;
  uint64_t next_id_;
};

}  // namespace polykv::daemon
