// libpolykv_client: how an inference worker gets its KV cache from polykvd.
//
//   auto client = polykv::Client::Connect("/run/polykv/polykvd.sock");
//   polykv::SessionOptions o;
//   o.agent_id = "coder-1"; o.tenant = "team-a";
//   o.profile = {30, 3, 64, polykv::DType::kF32};
//   auto session = (*client)->OpenSession(o);          // maps the arenas
//   auto blocks = (*session)->Reserve(256);            // ahead, in batches
//   ... write K/V into blocks[i].pages[2*layer(+1)].addr ...
//   (*session)->Commit(n);                             // batched, not per token
//   // ~Session closes the session and unmaps.
//
// Nothing here is on the per-token path: reserve ahead, write pages in place
// (shared memory), commit in batches. A background thread renews the lease.
//
// Errors are absl::Status with the daemon's message; codes follow gRPC
// (RESOURCE_EXHAUSTED over quota, PERMISSION_DENIED bad token, ...).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/model_profile.h"
#include "kernels/page_format.h"
#include "policies/score_stream.h"
#include "policies/session_view.h"

namespace polykv {

using kernels::DType;
using kernels::ModelProfile;
using kernels::PageFormat;
using policies::BlockKind;
using policies::Role;
// Metadata of one slot for the daemon's policy.
using SlotMeta = policies::SlotMeta;
// What a worker measures for the daemon's policy (policies/score_stream.h).
using policies::ScoreStream;
using policies::ScoreValues;
using policies::WantedStreams;

// Where a worker can use pages. A daemon whose pages are elsewhere refuses
// the session at OpenSession (FAILED_PRECONDITION), before it holds anything.
enum class PageMemory {
  kHost,    // pages in host shared memory; Page::addr a host address
  kDevice,  // pages in this node's GPU memory; Page::addr a device address
  kEither,  // whichever the daemon has; Page::on_device says which
};

struct SessionOptions {
  std::string agent_id;
  std::string tenant = "default";
  ModelProfile profile;
  // nullopt: the format of profile.dtype. Either way the daemon raises a
  // format to the agent's precision floor; SessionInfo has the granted ones.
  std::optional<PageFormat> key_format;
  std::optional<PageFormat> value_format;
  uint32_t block_tokens = 0;  // 0 = daemon default (16)
  uint32_t lease_ms = 0;      // 0 = daemon default
  bool heartbeat = true;      // Renew the lease from a background thread.
  // kDevice and kEither need a client built with CUDA on a node with a GPU
  // (else OpenSession is FAILED_PRECONDITION for kDevice; kEither asks for
  // host pages only).
  PageMemory page_memory = PageMemory::kHost;
};

// One page a worker may read and write, already mapped into this process.
struct Page {
  uint64_t page_id = 0;
  uint32_t arena_id = 0;
  uint64_t offset = 0;
  uint32_t size_bytes = 0;
  uint32_t layer = 0;
  bool is_value = false;
  PageFormat format = PageFormat::kF16;
  // Mapped address: in host memory, or, where on_device, a device address on
  // the daemon's GPU (SessionInfo::cuda_device). Valid while the session lives.
  void* addr = nullptr;
  bool on_device = false;
};

// pages[2 * layer] holds keys, pages[2 * layer + 1] values. A layer that
// keeps a budget of its own holds none of one run of a session's blocks (its
// hole: after the blocks of a shared prefix, which every layer holds): its
// entries there are empty (size_bytes 0, addr nullptr), and after the hole
// its pages go on to the last block (docs/compaction.md).
struct Block {
  uint32_t block_index = 0;
  std::vector<Page> pages;
};

struct SessionInfo {
  uint64_t session_id = 0;
  uint32_t num_layers = 0;  // as opened (SessionOptions::profile)
  uint32_t block_tokens = 0;
  uint32_t lease_ms = 0;
  PageFormat key_format = PageFormat::kF16;  // Granted formats.
  PageFormat value_format = PageFormat::kF16;
  uint32_t key_page_bytes = 0;
  uint32_t value_page_bytes = 0;
  // Whether the pages are in GPU memory, and on which device.
  bool pages_on_device = false;
  int cuda_device = -1;
  // What the agent's policy reads, as of the last Sync (the agent's QoS may
  // change mid-session): measure and report these streams (Report), per
  // layer where wants.per_layer, and no others.
  WantedStreams wants;
};

class Client;

// An open session. Thread-safety: calls may come from any one thread at a
// time; the heartbeat thread is internal. Destruction closes the session
// (best effort) and unmaps its arenas.
class Session {
 public:
  virtual ~Session() = default;
  virtual const SessionInfo& info() const = 0;
  // Pages for num_tokens more tokens; returns the new blocks only.
  virtual absl::StatusOr<std::vector<Block>> Reserve(uint64_t num_tokens) = 0;
  virtual absl::Status Commit(uint64_t committed_tokens) = 0;
  // Adopts new block tables if the epoch moved; then acknowledges them.
  // Returns true when the tables changed (blocks() is then new).
  virtual absl::StatusOr<bool> Sync() = 0;
  // The worker goes idle (its agent waits for a tool, a user, another
  // agent): it promises to write and read no page until its next Sync, which
  // must be its next call but for Close. The daemon may then move the session
  // (polykvctl move) without waiting for a step boundary; that Sync follows
  // it. Reserve, Commit, Release and ReportSlots before that Sync are
  // FAILED_PRECONDITION here, sending nothing.
  virtual absl::Status Idle() { return absl::OkStatus(); }
  virtual absl::Status Release(uint64_t keep_tokens) = 0;
  virtual absl::Status Close() = 0;

