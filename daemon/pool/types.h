// Internal vocabulary of the pool room. The rpc room translates these to and
// from proto messages; nothing below rpc/ knows about protobuf.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "daemon/memory/arena.h"
#include "daemon/memory/offload_store.h"
#include "daemon/pool/page_allocator.h"
#include "kernels/model_profile.h"
#include "kernels/page_format.h"
#include "policies/score_stream.h"
#include "policies/session_view.h"

namespace polykv::daemon {

using kernels::DType;
using kernels::ModelProfile;
using kernels::PageFormat;

// Wire values equal proto PriorityClass.
enum class Priority { kBestEffort = 1, kLow = 2, kNormal = 3, kHigh = 4, kCritical = 5 };
absl::string_view PriorityName(Priority p);  // "best_effort", "low", ...
std::optional<Priority> ParsePriority(absl::string_view name);

struct QosRecord {
  std::string agent_id;
  Priority priority = Priority::kNormal;
  uint64_t guaranteed_bytes = 0;
  uint64_t max_bytes = 0;  // 0 = no cap
  std::optional<PageFormat> key_floor;
  std::optional<PageFormat> value_floor;
  // The formats and page size a session of this agent is opened with when
  // its worker asks for none (then the floors apply); nullopt / 0: the
  // model's dtype and the daemon's block_tokens.
  std::optional<PageFormat> key_format;
  std::optional<PageFormat> value_format;
  uint32_t block_tokens = 0;
  std::string policy = "full";
  // Tokens per session the policy compacts down to (0 = no budget), and the
  // share of the session's context it may keep (0 = none): the budget is
  // max(budget_tokens, ceil(budget_fraction x context)) (compactor.h
  // SessionBudget). A session is compacted past the budget times the
  // policy's trigger.
  uint64_t budget_tokens = 0;
  double budget_fraction = 0;
  // The uids whose sessions of this agent the record applies to; empty: the
  // operator's (KvPoolOptions::operator_uids). Ignored in the default QoS.
  std::set<uid_t> uids;
};

// Who is on the other end of a connection (SO_PEERCRED at accept time).
struct PeerCreds {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Who may open sessions in a tenant named in the config (polykvd.yaml
// `tenants:`): a peer whose uid or primary gid is listed.
struct TenantBinding {
  std::set<uid_t> uids;
  std::set<gid_t> gids;
  bool Allows(const PeerCreds& p) const { return uids.contains(p.uid) || gids.contains(p.gid); }
};

struct OpenRequest {
  std::string agent_id;
  std::string tenant;
  ModelProfile profile;
  std::optional<PageFormat> key_format;    // nullopt: follow dtype
  std::optional<PageFormat> value_format;  // nullopt: follow dtype
  uint32_t block_tokens = 0;               // 0 = default
  std::optional<Priority> priority_hint;
  uint32_t lease_ms = 0;  // 0 = default
  PeerCreds peer;
  // Arena kinds the worker can map; empty = not stated (any is handed out).
  std::vector<ArenaKind> can_map;
};

// An arena's descriptor for a worker (the fd socket's reply), and the bytes
// to map: a VMM fd has no size of its own to ask.
struct ArenaFd {
  int fd = -1;  // owned by the receiver
  uint64_t size_bytes = 0;
};

// A shared prefix block's entry in its tenant's index (prefix_index.h); 0:
// a private block.
using PrefixId = uint64_t;

struct PageDesc {
  PageId page_id = kNoPage;
  uint32_t arena_id = 0;
  uint64_t offset = 0;
  uint32_t size_bytes = 0;
  uint32_t layer = 0;
  bool is_value = false;
  PageFormat format = PageFormat::kF16;
  uint32_t block_index = 0;
};

// pages[2 * layer] is K, pages[2 * layer + 1] is V.
struct BlockDesc {
  uint32_t block_index = 0;
  std::vector<PageDesc> pages;
};

struct OpenResult {
  uint64_t session_id = 0;
  std::string token;
  uint32_t lease_ms = 0;
  uint32_t block_tokens = 0;
  PageFormat key_format = PageFormat::kF16;
  PageFormat value_format = PageFormat::kF16;
  uint32_t key_page_bytes = 0;
  uint32_t value_page_bytes = 0;
  std::vector<ArenaExport> arenas;
  // Where every arena of the pool is (KvPoolOptions::arena_kind).
  ArenaKind arena_kind = ArenaKind::kHostShm;
  int cuda_device = -1;
  uint64_t epoch = 0;
  QosRecord qos;
  // What the worker should report: the streams the agent's policy reads.
  policies::WantedStreams wants;
  // Attach only: the session's tables at `epoch`.
  std::vector<BlockDesc> blocks;
};

struct ReserveResult {
  std::vector<BlockDesc> blocks;
  uint64_t reserved_tokens = 0;
  uint64_t session_bytes = 0;
  std::vector<ArenaExport> new_arenas;
};

// A fresh session's shared prefix (KvPool::AttachPrefix): its first
// `attached_tokens` tokens, committed, in the blocks described.
struct AttachPrefixResult {
  uint64_t attached_tokens = 0;
  ReserveResult reserve;
};

// The page format a model's dtype stores unless asked otherwise.
inline PageFormat FormatForDtype(DType d) {
  switch (d) {
    case DType::kF32: return PageFormat::kF32;
    case DType::kBF16: return PageFormat::kBF16;
    case DType::kF16: return PageFormat::kF16;
  }
  return PageFormat::kF16;
}

// The prefix cache's space as an engine's connector names it, with no
// session (KvPool::LookupPrefix and after): the tenant (bound to `peer` as
// OpenSession binds it), the model, the page formats and the block size.
// Blocks are shared with worker sessions whose fill shape is the same.
struct PrefixSpaceRequest {
  std::string tenant;
  ModelProfile profile;
  std::optional<PageFormat> key_format;    // nullopt: FormatForDtype
  std::optional<PageFormat> value_format;  // nullopt: FormatForDtype
  uint32_t block_tokens = 0;
  PeerCreds peer;
};

// Pages of whole prefix blocks, block by block, K then V of each layer, each
// the format's page (kernels::PageBytes) without the size class's padding.
struct PrefixPages {
  uint64_t first_block = 0;
  uint64_t blocks = 0;
  std::vector<std::string> pages;  // 2 * layers per block
};

// Where a moved session went (session_move.h), as its worker learns at its
// next Sync: the target's session socket, and the session there.
struct MovedTo {
  std::string socket_path;
  uint64_t session_id = 0;
  std::string token;
};
struct SyncResult {
  uint64_t epoch = 0;
  bool changed = false;
  std::vector<BlockDesc> blocks;
  uint64_t committed_tokens = 0;
  std::vector<ArenaExport> new_arenas;
  // When changed: [committed_tokens] logical position and multiplicity of
  // each slot of the new tables.
  std::vector<int64_t> slot_positions;
  std::vector<uint32_t> slot_counts;
  // What the worker should report now (the agent's QoS may have changed
  // since Open).
  policies::WantedStreams wants;
  // When changed and the layers hold their own slots: [num_layers x
  // committed_tokens] positions, layer-major; else empty.
  std::vector<int64_t> layer_slot_positions;
  // The worker is parked for a move (session_move.h): tables unchanged.
  bool parked = false;
  // When changed: the same slots, the same bytes, in other pages (a restore
  // or a relocation since known_epoch, nothing else).
  bool same_slots = false;
  // The session moved (session_move.h): nothing else is set.
  std::optional<MovedTo> moved_to;
};

struct ReportSlotsRequest {
  uint64_t epoch = 0;
  uint64_t first_slot = 0;
  // Checked by KvPool::ReportSlots: enums in range, turn >= 0.
  std::vector<policies::SlotMeta> slots;  // for [first_slot, first_slot + size)
  // At most one entry per stream; checked by KvPool::ReportSlots (sizes,
  // values by the stream's rule).
  std::vector<policies::ScoreValues> scores;
  uint32_t current_turn = 0;          // 0 = unchanged
};

struct ReleaseResult {
  uint64_t reserved_tokens = 0;
  uint64_t committed_tokens = 0;
  uint64_t session_bytes = 0;
};

struct HeartbeatResult {
  uint32_t lease_ms = 0;
  uint64_t epoch = 0;
  bool draining = false;
};

struct SessionSummary {
  uint64_t session_id = 0;
  std::string agent_id;
  std::string tenant;
  Priority priority = Priority::kNormal;
  uint64_t reserved_tokens = 0;
  uint64_t committed_tokens = 0;
  uint64_t bytes = 0;
  uint64_t epoch = 0;
  PageFormat key_format = PageFormat::kF16;
  PageFormat value_format = PageFormat::kF16;
  PeerCreds peer;
  double idle_seconds = 0;
  ModelProfile profile;
  std::string offloaded_to;  // "host" or "disk" while offloaded; "" in the pool
};

struct TenantSummary {
  std::string tenant;
  uint64_t used_bytes = 0;
  uint64_t arena_bytes = 0;
  uint32_t num_sessions = 0;
};

// Offload tiers (docs/offload.md): counters since start, and how long
// restores took (a histogram: restore_buckets[i] counts those at or under
// kRestoreSecondsBounds[i] and over the bound before; the last, the rest).
inline constexpr std::array<double, 10> kRestoreSecondsBounds = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5};
struct OffloadCounts {
  uint64_t offloaded = 0;     // sessions offloaded
  uint64_t offloaded_bytes = 0;
  uint64_t restored = 0;      // sessions restored
  uint64_t refused = 0;       // offloads the store could not take (the session stayed)
  uint64_t lost = 0;          // restores whose pages the store had lost (session ended)
  uint64_t evicted_idle = 0;  // idle sessions the ladder evicted
  std::array<uint64_t, kRestoreSecondsBounds.size() + 1> restore_buckets{};
  double restore_seconds_sum = 0;
  void ObserveRestore(double seconds) {
    size_t i = 0;
    while (i < kRestoreSecondsBounds.size() && seconds > kRestoreSecondsBounds[i]) ++i;
    ++restore_buckets[i];
    restore_seconds_sum += seconds;
  }
};

struct PoolSummary {
  std::string tier;
  uint64_t pool_bytes = 0;
  uint64_t arena_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t num_arenas = 0;
  uint64_t num_pages = 0;
  uint64_t superblock_bytes = 0;
  uint64_t num_superblocks_used = 0;
  std::vector<TenantSummary> tenants;
  uint32_t num_sessions = 0;
  bool draining = false;
  uint64_t lease_expiries = 0;
  uint64_t refused_reservations = 0;
  // For metrics: pages by (format, kind), sessions by priority, bytes by agent.
  std::vector<std::pair<std::pair<PageFormat, bool>, uint64_t>> pages_by_format;
  std::vector<std::pair<Priority, uint32_t>> sessions_by_priority;
  std::vector<std::pair<std::string, uint64_t>> bytes_by_agent;  // descending
  // Policy engine (counters since start, by QoS policy name / ladder step).
  uint64_t pending_bytes = 0;  // old pages waiting for a worker's Ack
  uint64_t compaction_shared_blocks = 0;  // output blocks that reused old pages
  uint64_t compaction_copied_blocks = 0;  // output blocks written into new pages
  std::vector<std::pair<std::string, uint64_t>> compactions_by_policy;
  std::vector<std::pair<std::string, uint64_t>> evicted_tokens_by_policy;
  std::vector<std::pair<std::string, uint64_t>> merged_tokens_by_policy;
  std::vector<std::pair<std::string, uint64_t>> ladder_steps;  // step -> count
  // Memory that left the pool's use but may still be touched by an old
  // mapper (issue 14, findings 6 and 10); both count against pool_bytes.
  uint64_t retired_arenas = 0;          // taken back, old mappers still alive
  uint64_t retired_resident_bytes = 0;  // memory those still hold (0 unless rewritten)
  uint32_t quarantined_sessions = 0;    // taken from a live worker without its consent
  uint64_t quarantined_bytes = 0;       // their pages, not reused until it knows
  // Sparsely used arenas whose pages move out at their sessions' next Sync.
  uint64_t vacating_arenas = 0;
  uint64_t relocated_blocks = 0;  // counter: blocks moved out of them
  // Shared prefixes (prefix_index.h): bytes of blocks tables hold, of
  // cached ones no table holds; counters of full blocks attached (hits) and
  // asked for but not found (misses), and of cached blocks dropped for room.
  uint64_t prefix_shared_bytes = 0;
  uint64_t prefix_cached_bytes = 0;
  uint64_t prefix_hit_blocks = 0;
  uint64_t prefix_miss_blocks = 0;
  uint64_t prefix_dropped_blocks = 0;
  // Offload tiers: sessions out of the pool now and their bytes; the
  // store's tiers (absent when offload is off); counters.
  uint32_t offloaded_sessions = 0;
  uint64_t offloaded_bytes = 0;
  std::optional<OffloadStore::Stats> offload_store;
  OffloadCounts offload;
};

// Daemon events delivered to a session's watchers.
struct SessionEventMsg {
  enum class Type { kEpoch = 1, kQos = 2, kDrain = 3, kEvicted = 4, kMoved = 5 };
  Type type = Type::kEpoch;
  uint64_t epoch = 0;
  std::string message;
};

}  // namespace polykv::daemon
