// A session on its way from one polykvd to another (Admin.MoveSession on the
// source, Peer.ImportSession on the target; docs/operations.md, "Moving a
// session"). The pool's side only: what a session is made of, apart from its
// pages' bytes, and where those bytes are. The rpc room streams them.
//
// Source: ParkForMove asks the worker to park at its next step boundary (its
// Sync), then hands out the session and its pages' addresses; nothing writes
// them while it is parked (the worker waits in Sync, the session is busy).
// FinishMove ends the session here and leaves the worker a forward to the
// target; AbortMove lets it go on as if nothing happened.
// Target: BeginImport makes the session, busy and known to no one, with
// pages for the bytes to come; CompleteImport hands it out (its worker
// attaches with the token within its lease), AbortImport removes it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "daemon/pool/types.h"
#include "policies/slot_record.h"

namespace polykv::daemon {

// One block: its formats and which layers it has pages of (empty: all).
struct MovedBlock {
  PageFormat key_format = PageFormat::kF16;
  PageFormat value_format = PageFormat::kF16;
  std::vector<bool> present;
};

struct MovedSession {
  std::string agent_id;  // as the worker named it (not its QoS identity)
  std::string tenant;    // as the worker named it
  PeerCreds peer;        // uid and gid; pid means nothing on another node
  ModelProfile profile;
  uint32_t block_tokens = 0;
  PageFormat key_format = PageFormat::kF16;  // of new blocks
  PageFormat value_format = PageFormat::kF16;
  Priority priority = Priority::kNormal;
  uint32_t lease_ms = 0;
  uint64_t committed_tokens = 0;
  std::vector<MovedBlock> blocks;
  // PolicyInputs' state that the policy reads on: the slot records (one
  // list, or one per layer), the per-layer streams, the counters.
  std::vector<std::vector<policies::SlotRecord>> records;
  std::vector<policies::LayerScores> layer_scores;
  bool log_count_bias = true;
  int64_t next_position = 0;
  int64_t attention_aged_at = 0;
  int32_t current_turn = 0;
  bool importance_reported = false;
  uint64_t reports = 0;
  uint64_t epoch = 0;  // of the tables the parked worker holds
};

// A parked session's pages, in MovedSession order: every present page of
// block 0 (K, V by layer), then block 1's... Valid until FinishMove or
// AbortMove.
struct MoveSource {
  MovedSession session;
  std::vector<std::span<const std::byte>> pages;
  uint64_t bytes = 0;
};

// An importing session's pages, to be written whole, in the same order.
struct ImportTarget {
  uint64_t session_id = 0;
  std::vector<std::span<std::byte>> pages;
  uint64_t bytes = 0;
};

}  // namespace polykv::daemon