  // --- Shared prefixes (docs/prefix-sharing.md) ---
  // Offers the session's leading full blocks, which hold `token_ids` (the
  // session's first tokens, written and committed, not compacted), to later
  // sessions of the same tenant and model. Returns how many leading tokens
  // are in shared blocks now. Sharing never copies: the blocks stay where
  // they are, read-only from then on for everyone.
  virtual absl::StatusOr<uint64_t> SharePrefix(std::span<const int32_t> token_ids) {
    return absl::UnimplementedError("SharePrefix");
  }
  // On a fresh session (before the first Reserve): takes the longest run of
  // shared blocks holding the leading full blocks of `token_ids`. Returns
  // how many tokens that is: they are committed, blocks() holds them, and
  // the worker computes the context from there on. 0 when nothing matched.
  virtual absl::StatusOr<uint64_t> AttachPrefix(std::span<const int32_t> token_ids) {
    return absl::UnimplementedError("AttachPrefix");
  }
  // All blocks of the session in order, as last reserved or synced.
  virtual const std::vector<Block>& blocks() const = 0;
  virtual uint64_t reserved_tokens() const = 0;
  virtual uint64_t epoch() const = 0;
  // The raw capability token (for tests of token checks; keep it secret).
  virtual const std::string& token() const = 0;
  // Moves to another polykvd that Sync followed (polykvctl move): Sync parks
  // while the daemon copies the session, then attaches at the target, takes
  // its tables -- the same slots (positions, counts, bytes) at the same
  // epoch, in new pages -- and syncs there, and returns true. If epoch() is
  // still what it was before that Sync, blocks() holds the slots the worker
  // held; else that Sync published new tables (as any Sync may).
  // info().session_id and token() are the target's from then on.
  virtual uint64_t moves() const { return 0; }
  // After a Sync that returned true: its tables hold the same slots with the
  // same bytes, in other pages (the daemon restored the session after an
  // offload, or moved its pages out of an arena it empties): what the worker
  // holds of them stays valid.
  virtual bool same_slots() const { return false; }

  // --- Policy engine (daemon compaction) ---
  // After a Sync that returned true: how many slots of blocks() hold tokens
  // (a compaction shrinks it), and per slot the logical position (index of
  // the token in the conversation) and multiplicity (> 1 after a merge).
  // Before any changed Sync: committed_tokens() is the last Commit and the
  // vectors are empty. Default implementations keep old fakes compiling.
  virtual uint64_t committed_tokens() const { return 0; }
  virtual const std::vector<int64_t>& slot_positions() const {
    static const std::vector<int64_t> kEmpty;
    return kEmpty;
  }
  virtual const std::vector<uint32_t>& slot_counts() const {
    static const std::vector<uint32_t> kEmpty;
    return kEmpty;
  }
  // Where the session's layers hold their own slots (a select=layer policy
  // compacted them apart): every layer's positions, [num_layers x
  // committed_tokens()] layer-major, slot_positions() being layer 0's. Empty
  // while every layer holds slot_positions().
  virtual const std::vector<int64_t>& layer_slot_positions() const {
    static const std::vector<int64_t> kEmpty;
    return kEmpty;
  }
  // Reports metadata for slots [first_slot, first_slot + meta.size()) and
  // score streams' values (policies/score_stream.h says each stream's shape
  // and how the daemon folds it in; at most one entry per stream), in the
  // tables of epoch(). Slots must be committed. current_turn: the turn being
  // decoded (0 = keep). FAILED_PRECONDITION when the daemon's epoch moved
  // (Sync first); INVALID_ARGUMENT, changing nothing, for a value out of its
  // stream's range or a size that does not fit its shape.
  virtual absl::Status ReportSlots(uint64_t first_slot, const std::vector<SlotMeta>& meta,
                                   const std::vector<ScoreValues>& scores,
                                   uint32_t current_turn = 0) {
    return absl::UnimplementedError("ReportSlots");
  }
  // One stream's values for the slots from first_slot ([n]; [num_layers x n]
  // layer-major when per_layer; a per-layer stream's [num_layers]).
  absl::Status Report(ScoreStream stream, uint64_t first_slot, std::vector<float> values,
                      bool per_layer = false) {
    return ReportSlots(first_slot, {}, {ScoreValues{stream, per_layer, std::move(values)}});
  }
};

struct AdminStats;  // client/include/polykv/admin.h

class Client {
 public:
  // Connects to polykvd's Unix socket. Fails fast (UNAVAILABLE) when no daemon
  // answers within `timeout_ms`.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& socket_path,
                                                         int timeout_ms = 5000);
  virtual ~Client() = default;
  virtual absl::StatusOr<std::unique_ptr<Session>> OpenSession(const SessionOptions& options) = 0;
};

// Raw access for tests and tools: acts on a session by id and token without
// owning it (e.g. to check that a wrong token is refused).
struct SessionRef {
  uint64_t session_id = 0;
  std::string token;
};
absl::StatusOr<uint64_t> ReserveRaw(const std::string& socket_path, const SessionRef& ref,
                                    uint64_t num_tokens);
// Fetches an arena fd over the fd socket; the caller owns the fd. When
// `size_bytes` is given, the arena's size (the bytes to map) is stored there.
absl::StatusOr<int> FetchArenaFd(const std::string& fd_socket_path, const SessionRef& ref,
                                 uint32_t arena_id, uint64_t* size_bytes = nullptr);

}  // namespace polykv
